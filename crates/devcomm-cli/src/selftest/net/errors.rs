//! Errors with network peers: a call whose two sides differ in size. The collectives' and
//! reductions' mismatches with network peers are the `mismatch` group's `collective_mismatch`
//! and `reduce_mismatch`, run with network links.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use devcomm::{Comm, Error};

use super::super::harness::{
    compare, fresh_comm, Checked, Ctx, Fresh, Outcome, POISON,
};
use super::{job, no_partner};

/// (sender's bytes, receiver's bytes) of the mismatch cases.
const CASES: &[(usize, usize)] = &[(4096, 8192), ((3 << 20) + 1, 1 << 20), (8, 9)];
/// Poison bytes before and after the receiver's destination.
const GUARD: usize = 4096;
/// Verified calls on each rebuilt communicator.
const AFTER: usize = 50;

/// Each case on a communicator of its own: the lower rank of each pair sends, the higher
/// receives another size; both must fail with CallMismatch naming the peer and both sizes
/// within the device timeout (+2 s), the receiver's destination and guards untouched; then
/// the ranks rebuild the communicator and make AFTER verified calls.
pub(super) fn mismatch(cx: &Ctx, timeout: Duration) -> Checked {
    let net = match job(cx, "net_mismatch")? {
        Ok(j) => j,
        Err(skip) => return Ok(skip),
    };
    let mut fresh = 0u64;
    let mut examples = Vec::new();
    for &(s_bytes, r_bytes) in CASES {
        let Fresh { comm, stream } = fresh_comm(cx, "net-mismatch", &mut fresh, timeout)?;
        cx.host_barrier()?;
        if let Some(peer) = net.partner {
            let e = one_case(cx, &comm, &stream, peer, s_bytes, r_bytes, timeout)
                .map_err(|e| format!("{s_bytes} B sent against {r_bytes} B received: {e}"))?;
            examples.push(e);
        } else {
            cx.host_barrier()?; // the one barrier of one_case
        }
        cx.host_barrier()?;
        // Aborted on both sides of each pair: every rank drops its own and builds the next.
        drop(comm);
        let Fresh { comm, stream } = fresh_comm(cx, "net-mismatch", &mut fresh, timeout)?;
        cx.host_barrier()?;
        if let Some(peer) = net.partner {
            after(cx, &comm, &stream, peer)
                .map_err(|e| format!("after {s_bytes} B against {r_bytes} B: {e}"))?;
        }
        cx.host_barrier()?;
    }
    match net.partner {
        Some(_) => Ok(Outcome::Pass(format!(
            "{} cases, each refused on both sides and followed by {AFTER} verified calls on a \
             rebuilt communicator; e.g. {}",
            CASES.len(),
            examples.first().cloned().unwrap_or_default()
        ))),
        None => Ok(no_partner(cx)),
    }
}


/// One mismatched call; the error this rank saw.
fn one_case(
    cx: &Ctx,
    comm: &Comm,
    stream: &Arc<CudaStream>,
    peer: usize,
    s_bytes: usize,
    r_bytes: usize,
    timeout: Duration,
) -> Result<String, String> {
    let rank = comm.rank();
    let sends = rank < peer;
    // A correct call first: the kernels are loaded on both sides and the transport is warm.
    {
        let one = stream.clone_htod(&[1u8; 8]).map_err(|e| e.to_string())?;
        let mut back = stream.alloc_zeros::<u8>(8).map_err(|e| e.to_string())?;
        comm.sendrecv(&one, peer, &mut back, peer, stream)
            .and_then(|()| comm.synchronize(stream))
            .map_err(|e| format!("the warm-up call: {e}"))?;
    }
    let src = stream
        .clone_htod(&cx.data_of(rank, 77, s_bytes))
        .map_err(|e| e.to_string())?;
    let mut dst = stream
        .clone_htod(&vec![POISON; r_bytes + 2 * GUARD])
        .map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    let t = Instant::now();
    let result = if sends {
        comm.send(&src, peer, stream)
    } else {
        let mut view = dst.slice_mut(GUARD..GUARD + r_bytes);
        comm.recv(&mut view, peer, stream)
    }
    .and_then(|()| comm.synchronize(stream));
    let waited = t.elapsed();
    if waited > timeout + Duration::from_secs(2) {
        return Err(format!("took {waited:?} (device timeout {timeout:?})"));
    }
    let e = match result {
        Err(e @ Error::CallMismatch { .. }) => e.to_string(),
        Err(other) => return Err(format!("expected CallMismatch, got: {other}")),
        Ok(()) => return Err(format!("the {} call succeeded", if sends { "send" } else { "recv" })),
    };
    let mine = if sends { s_bytes } else { r_bytes };
    let theirs = if sends { r_bytes } else { s_bytes };
    for part in [format!("peer {peer}"), mine.to_string(), theirs.to_string()] {
        if !e.contains(&part) {
            return Err(format!("the error does not name {part}: {e}"));
        }
    }
    if !sends {
        let got = stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
        if let Some(i) = got.iter().position(|&b| b != POISON) {
            return Err(format!("byte {i} of the destination and guards was written"));
        }
    }
    Ok(e)
}

/// AFTER calls both ways of mixed sizes on a rebuilt communicator, each checked.
fn after(cx: &Ctx, comm: &Comm, stream: &Arc<CudaStream>, peer: usize) -> Result<(), String> {
    let rank = comm.rank();
    let sizes = [8usize, 4099, 65_536, (1 << 20) + 3];
    let big = *sizes.iter().max().unwrap_or(&8);
    let mut dst = stream.alloc_zeros::<u8>(big).map_err(|e| e.to_string())?;
    for call in 0..AFTER {
        let n = sizes[call % sizes.len()];
        let tag = 5000 + call as u64;
        let src = stream
            .clone_htod(&cx.data_of(rank, tag, n))
            .map_err(|e| e.to_string())?;
        let mut view = dst.slice_mut(..n);
        comm.sendrecv(&src, peer, &mut view, peer, stream)
            .and_then(|()| comm.synchronize(stream))
            .map_err(|e| format!("call {call} ({n} B): {e}"))?;
        let got = stream
            .clone_dtoh(&dst.slice(..n))
            .map_err(|e| e.to_string())?;
        compare(&got, &cx.data_of(peer, tag, n), &format!("call {call} ({n} B)"))?;
    }
    Ok(())
}
