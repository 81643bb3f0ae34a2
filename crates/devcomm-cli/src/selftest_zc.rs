//! `devcomm selftest` checks of zero-copy send/recv into registered buffers: fresh random data,
//! poisoned destinations with guard bytes, every byte compared with the sender's data
//! regenerated on the host.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use devcomm::{Comm, Error, RegisteredRange};

use crate::selftest::Ctx;
use crate::selftest_p2p::{compare, partner, roles, POISON, SIZES};

type Check = Result<String, String>;

/// A `cuMemAlloc` buffer registered with every rank; deregistered and freed on drop.
pub(crate) struct RegBuf<'a> {
    comm: &'a Comm,
    pub(crate) ptr: u64,
    pub(crate) bytes: usize,
    pub(crate) handle: u64,
}

impl<'a> RegBuf<'a> {
    /// Collective.
    pub(crate) fn new(cx: &'a Ctx, bytes: usize) -> Result<Self, String> {
        // SAFETY: a plain allocation, freed in drop after deregistration.
        let ptr =
            unsafe { cudarc::driver::result::malloc_sync(bytes) }.map_err(|e| e.to_string())?;
        match cx.comm.register(ptr, bytes) {
            Ok(handle) => Ok(Self {
                comm: &cx.comm,
                ptr,
                bytes,
                handle,
            }),
            Err(e) => {
                // SAFETY: never registered, nothing uses it.
                unsafe { cudarc::driver::result::free_sync(ptr) }.map_err(|e| e.to_string())?;
                Err(e.to_string())
            }
        }
    }

    /// A cudarc view of the whole buffer (for NCCL). Never dropped: this struct frees it.
    pub(crate) fn view(&self, stream: &Arc<CudaStream>) -> std::mem::ManuallyDrop<CudaSlice<u8>> {
        // SAFETY: `ptr` is a live allocation of `bytes` bytes that outlives the view (the
        // caller holds `self`); ManuallyDrop keeps cudarc from freeing it.
        std::mem::ManuallyDrop::new(unsafe { stream.upgrade_device_ptr(self.ptr, self.bytes) })
    }

    fn at(&self, offset: usize) -> RegisteredRange {
        RegisteredRange::new(self.handle, offset as u64)
    }

    fn poison(&self, stream: &Arc<CudaStream>) -> Result<(), String> {
        // SAFETY: the whole allocation, on this rank's stream.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.ptr,
                POISON,
                self.bytes,
                stream.cu_stream(),
            )
        }
        .map_err(|e| e.to_string())
    }
}

impl Drop for RegBuf<'_> {
    fn drop(&mut self) {
        let dereg = self.comm.deregister(self.handle);
        // SAFETY: deregistered (collectively) above; every kernel using it has finished, as
        // deregistration synchronises the device.
        let freed = unsafe { cudarc::driver::result::free_sync(self.ptr) };
        if let Err(e) = dereg {
            eprintln!("deregister: {e}");
        }
        if let Err(e) = freed {
            eprintln!("free: {e}");
        }
    }
}

/// Reads back `[0, off + bytes + guard)` of the destination and checks the message and that
/// everything around it is still poison.
fn verify(
    cx: &Ctx,
    dst: &RegBuf<'_>,
    off: usize,
    bytes: usize,
    expect: Option<&[u8]>,
    what: &str,
) -> Result<(), String> {
    let guard = 64.min(dst.bytes - off - bytes);
    let got = cx.read_ptr(dst.ptr, off + bytes + guard)?;
    if let Some(expect) = expect {
        compare(&got[off..off + bytes], expect, what)?;
    }
    let written = if expect.is_some() { bytes } else { 0 };
    if got[..off]
        .iter()
        .chain(&got[off + written..])
        .any(|&b| b != POISON)
    {
        return Err(format!(
            "{what}: bytes outside the destination were written"
        ));
    }
    Ok(())
}

