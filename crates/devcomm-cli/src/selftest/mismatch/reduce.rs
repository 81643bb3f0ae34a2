//! Reductions that differ across ranks: rank 0 makes one reduction, the others another (another
//! collective of the same bytes, another element type or operator, other sizes on the
//! one-shot, on the two-shot and across them), or a barrier. Every rank's call must fail within
//! the device timeout (plus 2 s) with an error naming the peer: `CallMismatch` with both values
//! where both sides reduce, a timeout against a barrier (with network links, where a barrier is
//! a collective too, `CallMismatch`; ranks other than 0 may see a timeout naming the peer). The output and the guard bytes around
//! it stay untouched (nothing is written before the call agreement); then 1,000 reductions of
//! mixed sizes and collectives are verified on a rebuilt communicator.

use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DevicePtr};
use devcomm::reduce::Collective;
use devcomm::{DataType, Error, ReduceOp};

use super::{run_cases, Fresh, GUARD};
use crate::selftest::harness::{Ctx, POISON};

/// What a rank calls in one case.
#[derive(Clone, Copy, Debug)]
enum Call {
    /// A reduction over a whole buffer of `world x shard_bytes` bytes (all-reduce: input and
    /// output; reduce-scatter: input; all-gather: output).
    Reduce(Collective, DataType, ReduceOp, usize),
    Barrier,
}

use Call::{Barrier, Reduce};
use Collective::{AllGather, AllReduce, ReduceScatter};
use DataType::{BF16, F32};
use ReduceOp::{Max, Sum};

/// Bytes per shard: one-shot, and two-shot on 2 and 4 ranks (the one-shot ends at 512 KiB on
/// 2 ranks by default).
const SMALL: usize = 16 << 10;
const LARGE: usize = 4 << 20;

/// (rank 0's call, everyone else's call).
const CASES: &[(Call, Call)] = &[
    (Reduce(AllReduce, F32, Sum, SMALL), Reduce(AllGather, F32, Sum, SMALL)),
    (Reduce(AllReduce, F32, Sum, SMALL), Reduce(AllReduce, BF16, Sum, SMALL)),
    (Reduce(AllReduce, F32, Sum, SMALL), Reduce(AllReduce, F32, Max, SMALL)),
    (Reduce(AllReduce, F32, Sum, SMALL), Reduce(AllReduce, F32, Sum, SMALL + 64)),
    (Reduce(ReduceScatter, F32, Sum, LARGE), Reduce(AllGather, F32, Sum, LARGE)),
    (Reduce(AllReduce, F32, Sum, LARGE), Reduce(AllReduce, F32, Sum, LARGE + 4096)),
    (Reduce(AllReduce, F32, Sum, SMALL), Reduce(AllReduce, F32, Sum, LARGE)),
    (Reduce(AllReduce, F32, Sum, SMALL), Barrier),
    (Barrier, Reduce(AllGather, F32, Sum, SMALL)),
];

const AFTER: usize = 1_000;
/// Elements per shard of the verified reductions (all-reduce: world x this many).
const AFTER_SHARDS: &[usize] = &[2, 1_025, 16_384, 150_001, 524_288];

pub(super) fn reduce_mismatch(cx: &Ctx, timeout: Duration) -> Result<String, String> {
    let one = |f: &Fresh, first, rest, call| {
        let both_reduce = matches!((first, rest), (Reduce(..), Reduce(..)));
        one_case(cx, f, call, both_reduce, timeout)
    };
    let after_what = format!("{AFTER} verified reductions");
    run_cases(cx, "reduce", timeout, CASES, one, |f| after(cx, f), &after_what)
}

