//! Errors belong to the call that caused them, on every rank, within the device timeout:
//! an all-to-all-v count error left uncollected does not stop the next all-to-all (which must
//! launch and deliver on every rank; the error comes with the synchronise that covers the
//! faulty call); an all-to-all into registered memory whose range does not fit one rank's
//! registration is refused by every rank before any launches; an offset that is not a
//! multiple of the element's alignment is refused.

use std::time::{Duration, Instant};

use cudarc::driver::CudaSlice;
use devcomm::{AllToAllVCounts, Error};

use crate::selftest::harness::{Ctx, RegBuf};

/// An all-to-all-v whose counts overrun rank 0's send buffer, then a correct all-to-all
/// launched before anything is collected.
pub(super) fn soft_error(cx: &Ctx, timeout: Duration) -> Result<String, String> {
    let (comm, stream) = (&cx.comm, &cx.stream);
    let (rank, world) = (comm.rank(), comm.world_size());
    let n = 256usize; // elements per peer
    let src = stream
        .clone_htod(&(0..n * world).map(|i| (rank * 1_000_000 + i) as u64).collect::<Vec<_>>())
        .map_err(|e| e.to_string())?;
    let mut dst = stream
        .alloc_zeros::<u64>(n * world)
        .map_err(|e| e.to_string())?;
    let mut counts = AllToAllVCounts::new(stream, world).map_err(|e| e.to_string())?;
    // Rank 0 claims twice what its send buffer holds for every peer: a send-side overflow.
    let mine = if rank == 0 { 2 * n } else { n };
    stream
        .memcpy_htod(&vec![mine as u64; world], &mut counts.send_counts)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    let t = Instant::now();
    let mut scratch = stream
        .alloc_zeros::<u64>(4 * n * world)
        .map_err(|e| e.to_string())?;
    comm.all_to_all_v(&src, &mut scratch, &mut counts, 1, stream)
        .map_err(|e| format!("all_to_all_v launch: {e}"))?;
    // The faulty call has run (and recorded its error) before the next one is launched.
    stream.synchronize().map_err(|e| e.to_string())?;
    comm.all_to_all(&src, &mut dst, stream)
        .map_err(|e| format!("the next all-to-all was not launched: {e}"))?;
    let collected = comm.synchronize(stream);
    let waited = t.elapsed();
    match (&collected, rank) {
        (Err(Error::CountOverflow { .. }), 0) => {}
        (Ok(()), 0) => return Err("rank 0's count error was not reported".into()),
        (Ok(()), _) => {}
        (Err(e), _) => return Err(format!("unexpected error: {e}")),
    }
    if waited > timeout {
        return Err(format!("took {waited:?}"));
    }
    verify_all_to_all(cx, &dst, n)?;
    comm.check()
        .map_err(|e| format!("the error was reported twice: {e}"))?;
    cx.host_barrier()?;
    Ok(format!(
        "count error reported by the synchronise after the faulty call{}; the next all-to-all \
         launched and verified on every rank",
        if rank == 0 { " on rank 0" } else { "" }
    ))
}

fn verify_all_to_all(cx: &Ctx, dst: &CudaSlice<u64>, n: usize) -> Result<(), String> {
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let got = cx.stream.clone_dtoh(dst).map_err(|e| e.to_string())?;
    let expect: Vec<u64> = (0..world)
        .flat_map(|p| (0..n).map(move |i| (p * 1_000_000 + rank * n + i) as u64))
        .collect();
    if got != expect {
        let i = got.iter().zip(&expect).position(|(a, b)| a != b);
        return Err(format!("all-to-all output differs at element {i:?}"));
    }
    Ok(())
}

/// Rank 1 registers less than the others; an all-to-all whose output fits every rank but rank
/// 1 must be refused on every rank before launch; so must an offset of 2 for f32 elements;
/// then a correct call works.
pub(super) fn registered(cx: &Ctx) -> Result<String, String> {
    let (comm, stream) = (&cx.comm, &cx.stream);
    let (rank, world) = (comm.rank(), comm.world_size());
    let chunk = 1024usize; // bytes per peer: the fused route
    let total = chunk * world;
    let bytes = if rank == 1 { total + 64 } else { 2 * total };
    let reg = RegBuf::new(cx, bytes)?;
    let src: CudaSlice<f32> = stream
        .clone_htod(&vec![rank as f32; total / 4])
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    // Fits rank 0 (2 x total) but not rank 1 (total).
    match comm.all_to_all_registered(&src, reg.at(total / 2, total), stream) {
        Err(Error::CapacityExceeded { peer: 1, .. }) => {}
        Err(other) => return Err(format!("range past rank 1's registration: {other}")),
        Ok(()) => return Err("a range past rank 1's registration was launched".into()),
    }
    match comm.all_to_all_registered(&src, reg.at(2, total), stream) {
        Err(Error::InvalidArgument { reason, .. }) if reason.contains("aligned") => {}
        Err(other) => return Err(format!("misaligned offset: {other}")),
        Ok(()) => return Err("an f32 output at offset 2 was launched".into()),
    }
    comm.all_to_all_registered(&src, reg.at(0, total), stream)
        .and_then(|()| comm.synchronize(stream))
        .map_err(|e| format!("the correct call after the refusals: {e}"))?;
    let got = cx.read_ptr(reg.ptr, total)?;
    for p in 0..world {
        let v = f32::from_le_bytes(got[p * chunk..p * chunk + 4].try_into().unwrap_or([0; 4]));
        if v != p as f32 {
            return Err(format!("chunk {p} holds {v} after the correct call"));
        }
    }
    cx.host_barrier()?;
    Ok("past one rank's registration: refused on every rank; misaligned offset: refused; \
        the next call verified"
        .into())
}
