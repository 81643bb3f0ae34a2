//! `devcomm bench --op moe`: MoE dispatch and combine (DeepSeek-V3's shape: hidden 7168 bf16,
//! top-8 of 256 experts, uniform routing) against the NCCL path a PyTorch user writes: the
//! per-rank counts exchanged with NCCL, copied to the host and waited for, then one row per
//! (token, expert) pair to the experts' ranks and back with NCCL's grouped send/recv. The user's
//! own permutation, regroup and weighted-sum kernels are not part of the reference (they would
//! only add to its time). Both sides are timed one call a sample between CUDA events, from a
//! device barrier on every rank (`time_from_barrier_each`): the events count the time the
//! NCCL path's host waits on the GPU inside, and the barrier leaves out the skew with which
//! ranks leave a host barrier. Two records per batch
//! size: `moe` (dispatch + combine) and `moe_dispatch` (dispatch alone against the count
//! exchange + rows out); `bytes` is the dispatch's bytes leaving this GPU for other ranks, and
//! the bandwidths are those bytes over each side's time. FP8 dispatch (e4m3 with per-128
//! scales on the wire, returned as FP8 + scales, DeepEP's form) has its own records,
//! `moe_fp8` and `moe_fp8_dispatch` (`moe_fp8.rs`), against the same NCCL path moving each
//! pair's e4m3 row and scales there and a bf16 row back.

use cudarc::driver::CudaSlice;
use devcomm::moe::reference::{self, Routing};
use devcomm::moe::Wire;
use devcomm::{DataType, MoeConfig, MoePlan};
use half::bf16;
use rand::{Rng, SeedableRng};

use super::alltoall::packed;
use super::args::BenchArgs;
use super::nccl::NcclPair;
use super::record::Record;
use super::timing::time_from_barrier_each;
use crate::selftest::Ctx;

#[path = "moe_fp8.rs"]
mod fp8;

const HIDDEN: usize = 7168;
const EXPERTS: usize = 256;
const TOP_K: usize = 8;
const ALIGN: usize = 128;
/// Tokens per rank.
const TOKENS: &[usize] = &[128, 512, 2048, 8192];
/// The blocks (so SMs) of the `moe_sm_budget` record's layer: a sixth of an H100's or H200's.
const SM_BUDGET: usize = 24;

/// Every batch size in turn (one layer sized for the largest).
pub(crate) fn run(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let world = cx.comm.world_size();
    let max_tokens = *TOKENS.iter().max().unwrap_or(&1);
    let config = MoeConfig {
        experts: EXPERTS,
        top_k: TOP_K,
        hidden: HIDDEN,
        dtype: DataType::BF16,
        max_tokens,
        align: ALIGN,
        wire: Wire::Native,
    };
    let moe = cx.comm.moe(config).map_err(|e| e.to_string())?;
    // The same layer held to an SM budget (decode's low-latency mode).
    let mut held = cx.comm.moe(config).map_err(|e| e.to_string())?;
    held.set_sm_budget(Some(SM_BUDGET))
        .map_err(|e| e.to_string())?;
    let nccl = NcclPair::new(cx)?;
    let plan = MoePlan::new(config, world).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for &tokens in TOKENS {
        out.extend(point(cx, args, (&moe, &held), &nccl, &plan, tokens)?);
    }
    // FP8 dispatch: a layer of its own (its rows are e4m3 + scales), the same routings.
    let fp8_moe = cx
        .comm
        .moe(fp8::config(config))
        .map_err(|e| e.to_string())?;
    for &tokens in TOKENS {
        out.extend(fp8::point(cx, args, &fp8_moe, &nccl, tokens)?);
    }
    Ok(out)
}

/// Rank `rank`'s uniform top-k routing of `tokens` tokens (every rank can draw every rank's).
fn routing(cx: &Ctx, rank: usize, tokens: usize) -> Routing {
    let mut rng =
        rand::rngs::StdRng::seed_from_u64(cx.seed ^ 0x30e ^ ((rank as u64) << 32) ^ tokens as u64);
    let mut idx = Vec::with_capacity(tokens * TOP_K);
    for _ in 0..tokens {
        let mut chosen: Vec<i64> = Vec::with_capacity(TOP_K);
        while chosen.len() < TOP_K {
            let e = rng.gen_range(0..EXPERTS) as i64;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        idx.extend(chosen);
    }
    let weights = (0..tokens * TOP_K)
        .map(|_| rng.gen_range(0.0f32..1.0))
        .collect();
    Routing { idx, weights }
}

fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    cx: &Ctx,
    n: usize,
) -> Result<CudaSlice<T>, String> {
    cx.stream
        .alloc_zeros::<T>(n.max(1))
        .map_err(|e| e.to_string())
}