/// One zero-copy message between partners: even ranks send (or both ways), at byte offsets.
fn exchange(
    cx: &Ctx,
    dst: &RegBuf<'_>,
    bytes: usize,
    src_off: usize,
    dst_off: usize,
    both: bool,
    tag: u64,
) -> Result<(), String> {
    let Some((peer, sends, receives)) = roles(cx, both) else {
        return cx.host_barrier();
    };
    let src: CudaSlice<u8> = cx
        .stream
        .clone_htod(&cx.data_of(cx.comm.rank(), tag, src_off + bytes))
        .map_err(|e| e.to_string())?;
    let view = src.slice(src_off..);
    dst.poison(&cx.stream)?;
    cx.sync()?;
    cx.host_barrier()?;
    let at = dst.at(dst_off);
    let r = match (sends, receives) {
        (true, true) => {
            cx.comm
                .sendrecv_registered(&view, peer, at, at, bytes as u64, peer, &cx.stream)
        }
        (true, false) => cx.comm.send_registered(&view, peer, at, &cx.stream),
        _ => cx.comm.recv_registered(at, bytes as u64, peer, &cx.stream),
    };
    r.map_err(|e| e.to_string())?;
    cx.sync()?;
    let what = format!("{bytes} B (src+{src_off}, dst+{dst_off}) from {peer}");
    let expect = receives.then(|| cx.data_of(peer, tag, src_off + bytes));
    verify(
        cx,
        dst,
        dst_off,
        bytes,
        expect.as_ref().map(|e| &e[src_off..]),
        &what,
    )?;
    cx.host_barrier()
}

pub(crate) fn check_sizes(cx: &Ctx) -> Check {
    let sizes: Vec<usize> = std::iter::once(0).chain(SIZES.iter().copied()).collect();
    let dst = RegBuf::new(cx, (1 << 30) + 4096)?;
    let mut n = 0;
    for (i, &bytes) in sizes.iter().enumerate() {
        for both in [false, true] {
            let (so, doff) = if i % 2 == 0 { (0, 0) } else { (3, 5) };
            exchange(
                cx,
                &dst,
                bytes,
                so,
                doff,
                both,
                900 + 2 * i as u64 + u64::from(both),
            )?;
            n += 1;
        }
    }
    Ok(format!(
        "{n} zero-copy messages, 0 B to 1 GiB, odd sizes and offsets, one-way and both ways; guard bytes untouched"
    ))
}

