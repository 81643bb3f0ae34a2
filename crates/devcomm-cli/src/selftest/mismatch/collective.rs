//! Collective calls that differ across ranks: rank 0 makes one collective, the others another
//! (or the same one with other sizes). Every rank's call must fail within the device timeout
//! (plus 2 s): rank 0 and the ranks that receive from it with a `CallMismatch` naming the peer
//! and both values, a rank whose partner in the ring never calls it with a timeout naming the
//! peer. Guard bytes around every output stay untouched; then 1,000 all-to-alls of mixed sizes
//! are verified on a rebuilt communicator.
//!
//! In a job with network links (`DEVCOMM_TOPOLOGY_OVERRIDE`, docs/NETWORK.md) the same cases
//! run: network peers' chunks carry the call's agreement in their headers, the barrier is an
//! all-to-all there and the ring gather's sendrecv calls take the send/recv routes.

use std::time::{Duration, Instant};

use cudarc::driver::CudaSlice;
use devcomm::{AllToAllVCounts, Error};

use super::{run_cases, Fresh, GUARD};
use crate::selftest::harness::{compare, ring_gather, Ctx, POISON};

/// What a rank calls in one case: the operation and its bytes per peer.
#[derive(Clone, Copy, Debug)]
enum Call {
    /// A ring all-gather of `Comm::sendrecv` calls (`harness::ring_gather`): send/recv
    /// against a collective, and steps after a refused receive that must forward nothing.
    RingGather(usize),
    AllToAll(usize),
    AllToAllV(usize),
    Barrier,
}

/// (rank 0's call, everyone else's call).
const CASES: &[(Call, Call)] = &[
    (Call::RingGather(4096), Call::AllToAll(4096)),
    (Call::AllToAll(4096), Call::RingGather(4096)),
    (Call::AllToAll(65_536), Call::AllToAllV(65_536)),
    (Call::AllToAllV(65_536), Call::AllToAll(65_536)),
    (Call::AllToAll(4096), Call::AllToAll(8192)),
    (Call::Barrier, Call::AllToAll(4096)),
    (Call::AllToAllV(4096), Call::Barrier),
    (Call::AllToAll(1 << 20), Call::AllToAll(3 << 19)),
];

const AFTER: usize = 1_000;
/// Bytes per peer of the verified all-to-alls (8-byte elements).
const AFTER_SIZES: &[usize] = &[8, 64, 4096, 65_536, 262_144];

pub(super) fn collective_mismatch(cx: &Ctx, timeout: Duration) -> Result<String, String> {
    let net = cx.comm.tuning().has_network_links();
    let one = |f: &Fresh, _, _, call| one_case(cx, f, call, timeout);
    let after_what = format!("{AFTER} verified all-to-alls");
    let done = run_cases(cx, "collective", timeout, CASES, one, |f| after(cx, f), &after_what)?;
    Ok(if net {
        format!("with network links: {done}")
    } else {
        done
    })
}

