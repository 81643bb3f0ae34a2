//! The `mismatch` group: send/recv calls whose two sides differ. On every route, with the
//! sender larger and smaller than the receiver, one way and both ways, the receiver's call
//! must fail with an error naming the peer and both sizes, within the device timeout, with the
//! guard bytes around its destination untouched (and the destination itself on every route
//! whose bytes move by SMs); then 1,000 correct calls of mixed sizes, verified, on a rebuilt
//! communicator (a mismatch aborts the communicator: the ranks' call counters differ).
//!
//! Each case builds its own communicator on a fresh store port (rank 0 picks one and hands it
//! to the others through the check's store), with the device timeout of `--timeout-ms`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream};
use devcomm::p2p::Protocol;
use devcomm::Error;

use super::harness::{compare, partner, verified, Check, Ctx, Ranks, POISON};
pub(super) use super::harness::{fresh_comm, Fresh};

mod attribution;
mod collective;
mod reduce;

/// The group's checks.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "sendrecv_mismatch",
        ranks: Ranks::AtLeast(2),
        about: "send/recv of different sizes on every route, one way and both ways: an error \
                naming the peer and both sizes, guards untouched, then 1,000 verified calls on \
                a rebuilt communicator",
        run: |cx, p| verified(sendrecv_mismatch(cx, p.timeout)),
    },
    Check {
        name: "collective_mismatch",
        ranks: Ranks::AtLeast(2),
        about: "rank 0 in another collective (all-gather against all-to-all, all-to-all against \
                all-to-all-v, other sizes, barrier against either): errors within the timeout \
                naming the peer and both values, guards untouched, then 1,000 verified \
                all-to-alls on a rebuilt communicator",
        run: |cx, p| verified(collective::collective_mismatch(cx, p.timeout)),
    },
    Check {
        name: "reduce_mismatch",
        ranks: Ranks::AtLeast(2),
        about: "rank 0 in another reduction (another collective, element type or operator, \
                other sizes on the one-shot, the two-shot and across them) or a barrier: \
                errors within the timeout naming the peer and both values, the output and \
                guards untouched, then 1,000 verified reductions on a rebuilt communicator",
        run: |cx, p| verified(reduce::reduce_mismatch(cx, p.timeout)),
    },
    Check {
        name: "soft_error_owner",
        ranks: Ranks::AtLeast(2),
        about: "an uncollected all-to-all-v count error does not stop the next all-to-all: it \
                launches and is verified on every rank; the error comes with the synchronise",
        run: |cx, p| verified(attribution::soft_error(cx, p.timeout)),
    },
    Check {
        name: "registered_range_everywhere",
        ranks: Ranks::AtLeast(2),
        about: "all_to_all_registered past one rank's registration, or at a misaligned \
                offset: refused on every rank before launch; the next call verified",
        run: |cx, _| verified(attribution::registered(cx)),
    },
];

/// (sender's bytes, receiver's bytes): LL sizes, the LL128 sizes of the issue, staged, copy
/// engine (negotiated), and sizes on different routes.
const CASES: &[(usize, usize)] = &[
    (16, 8),
    (8, 16),
    (1_048_581, 524_291),
    (524_291, 1_048_581),
    (8 << 20, 6 << 20),
    (6 << 20, 8 << 20),
    (256 << 20, (192 << 20) + 16),
    ((192 << 20) + 16, 256 << 20),
    (8, 8 << 20),
    (8 << 20, 8),
];

/// Guard bytes on each side of a destination.
pub(super) const GUARD: usize = 4096;