/// Mismatched calls are refused on both sides with nothing written; bad ranges are refused
/// before launch; the communicator stays usable.
pub(crate) fn check_errors(cx: &Ctx) -> Check {
    let comm = &cx.comm;
    let rank = comm.rank();
    let dst = RegBuf::new(cx, 4 << 20)?;
    let src = cx
        .stream
        .clone_htod(&cx.data_of(rank, 950, 4 << 20))
        .map_err(|e| e.to_string())?;
    // Refused before launch, on every rank.
    let peer = (rank + 1) % comm.world_size();
    let before: Vec<(&str, Result<(), Error>)> = vec![
        (
            "range past the peer's buffer",
            comm.send_registered(
                &src.slice(..4096),
                peer,
                dst.at(dst.bytes - 100),
                &cx.stream,
            ),
        ),
        (
            "range past this rank's buffer",
            comm.recv_registered(dst.at(16), 4 << 20, peer, &cx.stream),
        ),
        (
            "unknown handle",
            comm.send_registered(
                &src.slice(..16),
                peer,
                RegisteredRange::new(dst.handle + 8, 0),
                &cx.stream,
            ),
        ),
        (
            "peer is this rank",
            comm.send_registered(&src.slice(..16), rank, dst.at(0), &cx.stream),
        ),
        (
            "peer out of range",
            comm.recv_registered(dst.at(0), 16, comm.world_size(), &cx.stream),
        ),
    ];
    for (what, r) in before {
        match r {
            Err(Error::InvalidArgument { .. }) | Err(Error::CapacityExceeded { .. }) => {}
            other => return Err(format!("{what}: expected a refusal, got {other:?}")),
        }
    }
    let Some(peer) = partner(cx) else {
        cx.host_barrier()?;
        return Ok("refusals before launch only (no partner)".into());
    };
    // Mismatches (above the low-latency size, where ranges are compared): the sender (even
    // rank) names another offset, then another size.
    let n = (1usize << 20) + 16;
    let cases = [
        ("offset", 64usize, n, 128usize, n),
        ("size", 0, n, 0, n + 16),
    ];
    for (what, send_off, send_n, recv_off, recv_n) in cases {
        dst.poison(&cx.stream)?;
        cx.sync()?;
        cx.host_barrier()?;
        let r = if rank % 2 == 0 {
            comm.send_registered(&src.slice(..send_n), peer, dst.at(send_off), &cx.stream)
        } else {
            comm.recv_registered(dst.at(recv_off), recv_n as u64, peer, &cx.stream)
        };
        r.map_err(|e| e.to_string())?;
        let sync = cx.sync();
        let seen = sync
            .err()
            .or_else(|| comm.check().err().map(|e| e.to_string()));
        match seen {
            Some(e) if e.contains("does not match") => {}
            other => {
                return Err(format!(
                    "{what} mismatch: expected ZeroCopyMismatch, got {other:?}"
                ))
            }
        }
        verify(cx, &dst, 0, 0, None, &format!("{what} mismatch"))?;
        cx.host_barrier()?;
    }
    // The next matching call succeeds.
    exchange(cx, &dst, 312_345, 0, 48, false, 951)?;
    exchange(cx, &dst, 2_000_001, 1, 3, true, 952)?;
    Ok(
        "5 bad calls refused before launch; offset and size mismatches reported on both sides with nothing written; later calls verified"
            .into(),
    )
}

/// Ring on 3 or more ranks: send to rank + 1, receive from rank - 1, in one kernel.
pub(crate) fn check_ring(cx: &Ctx) -> Check {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    if world < 3 {
        cx.host_barrier()?;
        return Ok("needs 3 or more ranks".into());
    }
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    let dst = RegBuf::new(cx, 4 << 20)?;
    let mut n = 0;
    for (i, bytes) in [5usize, 65_536, (1 << 20) + 3, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let tag = 960 + i as u64;
        let src = cx
            .stream
            .clone_htod(&cx.data_of(rank, tag, bytes))
            .map_err(|e| e.to_string())?;
        dst.poison(&cx.stream)?;
        cx.sync()?;
        cx.host_barrier()?;
        comm.sendrecv_registered(
            &src,
            next,
            dst.at(7),
            dst.at(7),
            bytes as u64,
            prev,
            &cx.stream,
        )
        .map_err(|e| e.to_string())?;
        cx.sync()?;
        let expect = cx.data_of(prev, tag, bytes);
        verify(
            cx,
            &dst,
            7,
            bytes,
            Some(&expect),
            &format!("ring {bytes} B from {prev}"),
        )?;
        cx.host_barrier()?;
        n += 1;
    }
    Ok(format!(
        "{n} ring steps (send to rank+1, receive from rank-1), 5 B to 3 MiB"
    ))
}

