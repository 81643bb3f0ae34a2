//! Every overlap layout of every raw call (and of the send/recv and zero-copy calls). Layouts that are wrong on every rank alike (a
//! partial overlap, a written buffer over a read one) are refused on every rank before
//! anything launches, and the communicator goes on; the in-place layouts (the same buffer, or
//! this rank's own shard) are accepted and verified; and a layout that is another rank's
//! in-place shard (a reduce-scatter output at shard k of the input, an all-gather input at
//! shard k of the output) is refused by every rank whose shard it is not, while the owner
//! accepts it: the refusing ranks take part refused (docs/PROTOCOL.md, "Refused buffers"), so
//! every rank's call fails at once, naming its peer, with nothing written, instead of the owner
//! waiting out the device timeout.

use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DevicePtr};
use devcomm::raw::{RawBuffer, RawCounts};
use devcomm::{Comm, DataType, Error, HookArgs, Hooks, ReduceOp};

use crate::selftest::harness::{fresh_comm, Ctx, RegBuf};

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn value(rank: usize, i: usize) -> f32 {
    ((rank * 5 + i) % 11) as f32
}

/// An epilogue that leaves the rows as they are (for the hooked raw forms).
const KEEP: &str = "struct Keep { using T = float; \
    static __device__ void epilogue(const devcomm::red::RowCtx&, T*) {} };";

/// Layouts refused alike on every rank; then the in-place layouts, verified.
pub(super) fn refused_everywhere(cx: &Ctx) -> Result<String, String> {
    let (comm, s) = (&cx.comm, &cx.stream);
    let (rank, w) = (comm.rank(), comm.world_size());
    let m = 1024usize; // elements of a shard
    let buf = s.alloc_zeros::<f32>(m * w + 64).map_err(err)?;
    let base = buf.device_ptr(s).0;
    let shard = (m * 4) as u64;
    let f32_ = DataType::F32;
    let sum = ReduceOp::Sum;
    let keep = Hooks::<f32>::new("Keep", KEEP);
    let rows = HookArgs::rows(16);
    let mut refused = 0usize;
    let mut expect_refused = |what: &str, r: Result<(), Error>| match r {
        Err(Error::InvalidArgument { reason, .. }) if reason.contains("overlap") => {
            refused += 1;
            Ok(())
        }
        other => Err(format!("{what}: expected an overlap refusal, got {other:?}")),
    };
    // SAFETY: every address below lies inside `buf` (m w + 64 f32) for the counts given, and
    // every call is refused before anything is launched.
    unsafe {
        for d in [4u64, 64, shard - 4] {
            expect_refused(
                "all_reduce_raw output after input",
                comm.all_reduce_raw(base, base + d, m, f32_, sum, s),
            )?;
            expect_refused(
                "all_reduce_raw input after output",
                comm.all_reduce_raw(base + d, base, m, f32_, sum, s),
            )?;
            expect_refused(
                "all_reduce_hooked_raw",
                comm.all_reduce_hooked_raw(keep.raw(), base, base + d, m, f32_, sum, &rows, s),
            )?;
        }
        for d in [4u64, shard + 4, shard / 2] {
            expect_refused(
                "reduce_scatter_raw output off a shard boundary",
                comm.reduce_scatter_raw(base, base + d, m, f32_, sum, s),
            )?;
            expect_refused(
                "reduce_scatter_hooked_raw off a shard boundary",
                comm.reduce_scatter_hooked_raw(keep.raw(), base, base + d, m, f32_, sum, &rows, s),
            )?;
            expect_refused(
                "all_gather_raw input off a shard boundary",
                comm.all_gather_raw(base + d, base, m, f32_, s),
            )?;
        }
        // The output starting before the input and running into it.
        expect_refused(
            "reduce_scatter_raw output before the input",
            comm.reduce_scatter_raw(base + 256, base + 4, m / 2, f32_, sum, s),
        )?;
        // All-to-all: the receive buffer over the send buffer, and counts over the data.
        let copy = devcomm::raw::copy_hooks(4).map_err(err)?;
        let n = (m * w) as u64 / 2 / w as u64 * w as u64;
        let half = RawBuffer {
            ptr: base,
            elems: n,
            elem_size: 4,
        };
        let shifted = RawBuffer {
            ptr: base + 4 * n / 2,
            ..half
        };
        expect_refused(
            "all_to_all_raw",
            comm.all_to_all_raw(&copy, half, shifted, HookArgs::default(), s),
        )?;
        let counts = |recv_counts: u64| RawCounts {
            send_counts: base + 4 * n,
            send_offsets: 0,
            recv_counts,
            recv_offsets: base + 4 * n + 8 * w as u64 * 2,
        };
        expect_refused(
            "all_to_all_v_raw received counts over the send counts",
            comm.all_to_all_v_raw(&copy, half, shifted_out(half, n), counts(base + 4 * n), HookArgs::rows(1), s),
        )?;
        expect_refused(
            "all_to_all_v_raw received counts over the received data",
            comm.all_to_all_v_raw(&copy, half, shifted_out(half, n), counts(base + 4 * n + 4 * n), HookArgs::rows(1), s),
        )?;
    }
    // Send/recv: the receive buffer over the send buffer (raw), and the zero-copy calls with
    // this rank's registered destination over the send buffer.
    let (next, prev) = ((rank + 1) % w, (rank + w - 1) % w);
    let t = |ptr: u64, peer: usize| devcomm::p2p::Transfer {
        ptr,
        bytes: 4096,
        peer,
        config: None,
    };
    // SAFETY: both ranges lie inside `buf`; the call is refused before anything is launched.
    expect_refused("sendrecv_raw", unsafe {
        comm.sendrecv_raw(Some(t(base, next)), Some(t(base + 1024, prev)), s)
    })?;
    let reg = RegBuf::new(cx, 1 << 20)?;
    // SAFETY: a view of the registered buffer's first 64 KiB, never freed by cudarc.
    let view = std::mem::ManuallyDrop::new(unsafe { s.upgrade_device_ptr::<u8>(reg.ptr, 1 << 16) });
    expect_refused(
        "sendrecv_registered",
        comm.sendrecv_registered(&*view, next, reg.at(4096, 1 << 16), reg.at(4096, 1 << 16), prev, s),
    )?;
    // World size x a chunk, over the registered output.
    let chunked = std::mem::ManuallyDrop::new(
        // SAFETY: as `view`, the first 4 KiB x w bytes of the registered buffer.
        unsafe { s.upgrade_device_ptr::<u8>(reg.ptr, 4096 * w) },
    );
    expect_refused(
        "all_to_all_registered",
        comm.all_to_all_registered(&*chunked, reg.at(0, 4096 * w), s),
    )?;
    drop(reg);
    // Nothing launched: the communicator goes on. The in-place layouts, verified.
    in_place_layouts(cx, rank, w, m)?;
    Ok(format!(
        "{refused} overlapping layouts refused on every rank before launch; the in-place \
         layouts (same buffer, own shard) verified after"
    ))
}

