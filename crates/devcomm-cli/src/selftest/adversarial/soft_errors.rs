//! A soft error of an earlier call before every kind of call: rank 0's all-to-all-v claims
//! more rows than its send buffer holds (a `CountOverflow`, recorded on the device, not yet
//! collected); then every rank makes the next call. It must launch on every rank (the error
//! belongs to the faulty call, docs/PROTOCOL.md, "The guard before launch"), deliver verified
//! results, and the error must come with the synchronise on rank 0 alone, within the device
//! timeout; the communicator stays usable for the next kind.

use std::time::{Duration, Instant};

use cudarc::driver::CudaSlice;
use devcomm::{AllToAllVCounts, Error, HookArgs, ReduceOp};

use crate::selftest::harness::{doubling_epilogue, doubling_hooks, Ctx, RegBuf};

/// Every kind of call, after a soft error.
#[derive(Debug, Clone, Copy)]
enum Kind {
    SendRecv,
    AllToAll,
    AllToAllV,
    /// A small all-reduce (one-shot) and a large one (two-shot).
    AllReduce(usize),
    ReduceScatter,
    AllGather,
    Barrier,
    ZeroCopy,
    /// An all-to-all through user hooks (doubling on the way) and an all-reduce with an
    /// epilogue hook (doubling every reduced row).
    HookedAllToAll,
    HookedAllReduce,
    /// An all-to-all into a registered output.
    AllToAllRegistered,
}

const KINDS: [Kind; 12] = [
    Kind::SendRecv,
    Kind::AllToAll,
    Kind::AllToAllV,
    Kind::AllReduce(1000),
    Kind::AllReduce(1 << 20),
    Kind::ReduceScatter,
    Kind::AllGather,
    Kind::Barrier,
    Kind::ZeroCopy,
    Kind::HookedAllToAll,
    Kind::HookedAllReduce,
    Kind::AllToAllRegistered,
];

