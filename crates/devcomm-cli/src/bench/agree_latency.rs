//! `devcomm bench --op agree_latency`: host-launched small send/recv, the cost the call
//! agreement may add (docs/PROTOCOL.md, "Agreement": budget 0.2 us at 8 B). Ranks 0 and 1
//! exchange `--min-bytes` (at least 1; 8 by default here) both ways, each call launched and
//! synchronised on its own, `--iters` x 100 calls after `--warmup` x 100; the median and the
//! 10th percentile per call are reported. Runs on one shared GPU too (scripts/shared-gpu.sh
//! 2), where only a comparison of two runs on the same machine means anything: run it once as
//! is and once with `DEVCOMM_P2P_OPTIONS="-DDC_AGREE=0"` (the agreement compiled out).

use std::time::Instant;

use super::{BenchArgs, Record};
use crate::selftest::Ctx;

pub(crate) fn run(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let comm = &cx.comm;
    let rank = comm.rank();
    let bytes = args.min_bytes.max(8);
    let src = cx
        .stream
        .clone_htod(&vec![rank as u8; bytes])
        .map_err(|e| e.to_string())?;
    let mut dst = cx
        .stream
        .alloc_zeros::<u8>(bytes)
        .map_err(|e| e.to_string())?;
    let (warmup, iters) = (args.warmup * 100, args.iters.max(1) * 100);
    let mut samples = Vec::with_capacity(iters);
    cx.host_barrier()?;
    if rank < 2 {
        let peer = 1 - rank;
        for i in 0..warmup + iters {
            let t = Instant::now();
            comm.sendrecv(&src, peer, &mut dst, peer, &cx.stream)
                .and_then(|()| comm.synchronize(&cx.stream))
                .map_err(|e| format!("call {i}: {e}"))?;
            if i >= warmup {
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    cx.host_barrier()?;
    if rank != 0 {
        return Ok(Vec::new());
    }
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    let p10 = samples[samples.len() / 10];
    let options = comm.config().p2p_options.join(" ");
    let agreement = if options.contains("DC_AGREE=0") {
        "agreement compiled out"
    } else {
        "agreement on"
    };
    Ok(vec![Record {
        both_directions: true,
        devcomm_us: median,
        nccl_us: p10,
        sms: 1,
        reference: format!(
            "ref_us = 10th percentile; host-launched sendrecv + synchronise per call ({agreement})"
        ),
        config: options,
        ..Record::new(cx, args, "agree_latency", bytes as u64)
    }])
}