/// A receive buffer of `n` elements right after `half` (no overlap with it).
fn shifted_out(half: RawBuffer, n: u64) -> RawBuffer {
    RawBuffer {
        ptr: half.ptr + 4 * n,
        ..half
    }
}

/// All-reduce in place (input == output), reduce-scatter and all-gather in place by the same
/// buffer and by this rank's own shard, each verified.
fn in_place_layouts(cx: &Ctx, rank: usize, w: usize, m: usize) -> Result<(), String> {
    let (comm, s) = (&cx.comm, &cx.stream);
    let whole: Vec<f32> = (0..m * w).map(|i| value(rank, i)).collect();
    for own_shard in [false, true] {
        let mut buf = s.clone_htod(&whole).map_err(err)?;
        let p = buf.device_ptr(s).0;
        let at = if own_shard { p + (rank * m * 4) as u64 } else { p };
        // SAFETY: `buf` holds m w f32; the output is that buffer or this rank's shard of it.
        unsafe { comm.reduce_scatter_raw(p, at, m, DataType::F32, ReduceOp::Sum, s) }
            .map_err(|e| format!("reduce_scatter_raw in place (own shard {own_shard}): {e}"))?;
        comm.synchronize(s).map_err(err)?;
        let got = s.clone_dtoh(&buf).map_err(err)?;
        for i in 0..m {
            let want: f32 = (0..w).map(|r| value(r, rank * m + i)).sum();
            if got[rank * m + i] != want {
                return Err(format!("reduce-scatter in place: element {i} {}", got[rank * m + i]));
            }
        }
        // All-gather in place: this rank's shard is its input.
        let mut out = s.alloc_zeros::<f32>(m * w).map_err(err)?;
        s.memcpy_htod(&whole[rank * m..(rank + 1) * m], &mut out.slice_mut(rank * m..(rank + 1) * m))
            .map_err(err)?;
        let o = out.device_ptr(s).0;
        let input = if own_shard { o + (rank * m * 4) as u64 } else { o };
        // SAFETY: `out` holds m w f32; the input is that buffer or this rank's shard of it.
        unsafe { comm.all_gather_raw(input, o, m, DataType::F32, s) }
            .map_err(|e| format!("all_gather_raw in place (own shard {own_shard}): {e}"))?;
        comm.synchronize(s).map_err(err)?;
        let got = s.clone_dtoh(&out).map_err(err)?;
        for p in 0..w {
            for i in 0..m {
                if got[p * m + i] != value(p, p * m + i) {
                    return Err(format!("all-gather in place: rank {p}'s element {i}"));
                }
            }
        }
        let _ = &mut buf;
    }
    // All-reduce in place.
    let mut buf = s.clone_htod(&whole).map_err(err)?;
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s)
        .map_err(err)?;
    comm.synchronize(s).map_err(err)?;
    let got = s.clone_dtoh(&buf).map_err(err)?;
    for (i, g) in got.iter().enumerate() {
        let want: f32 = (0..w).map(|r| value(r, i)).sum();
        if *g != want {
            return Err(format!("all-reduce in place: element {i} {g}, expected {want}"));
        }
    }
    Ok(())
}