/// One mismatched collective; the error this rank saw.
fn one_case(cx: &Ctx, f: &Fresh, call: Call, timeout: Duration) -> Result<String, String> {
    let (comm, stream) = (&f.comm, &f.stream);
    let (rank, world) = (comm.rank(), comm.world_size());
    let per_peer = match call {
        Call::RingGather(n) | Call::AllToAll(n) | Call::AllToAllV(n) => n,
        Call::Barrier => 8,
    };
    let elems = per_peer / 8;
    let send_elems = match call {
        Call::RingGather(_) => elems,
        _ => elems * world,
    };
    let send = stream
        .clone_htod(&vec![rank as u64 + 1; send_elems])
        .map_err(|e| e.to_string())?;
    let out_bytes = per_peer * world;
    let mut out = stream
        .clone_htod(&vec![POISON; out_bytes + 2 * GUARD])
        .map_err(|e| e.to_string())?;
    let mut counts = AllToAllVCounts::new(stream, world).map_err(|e| e.to_string())?;
    stream
        .memcpy_htod(&vec![elems as u64; world], &mut counts.send_counts)
        .map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    // Correct calls of both kinds first: every module is compiled and loaded on every rank, so
    // the timed call below measures the device's detection, not a compile.
    {
        let one = stream
            .clone_htod(&vec![1u64; world])
            .map_err(|e| e.to_string())?;
        let mut all = stream.alloc_zeros::<u64>(world).map_err(|e| e.to_string())?;
        comm.all_to_all(&one, &mut all, stream)
            .and_then(|()| ring_gather(comm, &one.slice(..1), &mut all.slice_mut(..), stream))
            .and_then(|()| comm.barrier(stream))
            .and_then(|()| comm.synchronize(stream))
            .map_err(|e| format!("the warm-up calls: {e}"))?;
    }
    let t = Instant::now();
    let launched = {
        let mut view = out.slice_mut(GUARD..GUARD + out_bytes);
        // SAFETY: the view covers whole u64 elements (out_bytes is a multiple of 8) and is
        // only written through this transmuted view until the call is synchronised.
        let mut view64 = unsafe { view.transmute_mut::<u64>(out_bytes / 8) }
            .ok_or("output view of u64")?;
        match call {
            Call::RingGather(_) => ring_gather(comm, &send, &mut view64, stream),
            Call::AllToAll(_) => comm.all_to_all(&send, &mut view64, stream),
            Call::AllToAllV(_) => comm.all_to_all_v(&send, &mut view64, &mut counts, 1, stream),
            Call::Barrier => comm.barrier(stream),
        }
    };
    let result = launched.and_then(|()| comm.synchronize(stream));
    let waited = t.elapsed();
    if waited > timeout + Duration::from_secs(2) {
        return Err(format!("took {waited:?} (device timeout {timeout:?})"));
    }
    let e = match result {
        Err(e @ Error::CallMismatch { .. }) => e.to_string(),
        Err(e @ (Error::PeerTimeout { .. } | Error::Aborted { .. })) if rank != 0 => {
            // A rank that never hears from rank 0 (its ring partner is elsewhere) times out.
            e.to_string()
        }
        Err(other) => return Err(format!("expected CallMismatch, got: {other}")),
        Ok(()) => return Err("the call succeeded".into()),
    };
    if !e.contains("peer ") {
        return Err(format!("the error names no peer: {e}"));
    }
    let got = stream.clone_dtoh(&out).map_err(|e| e.to_string())?;
    let guards = [&got[..GUARD], &got[GUARD + out_bytes..]].concat();
    if let Some(i) = guards.iter().position(|&b| b != POISON) {
        return Err(format!("guard byte {i} was written"));
    }
    cx.host_barrier()?;
    Ok(e)
}

/// AFTER verified all-to-alls of mixed sizes on `f`.
fn after(cx: &Ctx, f: &Fresh) -> Result<(), String> {
    let (comm, stream) = (&f.comm, &f.stream);
    let (rank, world) = (comm.rank(), comm.world_size());
    // Element i of the chunk from rank r to rank p: r << 48 | p << 40 | size index << 32 | i,
    // plus the call's parity, so stale data from the call before fails.
    let word = |r: usize, p: usize, k: usize, v: usize, i: usize| -> u64 {
        ((r as u64) << 48) | ((p as u64) << 40) | ((k as u64) << 36) | ((v as u64) << 32) | i as u64
    };
    let mut src: Vec<[CudaSlice<u64>; 2]> = Vec::new();
    for (k, &bytes) in AFTER_SIZES.iter().enumerate() {
        let n = bytes / 8;
        let make = |v: usize| -> Result<CudaSlice<u64>, String> {
            let host: Vec<u64> = (0..world)
                .flat_map(|p| (0..n).map(move |i| word(rank, p, k, v, i)))
                .collect();
            stream.clone_htod(&host).map_err(|e| e.to_string())
        };
        src.push([make(0)?, make(1)?]);
    }
    let most = AFTER_SIZES.iter().max().copied().unwrap_or(8) / 8 * world;
    let mut dst = stream.alloc_zeros::<u64>(most).map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    for call in 0..AFTER {
        let k = call % AFTER_SIZES.len();
        let v = (call / AFTER_SIZES.len()) % 2;
        let n = AFTER_SIZES[k] / 8;
        let mut view = dst.slice_mut(..n * world);
        comm.all_to_all(&src[k][v], &mut view, stream)
            .and_then(|()| comm.synchronize(stream))
            .map_err(|e| format!("call {call} ({} B per peer): {e}", n * 8))?;
        let got = stream
            .clone_dtoh(&dst.slice(..n * world))
            .map_err(|e| e.to_string())?;
        let expect: Vec<u64> = (0..world)
            .flat_map(|p| (0..n).map(move |i| word(p, rank, k, v, i)))
            .collect();
        let as_bytes = |x: &[u64]| -> Vec<u8> { x.iter().flat_map(|w| w.to_le_bytes()).collect() };
        compare(&as_bytes(&got), &as_bytes(&expect), &format!("all-to-all {call}"))?;
    }
    cx.host_barrier()
}