/// Runs mismatch cases, each `(rank 0's call, everyone else's call)`, on a communicator of
/// their own: `one(f, first, rest, mine)` makes this rank's call and returns the error it saw;
/// `after(f)` then verifies `after_what` on a rebuilt one (a mismatch aborts the communicator).
pub(super) fn run_cases<C: Copy + std::fmt::Debug>(
    cx: &Ctx,
    tag: &str,
    timeout: Duration,
    cases: &[(C, C)],
    one: impl Fn(&Fresh, C, C, C) -> Result<String, String>,
    after: impl Fn(&Fresh) -> Result<(), String>,
    after_what: &str,
) -> Result<String, String> {
    let mut fresh = 0u64;
    let mut f = fresh_comm(cx, tag, &mut fresh, timeout)?;
    let mut mine = Vec::new();
    for &(first, rest) in cases {
        let call = if cx.comm.rank() == 0 { first } else { rest };
        let what = format!("rank 0 {first:?} against {rest:?}");
        let e = one(&f, first, rest, call).map_err(|e| format!("{what}: {e}"))?;
        mine.push(format!("{what}: {e}"));
        drop(f);
        f = fresh_comm(cx, tag, &mut fresh, timeout)?;
        after(&f).map_err(|e| format!("after {what}: {e}"))?;
    }
    Ok(format!(
        "{} cases, each followed by {after_what} on a rebuilt communicator; here: {}",
        cases.len(),
        mine.first().cloned().unwrap_or_default()
    ))
}

/// Correct calls after each mismatch, and the sizes they cycle through (every 100th call also
/// moves 8 MiB + 17).
const AFTER: usize = 1_000;
const AFTER_SIZES: &[usize] = &[1, 8, 13, 4099, 65_537, 262_147, 1_048_581];

/// Every rank builds and drops each communicator (a collective call); an odd last rank has no
/// partner and only meets the others at their host barriers.
fn sendrecv_mismatch(cx: &Ctx, timeout: Duration) -> Result<String, String> {
    let peer = partner(cx);
    let mut fresh = 0u64;
    let mut comm = fresh_comm(cx, "sendrecv", &mut fresh, timeout)?;
    let mut seen = Vec::new();
    for &(s_bytes, r_bytes) in CASES {
        for both in [false, true] {
            let what = format!(
                "{} B sent ({:?}) against {} B received ({:?}), {}",
                s_bytes,
                comm.comm.tuning().p2p_config(s_bytes as u64).protocol,
                r_bytes,
                comm.comm.tuning().p2p_config(r_bytes as u64).protocol,
                if both { "both ways" } else { "one way" }
            );
            let e = one_case(cx, &comm, peer, s_bytes, r_bytes, both, timeout)
                .map_err(|e| format!("{what}: {e}"))?;
            if let Some(e) = e {
                seen.push(e);
            }
            // The communicator of a receiver that found the mismatch is aborted: every rank
            // drops its own and builds the next one together.
            drop(comm);
            comm = fresh_comm(cx, "sendrecv", &mut fresh, timeout)?;
            after(cx, &comm, peer).map_err(|e| format!("after {what}: {e}"))?;
        }
    }
    let example = seen.first().cloned().unwrap_or_default();
    if peer.is_none() {
        return Ok("no partner: built and dropped every communicator with the pairs".into());
    }
    Ok(format!(
        "{} cases ({} errors seen here), each followed by {AFTER} verified calls on a rebuilt \
         communicator; e.g. {example}",
        2 * CASES.len(),
        seen.len()
    ))
}