/// Many calls back to back without host synchronisation: sizes cycle, each call lands in its
/// own slice of the destination; the last message of every slice is verified.
pub(crate) fn check_back_to_back(cx: &Ctx, calls: usize) -> Check {
    let Some(peer) = partner(cx) else {
        return cx.host_barrier().map(|_| "no partner".into());
    };
    let rank = cx.comm.rank();
    let slices = 8usize;
    let slice = 2usize << 20;
    let sizes = [8usize, 4099, (1 << 20) + 3, 96];
    let pool = 16usize << 20;
    let dst = RegBuf::new(cx, slices * slice)?;
    let src = cx
        .stream
        .clone_htod(&cx.data_of(rank, 970, pool))
        .map_err(|e| e.to_string())?;
    dst.poison(&cx.stream)?;
    cx.sync()?;
    cx.host_barrier()?;
    let plan = |i: usize| {
        (
            sizes[i % sizes.len()],
            (i * 4097) % (pool - (2 << 20)),
            i % slices,
        )
    };
    for i in 0..calls {
        let (bytes, so, s) = plan(i);
        let at = dst.at(s * slice);
        cx.comm
            .sendrecv_registered(
                &src.slice(so..so + bytes),
                peer,
                at,
                at,
                bytes as u64,
                peer,
                &cx.stream,
            )
            .map_err(|e| e.to_string())?;
    }
    cx.sync()?;
    let got = cx.read_ptr(dst.ptr, slices * slice)?;
    let theirs = cx.data_of(peer, 970, pool);
    for s in 0..slices.min(calls) {
        let last = (0..calls).rev().find(|&i| i % slices == s).unwrap_or(s);
        let (bytes, so, _) = plan(last);
        compare(
            &got[s * slice..s * slice + bytes],
            &theirs[so..so + bytes],
            &format!("call {last} ({bytes} B)"),
        )?;
    }
    cx.host_barrier()?;
    Ok(format!(
        "{calls} zero-copy exchanges back to back (8 B to 1 MiB), the last of each of {slices} slices verified"
    ))
}

/// A captured zero-copy exchange (destination poisoned inside the graph first) replayed many
/// times; every replay verified.
pub(crate) fn check_graph(cx: &Ctx, replays: usize) -> Check {
    let Some(peer) = partner(cx) else {
        return cx.host_barrier().map(|_| "no partner".into());
    };
    let rank = cx.comm.rank();
    let bytes = (1usize << 20) + 40;
    let variants = 4usize;
    let dst = RegBuf::new(cx, bytes + 64)?;
    // No event tracking for these buffers: captured work must record no events.
    // SAFETY: every use of these buffers below is ordered on cx.stream and synchronised.
    unsafe { cx.comm.context().disable_event_tracking() };
    let result = graph_replays(cx, &dst, peer, rank, bytes, variants, replays);
    // SAFETY: restores the default for buffers made later.
    unsafe { cx.comm.context().enable_event_tracking() };
    result
}

fn graph_replays(
    cx: &Ctx,
    dst: &RegBuf<'_>,
    peer: usize,
    rank: usize,
    bytes: usize,
    variants: usize,
    replays: usize,
) -> Check {
    let pool: Vec<CudaSlice<u8>> = (0..variants)
        .map(|v| {
            cx.stream
                .clone_htod(&cx.data_of(rank, 980 + v as u64, bytes))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut src = cx
        .stream
        .alloc_zeros::<u8>(bytes)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    let graph = cx.capture(|| -> Result<(), String> {
        dst.poison(&cx.stream)?;
        let at = dst.at(32);
        cx.comm
            .sendrecv_registered(&src, peer, at, at, bytes as u64, peer, &cx.stream)
            .map_err(|e| e.to_string())
    })?;
    let expects: Vec<Vec<u8>> = (0..variants)
        .map(|v| cx.data_of(peer, 980 + v as u64, bytes))
        .collect();
    for r in 0..replays {
        let v = (r * 3 + 1) % variants;
        cx.stream
            .memcpy_dtod(&pool[v], &mut src)
            .map_err(|e| e.to_string())?;
        cx.sync()?;
        cx.host_barrier()?;
        graph.launch().map_err(|e| e.to_string())?;
        cx.sync()?;
        verify(
            cx,
            dst,
            32,
            bytes,
            Some(&expects[v]),
            &format!("replay {r}"),
        )?;
    }
    cx.host_barrier()?;
    Ok(format!(
        "{replays} replays of a captured zero-copy exchange (1 MiB + 40 B, poisoned in the graph), every one verified"
    ))
}
