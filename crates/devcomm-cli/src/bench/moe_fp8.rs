//! `devcomm bench --op moe`'s FP8 points: the same shape and routings as the bf16 points, the
//! rows quantised to e4m3 with per-128 scales where they are packed and returned as FP8 +
//! scales (DeepEP's FP8 dispatch), against the NCCL path moving each (token, expert) pair's
//! e4m3 row and scales there and its bf16 output back (a PyTorch user who quantised first; the
//! quantisation kernel is not part of the reference). Records `moe_fp8` (dispatch + combine, the combine in bf16) and
//! `moe_fp8_dispatch`.

use devcomm::moe::reference;
use devcomm::moe::{Fp8Output, Fp8Scales, Wire};
use devcomm::MoeConfig;
use half::bf16;

use super::{alloc, bytes_out, routing, NcclPairs, HIDDEN};
use crate::bench::args::BenchArgs;
use crate::bench::nccl::NcclPair;
use crate::bench::record::Record;
use crate::bench::timing::time_from_barrier_each;
use crate::selftest::Ctx;

/// The bf16 layer's configuration with FP8 on the wire.
pub(super) fn config(bf16: MoeConfig) -> MoeConfig {
    MoeConfig {
        wire: Wire::Fp8 {
            scales: Fp8Scales::Per128,
            output: Fp8Output::Fp8,
        },
        ..bf16
    }
}

pub(super) fn point(
    cx: &Ctx,
    args: &BenchArgs,
    moe: &devcomm::Moe,
    nccl: &NcclPair,
    tokens: usize,
) -> Result<Vec<Record>, String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let s = &cx.stream;
    let plan = *moe.plan();
    let routings: Vec<_> = (0..world).map(|r| routing(cx, r, tokens)).collect();
    let mine = &routings[rank];
    let received = reference::received(&plan, &routings, rank);
    let out_rows = *received.bases.last().unwrap_or(&0);
    let e = |e: cudarc::driver::DriverError| e.to_string();
    // Every element 0.5: each block's amax, so every code is 448 (0x7e).
    let x = s
        .clone_htod(&vec![bf16::from_f32(0.5); tokens * HIDDEN])
        .map_err(e)?;
    let idx = s.clone_htod(&mine.idx).map_err(e)?;
    let w = s.clone_htod(&mine.weights).map_err(e)?;
    let mut out_q = alloc::<u8>(cx, out_rows * HIDDEN)?;
    let mut out_s = alloc::<f32>(cx, out_rows * plan.scales)?;
    let mut out_w = alloc::<f32>(cx, out_rows)?;
    let mut counts = alloc::<i64>(cx, plan.local_experts)?;
    // The experts' outputs (bf16, what the combine sends back) and the combined rows.
    let y = alloc::<bf16>(cx, out_rows * HIDDEN)?;
    let mut out = alloc::<bf16>(cx, tokens * HIDDEN)?;
    // e4m3 rows and scales there, the experts' bf16 outputs back (as devcomm's combine).
    let mut pairs = NcclPairs::new(cx, &plan, &routings, (HIDDEN + 4 * plan.scales, 2 * HIDDEN))?;
    cx.sync()?;
    let dispatch = |out_q: &mut _, out_s: &mut _, out_w: &mut _, counts: &mut _| {
        moe.dispatch_fp8(&cx.comm, &x, &idx, &w, (out_q, out_s), out_w, counts, s)
            .map_err(|e| e.to_string())
    };
    // One checked dispatch first: the counts per expert and the first row's codes.
    cx.host_barrier()?;
    dispatch(&mut out_q, &mut out_s, &mut out_w, &mut counts)?;
    moe.check(s).map_err(|e| e.to_string())?;
    let got = s.clone_dtoh(&counts).map_err(e)?;
    let want: Vec<i64> = received.groups.iter().map(|g| g.len() as i64).collect();
    if got != want {
        return Err(format!(
            "moe fp8 {tokens} tokens: rank {rank}: expert counts {got:?}, expected {want:?}"
        ));
    }
    if want[0] > 0 {
        let q = s.clone_dtoh(&out_q).map_err(e)?;
        if q[..HIDDEN].iter().any(|&c| c != 0x7e) {
            return Err(format!(
                "moe fp8 {tokens} tokens: rank {rank}: rows of 0.5 not all e4m3 448"
            ));
        }
    }
    cx.host_barrier()?;
    let names = [
        "moe_fp8",
        "moe_fp8-nccl",
        "dispatch_fp8",
        "dispatch_fp8-nccl",
    ];
    let us = time_from_barrier_each(cx, args.warmup, args.iters, &names, &mut |i| match i {
        0 | 2 => {
            dispatch(&mut out_q, &mut out_s, &mut out_w, &mut counts)?;
            if i == 0 {
                moe.combine(&cx.comm, &y, &mut out, s)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        1 => pairs.run(cx, nccl, true),
        _ => pairs.run(cx, nccl, false),
    })?;
    moe.check(s).map_err(|e| e.to_string())?;
    let bytes = bytes_out(&plan, mine, rank);
    let there = "NCCL: count exchange, counts to host, an e4m3 row + 56 scales per (token, expert) pair there";
    let rec = |op: &str, d: f64, n: f64, back: &str| Record {
        reference: format!("{there}{back} (events from a device barrier)"),
        tokens: Some(tokens as u64),
        dtype: Some("e4m3 (bf16 in, per-128 scales; combine bf16)".into()),
        ..Record::new(cx, args, op, bytes).timed(d, n, bytes as f64)
    };
    Ok(match rank {
        0 => vec![
            rec("moe_fp8", us[0], us[1], ", a bf16 row back"),
            rec("moe_fp8_dispatch", us[2], us[3], ""),
        ],
        _ => Vec::new(),
    })
}