/// One mismatched call; the receiver's error when this rank received.
fn one_case(
    cx: &Ctx,
    f: &Fresh,
    peer: Option<usize>,
    s_bytes: usize,
    r_bytes: usize,
    both: bool,
    timeout: Duration,
) -> Result<Option<String>, String> {
    let Some(peer) = peer else {
        cx.host_barrier()?;
        return cx.host_barrier().map(|()| None);
    };
    let (comm, stream) = (&f.comm, &f.stream);
    let rank = comm.rank();
    let sends = both || rank % 2 == 0;
    let recvs = both || rank % 2 == 1;
    let src = stream
        .clone_htod(&cx.data_of(rank, 7, s_bytes))
        .map_err(|e| e.to_string())?;
    let mut dst = stream
        .clone_htod(&vec![POISON; r_bytes + 2 * GUARD])
        .map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    // A correct call first: the module is compiled and loaded on both sides, so that the timed
    // call below measures the device's detection, not a compile.
    {
        let one = stream.clone_htod(&[1u8; 8]).map_err(|e| e.to_string())?;
        let mut back = stream.alloc_zeros::<u8>(8).map_err(|e| e.to_string())?;
        comm.sendrecv(&one, peer, &mut back, peer, stream)
            .and_then(|()| comm.synchronize(stream))
            .map_err(|e| format!("the warm-up call: {e}"))?;
    }
    let t = Instant::now();
    let launched = {
        let mut view = dst.slice_mut(GUARD..GUARD + r_bytes);
        match (sends, recvs) {
            (true, true) => comm.sendrecv(&src, peer, &mut view, peer, stream),
            (true, false) => comm.send(&src, peer, stream),
            _ => comm.recv(&mut view, peer, stream),
        }
    };
    let result = launched.and_then(|()| comm.synchronize(stream));
    let waited = t.elapsed();
    let slack = Duration::from_secs(2);
    if waited > timeout + slack {
        return Err(format!("took {waited:?} (device timeout {timeout:?})"));
    }
    let out = if recvs {
        let e = match result {
            Err(e @ Error::CallMismatch { .. }) => e.to_string(),
            Err(other) => return Err(format!("expected CallMismatch, got: {other}")),
            Ok(()) => return Err("the receiver's call succeeded".into()),
        };
        for part in [format!("peer {peer}"), r_bytes.to_string(), s_bytes.to_string()] {
            if !e.contains(&part) {
                return Err(format!("the error does not name {part}: {e}"));
            }
        }
        let got = stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
        // The copy engine's pulled chunks are copied by a stream that cannot be stopped once a
        // kernel has released it: its copy stays inside the destination. Every other route
        // writes nothing at all.
        let by_ce = comm.tuning().p2p_config(r_bytes as u64).protocol == Protocol::CopyEngine;
        let checked = if by_ce {
            [&got[..GUARD], &got[GUARD + r_bytes..]].concat()
        } else {
            got
        };
        if let Some(i) = checked.iter().position(|&b| b != POISON) {
            return Err(format!(
                "byte {i} of the {} guarded bytes was written",
                if by_ce { "guard" } else { "destination and" }
            ));
        }
        Some(e)
    } else {
        // The sender learns of it only where its protocol waits for the receiver; whatever it
        // returned, it returned within the timeout (checked above).
        None
    };
    cx.host_barrier()?;
    Ok(out)
}

/// AFTER correct calls both ways on `comm`, of mixed sizes, each verified.
fn after(cx: &Ctx, f: &Fresh, peer: Option<usize>) -> Result<(), String> {
    let Some(peer) = peer else {
        cx.host_barrier()?;
        return cx.host_barrier();
    };
    let (comm, stream) = (&f.comm, &f.stream);
    let rank = comm.rank();
    let big = (8 << 20) + 17;
    let mut sizes: Vec<usize> = AFTER_SIZES.to_vec();
    sizes.push(big);
    // Two versions of every size, alternating, so stale data from the call before fails.
    let upload = |who: usize, tag: u64, n: usize| -> Result<CudaSlice<u8>, String> {
        stream
            .clone_htod(&cx.data_of(who, tag, n))
            .map_err(|e| e.to_string())
    };
    let mut src: Vec<[CudaSlice<u8>; 2]> = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let t = 1000 + 2 * i as u64;
        src.push([upload(rank, t, n)?, upload(rank, t + 1, n)?]);
    }
    let mut dst = stream.alloc_zeros::<u8>(big).map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    for call in 0..AFTER {
        let i = if call % 100 == 99 {
            sizes.len() - 1
        } else {
            call % AFTER_SIZES.len()
        };
        let (n, v) = (sizes[i], (call / AFTER_SIZES.len()) % 2);
        let mut view = dst.slice_mut(..n);
        comm.sendrecv(&src[i][v], peer, &mut view, peer, stream)
            .and_then(|()| comm.synchronize(stream))
            .map_err(|e| format!("call {call} ({n} B): {e}"))?;
        let got = read(stream, &dst, n)?;
        let expect = cx.data_of(peer, 1000 + 2 * i as u64 + v as u64, n);
        compare(&got, &expect, &format!("call {call} ({n} B)"))?;
    }
    cx.host_barrier()
}

fn read(stream: &Arc<CudaStream>, dst: &CudaSlice<u8>, n: usize) -> Result<Vec<u8>, String> {
    stream
        .clone_dtoh(&dst.slice(..n))
        .map_err(|e| e.to_string())
}