/// Which shard each rank names in a case of another rank's shard.
#[derive(Debug, Clone, Copy)]
enum Pattern {
    /// Every rank the same shard `k` (rank k's in-place layout).
    Same(usize),
    /// Rank r the shard of rank r + 1 (the last rank's is shard 0: the same buffer).
    Next,
}

/// Another rank's shard, for reduce-scatter and all-gather in both patterns, each on a fresh
/// communicator (every case aborts it).
pub(super) fn another_ranks_shard(cx: &Ctx, timeout: Duration) -> Result<String, String> {
    let mut n = 0u64;
    let mut done = Vec::new();
    for reduce_scatter in [true, false] {
        for pattern in [Pattern::Same(1), Pattern::Next] {
            cx.host_barrier()?;
            let f = fresh_comm(cx, "another_ranks_shard", &mut n, timeout)?;
            let what = if reduce_scatter { "reduce_scatter_raw" } else { "all_gather_raw" };
            shard_case(&f.comm, &f.stream, reduce_scatter, pattern, timeout)
                .map_err(|e| format!("{what} {pattern:?}: {e}"))?;
            done.push(format!("{what} {pattern:?}"));
        }
    }
    cx.host_barrier()?;
    Ok(format!(
        "{}: the owner's call and every refused call failed at once with a call mismatch, \
         nothing written",
        done.join(", ")
    ))
}

fn shard_case(
    comm: &Comm,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    reduce_scatter: bool,
    pattern: Pattern,
    timeout: Duration,
) -> Result<(), String> {
    let (rank, w) = (comm.rank(), comm.world_size());
    let m = 4096usize;
    let k = match pattern {
        Pattern::Same(k) => k % w,
        Pattern::Next => (rank + 1) % w,
    };
    let whole: Vec<f32> = (0..m * w).map(|i| value(rank, i) + 0.5).collect();
    let buf: CudaSlice<f32> = s.clone_htod(&whole).map_err(err)?;
    let p = buf.device_ptr(s).0;
    let at = p + (k * m * 4) as u64;
    let t = Instant::now();
    // SAFETY: `buf` holds m w f32: the input (reduce-scatter) or output (all-gather) whole,
    // the other buffer its shard k.
    let called = unsafe {
        if reduce_scatter {
            comm.reduce_scatter_raw(p, at, m, DataType::F32, ReduceOp::Sum, s)
        } else {
            comm.all_gather_raw(at, p, m, DataType::F32, s)
        }
    };
    let owner = k == rank || k == 0;
    match (&called, owner) {
        (Ok(()), true) => {}
        (Err(Error::InvalidArgument { .. }), false) => {}
        (other, _) => {
            return Err(format!(
                "rank {rank}, shard {k}: the call returned {other:?} (owner: {owner})"
            ))
        }
    }
    let synced = comm.synchronize(s);
    let waited = t.elapsed();
    match &synced {
        Err(Error::CallMismatch { .. }) => {}
        other => return Err(format!("rank {rank}: the synchronise returned {other:?}, expected a call mismatch")),
    }
    if waited >= timeout {
        return Err(format!("rank {rank}: {waited:?}, not before the device timeout {timeout:?}"));
    }
    let got = s.clone_dtoh(&buf).map_err(err)?;
    if got != whole {
        let i = got.iter().zip(&whole).position(|(a, b)| a != b);
        return Err(format!("rank {rank}: the buffer was written (element {i:?})"));
    }
    Ok(())
}