fn point(
    cx: &Ctx,
    args: &BenchArgs,
    (moe, held): (&devcomm::Moe, &devcomm::Moe),
    nccl: &NcclPair,
    plan: &MoePlan,
    tokens: usize,
) -> Result<Vec<Record>, String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let s = &cx.stream;
    let routings: Vec<Routing> = (0..world).map(|r| routing(cx, r, tokens)).collect();
    let mine = &routings[rank];
    let received = reference::received(plan, &routings, rank);
    let out_rows = *received.bases.last().unwrap_or(&0);
    let row = HIDDEN * 2;
    // devcomm's buffers.
    let x = s
        .clone_htod(&vec![bf16::from_f32(0.5); tokens * HIDDEN])
        .map_err(|e| e.to_string())?;
    let idx = s.clone_htod(&mine.idx).map_err(|e| e.to_string())?;
    let w = s.clone_htod(&mine.weights).map_err(|e| e.to_string())?;
    let mut out_x = alloc::<bf16>(cx, out_rows * HIDDEN)?;
    let mut out_w = alloc::<f32>(cx, out_rows)?;
    let mut counts = alloc::<i64>(cx, plan.local_experts)?;
    let mut out = alloc::<bf16>(cx, tokens * HIDDEN)?;
    let mut pairs = NcclPairs::new(cx, plan, &routings, (row, row))?;
    cx.sync()?;
    // One checked dispatch first: the counts per expert against the reference.
    cx.host_barrier()?;
    moe.dispatch(
        &cx.comm,
        &x,
        &idx,
        &w,
        &mut out_x,
        &mut out_w,
        &mut counts,
        s,
    )
    .map_err(|e| e.to_string())?;
    moe.check(s).map_err(|e| e.to_string())?;
    let got = s.clone_dtoh(&counts).map_err(|e| e.to_string())?;
    let want: Vec<i64> = received.groups.iter().map(|g| g.len() as i64).collect();
    if got != want {
        return Err(format!(
            "moe {tokens} tokens: rank {rank}: expert counts {got:?}, expected {want:?}"
        ));
    }
    cx.host_barrier()?;
    // The same dispatch + combine captured once in a CUDA graph and replayed (decode's way:
    // no launch cost on the host per kernel).
    let dispatch_on = |layer: &devcomm::Moe,
                       out_x: &mut CudaSlice<bf16>,
                       out_w: &mut CudaSlice<f32>,
                       counts: &mut CudaSlice<i64>|
     -> Result<(), String> {
        layer
            .dispatch(&cx.comm, &x, &idx, &w, out_x, out_w, counts, s)
            .map_err(|e| e.to_string())
    };
    let dispatch =
        |out_x: &mut CudaSlice<bf16>, out_w: &mut CudaSlice<f32>, counts: &mut CudaSlice<i64>| {
            dispatch_on(moe, out_x, out_w, counts)
        };
    let graph = cx.capture(|| -> Result<(), String> {
        dispatch(&mut out_x, &mut out_w, &mut counts)?;
        moe.combine(&cx.comm, &out_x, &mut out, s)
            .map_err(|e| e.to_string())
    })?;
    let names = [
        "moe",
        "moe-nccl",
        "dispatch",
        "dispatch-nccl",
        "combine",
        "moe-graph",
        "moe-sm-budget",
    ];
    let us = time_from_barrier_each(cx, args.warmup, args.iters, &names, &mut |i| match i {
        0 | 2 => {
            dispatch(&mut out_x, &mut out_w, &mut counts)?;
            if i == 0 {
                // Identity experts: the dispatched rows go back as they came.
                moe.combine(&cx.comm, &out_x, &mut out, s)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        1 => pairs.run(cx, nccl, true),
        3 => pairs.run(cx, nccl, false),
        // The last dispatch's combine again (its state stays until the next dispatch).
        4 => moe
            .combine(&cx.comm, &out_x, &mut out, s)
            .map_err(|e| e.to_string()),
        5 => graph.launch().map_err(|e| e.to_string()),
        _ => {
            dispatch_on(held, &mut out_x, &mut out_w, &mut counts)?;
            held.combine(&cx.comm, &out_x, &mut out, s)
                .map_err(|e| e.to_string())
        }
    })?;
    moe.check(s).map_err(|e| e.to_string())?;
    held.check(s).map_err(|e| e.to_string())?;
    let bytes = bytes_out(plan, mine, rank);
    let there = "NCCL: count exchange, counts to host, a row per (token, expert) pair there";
    let rec = |op: &str, d: f64, n: f64| {
        Record {
        reference: match op {
            "moe_dispatch" => format!("{there} (events from a device barrier)"),
            "moe_combine" => format!("{there} and back (events from a device barrier); devcomm: its combine alone"),
            "moe_graph" => format!(
                "{there} and back (events from a device barrier); devcomm: dispatch + combine replayed from a graph"
            ),
            "moe_sm_budget" => format!(
                "{there} and back (events from a device barrier); devcomm: dispatch + combine, every launch held to {SM_BUDGET} blocks"
            ),
            _ => format!("{there} and back (events from a device barrier)"),
        },
        tokens: Some(tokens as u64),
        dtype: Some("bf16".into()),
        ..Record::new(cx, args, op, bytes).timed(d, n, bytes as f64)
    }
    };
    Ok(match rank {
        0 => vec![
            rec("moe", us[0], us[1]),
            rec("moe_dispatch", us[2], us[3]),
            rec("moe_combine", us[4], us[1]),
            rec("moe_graph", us[5], us[1]),
            rec("moe_sm_budget", us[6], us[1]),
        ],
        _ => Vec::new(),
    })
}

/// Bytes of rank `rank`'s dispatch leaving its GPU: a token's packed row once per other rank
/// it goes to.
fn bytes_out(plan: &MoePlan, mine: &Routing, rank: usize) -> u64 {
    let rows: usize = (0..mine.tokens(plan.config.top_k))
        .map(|t| {
            reference::destinations(plan, mine, t)
                .iter()
                .filter(|&&r| r != rank)
                .count()
        })
        .sum();
    (rows * plan.row_bytes) as u64
}

/// The NCCL path a PyTorch user writes: the per-rank pair counts exchanged, copied to the
/// host and waited for, then one row of `row` bytes per (token, expert) pair to the expert's
/// rank with grouped send/recv (and, for dispatch + combine, one of `back_row` bytes back: the
/// experts' outputs, which an FP8 dispatch returns in bf16).
struct NcclPairs {
    send_pairs: Vec<u64>,
    row: usize,
    back_row: usize,
    send: CudaSlice<u8>,
    recv: CudaSlice<u8>,
    /// The experts' outputs (a `back_row` per received pair) and where they come back.
    ret: CudaSlice<u8>,
    back: CudaSlice<u8>,
    counts: CudaSlice<u64>,
    recv_counts: CudaSlice<u64>,
}

impl NcclPairs {
    fn new(
        cx: &Ctx,
        plan: &MoePlan,
        routings: &[Routing],
        (row, back_row): (usize, usize),
    ) -> Result<Self, String> {
        let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
        let pairs_to = |r: &Routing, dest: usize| -> u64 {
            r.idx
                .iter()
                .filter(|&&e| e >= 0 && e as usize / plan.local_experts == dest)
                .count() as u64
        };
        let send_pairs: Vec<u64> = (0..world).map(|d| pairs_to(&routings[rank], d)).collect();
        let recv_pairs: u64 = (0..world).map(|src| pairs_to(&routings[src], rank)).sum();
        let sent = send_pairs.iter().sum::<u64>() as usize;
        Ok(Self {
            row,
            back_row,
            send: alloc::<u8>(cx, sent * row)?,
            recv: alloc::<u8>(cx, recv_pairs as usize * row)?,
            ret: alloc::<u8>(cx, recv_pairs as usize * back_row)?,
            back: alloc::<u8>(cx, sent * back_row)?,
            counts: cx
                .stream
                .clone_htod(&send_pairs)
                .map_err(|e| e.to_string())?,
            recv_counts: alloc::<u64>(cx, world)?,
            send_pairs,
        })
    }

    /// One dispatch (and, with `back`, the rows back), timed by the caller on the host.
    fn run(&mut self, cx: &Ctx, nccl: &NcclPair, back: bool) -> Result<(), String> {
        let world = cx.comm.world_size();
        let s = &cx.stream;
        let one = packed(&vec![1; world], 1);
        nccl.all_to_all(
            &self.counts.as_view(),
            &mut self.recv_counts.as_view_mut(),
            &one,
            &one,
        )?;
        let mut host = vec![0u64; world];
        s.memcpy_dtoh(&self.recv_counts, &mut host)
            .map_err(|e| e.to_string())?;
        s.synchronize().map_err(|e| e.to_string())?;
        let (sends, recvs) = (packed(&self.send_pairs, self.row), packed(&host, self.row));
        nccl.all_to_all(
            &self.send.as_view(),
            &mut self.recv.as_view_mut(),
            &sends,
            &recvs,
        )?;
        if back {
            let (sends, recvs) = (
                packed(&self.send_pairs, self.back_row),
                packed(&host, self.back_row),
            );
            nccl.all_to_all(
                &self.ret.as_view(),
                &mut self.back.as_view_mut(),
                &recvs,
                &sends,
            )?;
        }
        Ok(())
    }
}