/// One mismatched call; the error this rank saw.
fn one_case(
    cx: &Ctx,
    f: &Fresh,
    call: Call,
    both_reduce: bool,
    timeout: Duration,
) -> Result<String, String> {
    let (comm, stream) = (&f.comm, &f.stream);
    let world = comm.world_size();
    let err = |e: cudarc::driver::DriverError| e.to_string();
    // Every module of the cases loaded on every rank first (a kernel gate would otherwise wait
    // for peers that load another type's module), so the call below measures the agreement.
    for dtype in [F32, BF16] {
        let n = world * 64;
        let x = stream.alloc_zeros::<u8>(n * 4).map_err(err)?;
        let p = x.device_ptr(stream).0;
        // SAFETY: `x` holds n f32 (2n bf16) on this stream, alive until the synchronise.
        unsafe { comm.all_reduce_raw(p, p, n, dtype, Sum, stream) }
            .and_then(|()| comm.barrier(stream))
            .and_then(|()| comm.synchronize(stream))
            .map_err(|e| format!("the warm-up calls: {e}"))?;
    }
    let (input_bytes, out_bytes) = match call {
        Reduce(AllReduce, _, _, s) => (world * s, world * s),
        Reduce(ReduceScatter, _, _, s) => (world * s, s),
        Reduce(AllGather, _, _, s) => (s, world * s),
        Barrier => (0, 0),
    };
    let input = stream
        .clone_htod(&vec![1u8; input_bytes.max(1)])
        .map_err(err)?;
    let out = stream
        .clone_htod(&vec![POISON; out_bytes + 2 * GUARD])
        .map_err(err)?;
    stream.synchronize().map_err(err)?;
    cx.host_barrier()?;
    let t = Instant::now();
    let (pi, po) = (input.device_ptr(stream).0, out.device_ptr(stream).0 + GUARD as u64);
    let launched = match call {
        Reduce(c, dtype, op, _) => {
            let es = dtype.size_bytes();
            // SAFETY: `input` holds input_bytes and `out` out_bytes after its guard, both
            // alive and used on this stream only until the synchronise below; counts are in
            // elements of dtype.
            unsafe {
                match c {
                    AllReduce => comm.all_reduce_raw(pi, po, input_bytes / es, dtype, op, stream),
                    ReduceScatter => {
                        comm.reduce_scatter_raw(pi, po, out_bytes / es, dtype, op, stream)
                    }
                    AllGather => comm.all_gather_raw(pi, po, input_bytes / es, dtype, stream),
                }
            }
        }
        Barrier => comm.barrier(stream),
    };
    let result = launched.and_then(|()| comm.synchronize(stream));
    let waited = t.elapsed();
    if waited > timeout + Duration::from_secs(2) {
        return Err(format!("took {waited:?} (device timeout {timeout:?})"));
    }
    // With network links a reduction's steps are collectives: the error names the step's
    // operation or size as a collective's (docs/NETWORK.md), not the reduction's field, and a
    // rank whose network peer refused its call before sending it anything learns it as a
    // timeout naming that peer (as the collectives' mismatch check allows too).
    let network = comm.tuning().has_network_links();
    let e = match result {
        Err(e @ Error::CallMismatch { .. }) => e.to_string(),
        // Against a barrier neither side can tell what the other called: both time out.
        Err(e @ (Error::PeerTimeout { .. } | Error::Aborted { .. }))
            if !both_reduce || (network && comm.rank() != 0) =>
        {
            e.to_string()
        }
        Err(other) => return Err(format!("expected CallMismatch, got: {other}")),
        Ok(()) => return Err("the call succeeded".into()),
    };
    if !e.contains("peer ") {
        return Err(format!("the error names no peer: {e}"));
    }
    if both_reduce && !network && !e.contains("reduction") {
        return Err(format!("the mismatch does not name the reduction's field: {e}"));
    }
    // Nothing written: the output and its guards still hold the poison.
    let got = stream.clone_dtoh(&out).map_err(err)?;
    if let Some(i) = got.iter().position(|&b| b != POISON) {
        let at = if i < GUARD || i >= GUARD + out_bytes { "guard" } else { "output" };
        return Err(format!("{at} byte {i} was written"));
    }
    cx.host_barrier()?;
    Ok(e)
}

/// Input element i of rank r in variant v: small integers, exact in f32 once summed.
fn value(r: usize, i: usize, v: usize) -> f32 {
    ((r + 1) * (i % 7 + 1) * (v + 1)) as f32
}

/// AFTER verified reductions on `f`: all-reduce, reduce-scatter and all-gather in turn, of the
/// sizes of AFTER_SHARDS, alternating two input variants so that data left by the call
/// before fails.
fn after(cx: &Ctx, f: &Fresh) -> Result<(), String> {
    let (comm, stream) = (&f.comm, &f.stream);
    let (rank, world) = (comm.rank(), comm.world_size());
    let err = |e: cudarc::driver::DriverError| e.to_string();
    let mut src: Vec<[CudaSlice<f32>; 2]> = Vec::new();
    for &n in AFTER_SHARDS {
        let make = |v: usize| -> Result<CudaSlice<f32>, String> {
            let host: Vec<f32> = (0..world * n).map(|i| value(rank, i, v)).collect();
            stream.clone_htod(&host).map_err(err)
        };
        src.push([make(0)?, make(1)?]);
    }
    let most = AFTER_SHARDS.iter().max().copied().unwrap_or(1) * world;
    let mut dst = stream.alloc_zeros::<f32>(most).map_err(err)?;
    let sum = (world * (world + 1) / 2) as f32;
    cx.host_barrier()?;
    for call in 0..AFTER {
        let k = call % AFTER_SHARDS.len();
        let v = (call / AFTER_SHARDS.len()) % 2;
        let c = [AllReduce, ReduceScatter, AllGather][(call / 2) % 3];
        let n = AFTER_SHARDS[k];
        let x = &src[k][v];
        let (out_len, expect): (usize, Box<dyn Fn(usize) -> f32>) = match c {
            AllReduce => (world * n, Box::new(|i| (i % 7 + 1) as f32 * (v + 1) as f32 * sum)),
            ReduceScatter => (
                n,
                Box::new(|i| ((rank * n + i) % 7 + 1) as f32 * (v + 1) as f32 * sum),
            ),
            AllGather => (world * n, Box::new(|i| value(i / n, i % n, v))),
        };
        let mut view = dst.slice_mut(..out_len);
        let r = match c {
            AllReduce => comm.all_reduce(x, &mut view, Sum, stream),
            ReduceScatter => comm.reduce_scatter(x, &mut view, Sum, stream),
            AllGather => comm.all_gather(&x.slice(..n), &mut view, stream),
        };
        r.and_then(|()| comm.synchronize(stream))
            .map_err(|e| format!("call {call} ({c:?} of {n} per shard): {e}"))?;
        let got = stream.clone_dtoh(&dst.slice(..out_len)).map_err(err)?;
        if let Some(i) = (0..out_len).find(|&i| got[i] != expect(i)) {
            return Err(format!(
                "call {call} ({c:?} of {n} per shard): element {i} is {}, expected {}",
                got[i],
                expect(i)
            ));
        }
    }
    cx.host_barrier()
}