/// The check: every kind in turn on the self-test's communicator.
pub(super) fn soft_error_before_every_call(
    cx: &Ctx,
    timeout: Duration,
) -> Result<String, String> {
    for kind in KINDS {
        cx.host_barrier()?;
        one(cx, kind, timeout).map_err(|e| format!("{kind:?}: {e}"))?;
    }
    cx.host_barrier()?;
    Ok(format!(
        "after an uncollected count error on rank 0, {} kinds of call launched and verified on \
         every rank; the error came with the synchronise on rank 0 alone",
        KINDS.len()
    ))
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Small exact values: sums of them are exact in f32.
fn value(rank: usize, i: usize) -> f32 {
    ((rank * 7 + i) % 13) as f32
}

fn one(cx: &Ctx, kind: Kind, timeout: Duration) -> Result<(), String> {
    let (comm, s) = (&cx.comm, &cx.stream);
    let (rank, world) = (comm.rank(), comm.world_size());
    let _faulty = soft_error(cx)?;
    let t = Instant::now();
    match kind {
        Kind::SendRecv => {
            let n = 100_003;
            let (to, from) = ((rank + 1) % world, (rank + world - 1) % world);
            let src = s.clone_htod(&cx.data_of(rank, 1, n)).map_err(err)?;
            let mut dst = s.alloc_zeros::<u8>(n).map_err(err)?;
            comm.sendrecv(&src, to, &mut dst, from, s).map_err(err)?;
            collect(cx, t, timeout)?;
            expect(cx, &dst, &cx.data_of(from, 1, n))
        }
        Kind::AllToAll | Kind::AllToAllV => {
            let n = 4096; // u64 per peer
            let src: Vec<u64> = (0..n * world).map(|i| (rank * 1_000_000 + i) as u64).collect();
            let src = s.clone_htod(&src).map_err(err)?;
            let mut dst = s.alloc_zeros::<u64>(n * world).map_err(err)?;
            if let Kind::AllToAll = kind {
                comm.all_to_all(&src, &mut dst, s).map_err(err)?;
            } else {
                let mut counts = AllToAllVCounts::new(s, world).map_err(err)?;
                s.memcpy_htod(&vec![n as u64; world], &mut counts.send_counts)
                    .map_err(err)?;
                comm.all_to_all_v(&src, &mut dst, &mut counts, 1, s)
                    .map_err(err)?;
            }
            collect(cx, t, timeout)?;
            let want: Vec<u64> = (0..world)
                .flat_map(|p| (0..n).map(move |i| (p * 1_000_000 + rank * n + i) as u64))
                .collect();
            expect(cx, &dst, &want)
        }
        Kind::AllReduce(n) => {
            let src = s
                .clone_htod(&(0..n).map(|i| value(rank, i)).collect::<Vec<_>>())
                .map_err(err)?;
            let mut dst = s.alloc_zeros::<f32>(n).map_err(err)?;
            comm.all_reduce(&src, &mut dst, ReduceOp::Sum, s)
                .map_err(err)?;
            collect(cx, t, timeout)?;
            let want: Vec<f32> = (0..n)
                .map(|i| (0..world).map(|r| value(r, i)).sum())
                .collect();
            expect(cx, &dst, &want)
        }
        Kind::ReduceScatter => {
            let m = 40_000;
            let src = s
                .clone_htod(&(0..m * world).map(|i| value(rank, i)).collect::<Vec<_>>())
                .map_err(err)?;
            let mut dst = s.alloc_zeros::<f32>(m).map_err(err)?;
            comm.reduce_scatter(&src, &mut dst, ReduceOp::Sum, s)
                .map_err(err)?;
            collect(cx, t, timeout)?;
            let want: Vec<f32> = (0..m)
                .map(|i| (0..world).map(|r| value(r, rank * m + i)).sum())
                .collect();
            expect(cx, &dst, &want)
        }
        Kind::AllGather => {
            let m = 40_000;
            let src = s
                .clone_htod(&(0..m).map(|i| value(rank, i)).collect::<Vec<_>>())
                .map_err(err)?;
            let mut dst = s.alloc_zeros::<f32>(m * world).map_err(err)?;
            comm.all_gather(&src, &mut dst, s).map_err(err)?;
            collect(cx, t, timeout)?;
            let want: Vec<f32> = (0..world)
                .flat_map(|p| (0..m).map(move |i| value(p, i)))
                .collect();
            expect(cx, &dst, &want)
        }
        Kind::Barrier => {
            comm.barrier(s).map_err(err)?;
            collect(cx, t, timeout)
        }
        Kind::HookedAllToAll => {
            let n = 4096; // f32 per peer
            let mine: Vec<f32> = (0..n * world).map(|i| value(rank, i)).collect();
            let src = s.clone_htod(&mine).map_err(err)?;
            let mut dst = s.alloc_zeros::<f32>(n * world).map_err(err)?;
            let hooks = doubling_hooks();
            comm.all_to_all_hooked(&hooks, &src, &mut dst, HookArgs::default(), s)
                .map_err(err)?;
            collect(cx, t, timeout)?;
            let want: Vec<f32> = (0..world)
                .flat_map(|p| (0..n).map(move |i| 2.0 * value(p, rank * n + i)))
                .collect();
            expect(cx, &dst, &want)
        }
        Kind::HookedAllReduce => {
            let (rows, row) = (64, 256);
            let n = rows * row;
            let src = s
                .clone_htod(&(0..n).map(|i| value(rank, i)).collect::<Vec<_>>())
                .map_err(err)?;
            let mut dst = s.alloc_zeros::<f32>(n).map_err(err)?;
            let hooks = doubling_epilogue();
            comm.all_reduce_hooked(&hooks, &src, &mut dst, ReduceOp::Sum, &HookArgs::rows(row), s)
                .map_err(err)?;
            collect(cx, t, timeout)?;
            let want: Vec<f32> = (0..n)
                .map(|i| 2.0 * (0..world).map(|r| value(r, i)).sum::<f32>())
                .collect();
            expect(cx, &dst, &want)
        }
        Kind::AllToAllRegistered => {
            let n = 8192; // bytes per peer
            let reg = RegBuf::new(cx, n * world)?;
            let src = s.clone_htod(&cx.data_of(rank, 3, n * world)).map_err(err)?;
            comm.all_to_all_registered(&src, reg.at(0, n * world), s)
                .map_err(err)?;
            collect(cx, t, timeout)?;
            let got = cx.read_ptr(reg.ptr, n * world)?;
            for p in 0..world {
                if got[p * n..(p + 1) * n] != cx.data_of(p, 3, n * world)[rank * n..(rank + 1) * n] {
                    return Err(format!("the registered output's chunk from rank {p} differs"));
                }
            }
            Ok(())
        }
        Kind::ZeroCopy => {
            // Above the low-latency size: the rendezvous kernel.
            let n = (1 << 20) + 16;
            let reg = RegBuf::new(cx, n)?;
            let (to, from) = ((rank + 1) % world, (rank + world - 1) % world);
            let src = s.clone_htod(&cx.data_of(rank, 2, n)).map_err(err)?;
            comm.sendrecv_registered(&src, to, reg.at(0, n), reg.at(0, n), from, s)
                .map_err(err)?;
            collect(cx, t, timeout)?;
            let got = cx.read_ptr(reg.ptr, n)?;
            if got != cx.data_of(from, 2, n) {
                return Err("the registered destination differs from the sender's data".into());
            }
            Ok(())
        }
    }
}

/// Rank 0's all-to-all-v claims twice its send buffer for every peer: the kernel records a
/// `CountOverflow` (after draining every peer, so the communicator stays consistent). The
/// stream is synchronised but the error not collected. Returns the buffers to keep alive.
fn soft_error(cx: &Ctx) -> Result<(CudaSlice<u64>, CudaSlice<u64>, AllToAllVCounts), String> {
    let (comm, s) = (&cx.comm, &cx.stream);
    let (rank, world) = (comm.rank(), comm.world_size());
    let n = 256;
    let src = s.alloc_zeros::<u64>(n * world).map_err(err)?;
    let mut scratch = s.alloc_zeros::<u64>(4 * n * world).map_err(err)?;
    let mut counts = AllToAllVCounts::new(s, world).map_err(err)?;
    let mine = if rank == 0 { 2 * n } else { n };
    s.memcpy_htod(&vec![mine as u64; world], &mut counts.send_counts)
        .map_err(err)?;
    comm.all_to_all_v(&src, &mut scratch, &mut counts, 1, s)
        .map_err(|e| format!("the faulty all-to-all-v: {e}"))?;
    s.synchronize().map_err(err)?;
    Ok((src, scratch, counts))
}

/// The synchronise after the next call: rank 0 gets the count error (once), the others
/// nothing; within the device timeout (timed from the launch's return, so that a first use's
/// compile does not count: peers wait for it at the kernel's load gate, not on the device).
fn collect(cx: &Ctx, _called: Instant, timeout: Duration) -> Result<(), String> {
    let rank = cx.comm.rank();
    let t = Instant::now();
    let collected = cx.comm.synchronize(&cx.stream);
    let waited = t.elapsed();
    match (&collected, rank) {
        (Err(Error::CountOverflow { .. }), 0) | (Ok(()), 1..) => {}
        (Ok(()), 0) => return Err("rank 0's count error was not reported".into()),
        (Err(e), _) => return Err(format!("unexpected error: {e}")),
    }
    if waited > timeout {
        return Err(format!("the call took {waited:?} (device timeout {timeout:?})"));
    }
    cx.comm
        .check()
        .map_err(|e| format!("an error was reported twice or left behind: {e}"))
}

fn expect<T: cudarc::driver::DeviceRepr + PartialEq + std::fmt::Debug>(
    cx: &Ctx,
    got: &CudaSlice<T>,
    want: &[T],
) -> Result<(), String> {
    let got = cx.stream.clone_dtoh(got).map_err(err)?;
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None if got.len() == want.len() => Ok(()),
        None => Err(format!("{} elements, {} expected", got.len(), want.len())),
        Some(i) => Err(format!(
            "element {i}: {:?}, expected {:?}",
            got[i], want[i]
        )),
    }
}
