//! Checks of the foundation: the context mode, puts with signals, the device barriers,
//! registered user buffers and window churn, on fresh random data with poisoned outputs.

use std::time::Instant;

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use devcomm::testing::DeviceBuffer;

use super::harness::{verified, Check, Checked, Ctx, Outcome, Ranks, Skip};

type Detail = Result<String, String>;

/// The group's checks, in run order.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "context_mode",
        ranks: Ranks::AtLeast(1),
        about: "making the communicator leaves cudarc's single-stream mode",
        run: |cx, _| verified(context_mode(cx)),
    },
    Check {
        name: "capture_tracked",
        ranks: Ranks::AtLeast(1),
        about: "a call on cudarc slices in a graph capture with event tracking on is refused",
        run: |cx, _| capture_tracked(cx),
    },
    Check {
        name: "stream_binding",
        ranks: Ranks::AtLeast(1),
        about: "a call on a stream other than the bound one is refused, nothing enqueued",
        run: |cx, _| verified(stream_binding(cx)),
    },
    Check {
        name: "put_signal",
        ranks: Ranks::AtLeast(2),
        about: "puts with signals into every NVLink peer's window",
        run: |cx, _| put_signal(cx),
    },
    Check {
        name: "barrier",
        ranks: Ranks::AtLeast(2),
        about: "the device barrier, --barrier-iters times in one kernel",
        run: |cx, p| verified(barrier(cx, p.barrier_iters)),
    },
    Check {
        name: "comm_barrier",
        ranks: Ranks::AtLeast(2),
        about: "Comm::barrier 1000 times back to back",
        run: |cx, _| verified(comm_barrier(cx, 1000)),
    },
    Check {
        name: "registered_buffer",
        ranks: Ranks::AtLeast(2),
        about: "user buffers (cuMemAlloc, VMM) read by a peer; pool memory refused",
        run: |cx, _| registered_buffer(cx),
    },
    Check {
        name: "window_churn",
        ranks: Ranks::AtLeast(1),
        about: "--churn window create/destroy cycles leak no device memory",
        run: |cx, p| verified(window_churn(cx, p.churn)),
    },
];

/// With cudarc's event tracking on in multi-stream mode, a call on cudarc slices made while the
/// stream captures a graph is refused with an error that says why, before anything is
/// enqueued (cudarc would wait on the slices' events inside the capture, which CUDA refuses);
/// the stream stays usable.
fn capture_tracked(cx: &Ctx) -> Checked {
    let comm = &cx.comm;
    if !comm.context().is_managing_stream_synchronization() {
        return Ok(Outcome::Skip(Skip::Unavailable(
            "cudarc does not track events on this context (single-stream mode or tracking \
             off): there is nothing to refuse"
                .into(),
        )));
    }
    let buf = cx
        .stream
        .alloc_zeros::<u8>(64)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    let peer = (comm.rank() + 1) % comm.world_size();
    devcomm::testing::begin_capture(&cx.stream).map_err(|e| e.to_string())?;
    let sent = comm.send(&buf, peer, &cx.stream);
    // Nothing was captured: the empty graph (or its absence) is of no interest.
    let _ = devcomm::testing::end_capture(&cx.stream);
    cx.sync()?;
    match sent {
        Err(devcomm::Error::InvalidArgument { reason, .. }) if reason.contains("event tracking") => {
            verified(Ok(format!("refused: {reason}")))
        }
        other => Err(format!(
            "send in a capture with event tracking on: expected a refusal, got {other:?}"
        )),
    }
}

/// The harness binds its stream at start (`Comm::bind_stream`); binding it again is a no-op,
/// and a send on another stream is refused before anything is enqueued.
fn stream_binding(cx: &Ctx) -> Detail {
    let comm = &cx.comm;
    comm.bind_stream(&cx.stream)
        .map_err(|e| format!("binding the bound stream again: {e}"))?;
    let other = comm.context().new_stream().map_err(|e| e.to_string())?;
    let buf = other.alloc_zeros::<u8>(64).map_err(|e| e.to_string())?;
    other.synchronize().map_err(|e| e.to_string())?;
    let peer = (comm.rank() + 1) % comm.world_size();
    let refusals = [
        ("bind_stream", comm.bind_stream(&other)),
        ("send", comm.send(&buf, peer, &other)),
    ];
    for (what, r) in refusals {
        match r {
            Err(devcomm::Error::InvalidArgument { reason, .. }) if reason.contains("bound") => {}
            other => {
                return Err(format!(
                    "{what} on a second stream: expected a refusal naming the bound stream, got \
                     {other:?}"
                ))
            }
        }
    }
    other.synchronize().map_err(|e| e.to_string())?;
    Ok("the bound stream binds again; bind_stream and send on a second stream refused".into())
}

/// devcomm's own streams (copy engine) stay out of cudarc's stream count: a user on one stream
/// keeps single-stream mode, without per-buffer event calls (cuda::InternalStream).
fn context_mode(cx: &Ctx) -> Detail {
    if cx.multi_stream_after_init {
        return Err(
            "making the communicator put the context into cudarc's multi-stream mode".into(),
        );
    }
    Ok("the communicator left the context in single-stream mode".into())
}

fn cfg(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Every rank puts a random block into every peer's window with a signal; every receiver
/// waits for the signals and verifies every byte, at an aligned and an odd size.
fn put_signal(cx: &Ctx) -> Checked {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let module = cx.foundation()?;
    let put = module
        .function("put_signal_all")
        .map_err(|e| e.to_string())?;
    let wait = module.function("wait_all").map_err(|e| e.to_string())?;
    let mut checked = 0usize;
    for (round, bytes) in [
        (1u64, 1usize << 20),
        (2, 12_345),
        (3, 1),
        (4, (3 << 20) + 7),
    ] {
        let win = comm
            .window::<u8>(bytes * world, world)
            .map_err(|e| e.to_string())?;
        // Poison what peers will write.
        let poison = cx
            .stream
            .clone_htod(&vec![0xA5u8; bytes * world])
            .map_err(|e| e.to_string())?;
        cx.copy_to_ptr(win.as_device_ptr(), &poison)?;
        cx.sync()?;
        let src_host = cx.data_of(rank, round, bytes);
        let src = cx.stream.clone_htod(&src_host).map_err(|e| e.to_string())?;
        let status = cx.stream.alloc_zeros::<i32>(1).map_err(|e| e.to_string())?;
        cx.host_barrier()?;
        let handle = win.device_handle();
        let (src_ptr, _g) = src.device_ptr(&cx.stream);
        let mut l = cx.stream.launch_builder(&put);
        let n = bytes as u64;
        l.arg(&handle).arg(&src_ptr).arg(&n).arg(&round);
        // SAFETY: arguments match put_signal_all(DeviceWindow, const void*, u64, u64); the
        // window holds world * bytes, each sender writes its own `bytes`-long region.
        unsafe { l.launch(cfg(4 * world as u32, 256)) }.map_err(|e| e.to_string())?;
        let mut l = cx.stream.launch_builder(&wait);
        l.arg(&handle).arg(&round).arg(&status);
        // SAFETY: wait_all(DeviceWindow, u64, int*): status is a one-element device buffer.
        unsafe { l.launch(cfg(1, 32)) }.map_err(|e| e.to_string())?;
        cx.sync()?;
        let st = cx.stream.clone_dtoh(&status).map_err(|e| e.to_string())?;
        if st[0] != 1 {
            return Err(format!("round {round}: wait_all status {}", st[0]));
        }
        let got = cx.read_ptr(win.as_device_ptr(), bytes * world)?;
        for p in 0..world {
            if p == rank || comm.topology().kind(p) != devcomm::LinkKind::Nvl {
                continue;
            }
            let expect = cx.data_of(p, round, bytes);
            let region = &got[p * bytes..(p + 1) * bytes];
            if let Some(i) = region.iter().zip(&expect).position(|(a, b)| a != b) {
                return Err(format!(
                    "{bytes} B from peer {p}: first wrong byte at {i}: got {:#x}, expected {:#x}",
                    region[i], expect[i]
                ));
            }
            checked += bytes;
        }
        cx.host_barrier()?;
    }
    if checked == 0 {
        return Ok(Outcome::Skip(Skip::Unavailable(
            "no peer is on NVLink: nothing was put".into(),
        )));
    }
    verified(Ok(format!(
        "{checked} bytes verified from {} peers",
        world - 1
    )))
}

/// The cross-rank barrier holds `iters` times in a row inside one kernel.
fn barrier(cx: &Ctx, iters: u64) -> Detail {
    let comm = &cx.comm;
    let module = cx.foundation()?;
    let f = module.function("barrier_loop").map_err(|e| e.to_string())?;
    let win = comm
        .window::<u64>(comm.world_size(), 0)
        .map_err(|e| e.to_string())?;
    let scratch = cx
        .stream
        .alloc_zeros::<u64>(comm.world_size())
        .map_err(|e| e.to_string())?;
    let status = cx.stream.alloc_zeros::<i32>(1).map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    let handle = win.device_handle();
    let t = Instant::now();
    let mut l = cx.stream.launch_builder(&f);
    l.arg(&handle).arg(&iters).arg(&scratch).arg(&status);
    // SAFETY: barrier_loop(DeviceWindow, u64, u64*, int*) with a world-sized window and scratch.
    unsafe { l.launch(cfg(1, 128)) }.map_err(|e| e.to_string())?;
    cx.sync()?;
    let st = cx.stream.clone_dtoh(&status).map_err(|e| e.to_string())?;
    if st[0] != 1 {
        return Err(format!(
            "barrier_loop status {} after {iters} iterations",
            st[0]
        ));
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64;
    cx.host_barrier()?;
    Ok(format!("{iters} iterations, {us:.2} us per barrier"))
}

/// How the user allocated a buffer handed to `Comm::register`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UserAlloc {
    /// `cuMemAlloc` (what `cudaMalloc` does): registered through CUDA IPC.
    MemAlloc,
    /// A `cuMemCreate` + `cuMemMap` virtual-memory allocation: registered through its handle.
    Vmm,
    /// cudarc's default stream-ordered pool: cannot be shared; must be refused on every rank.
    Pool,
}

/// A buffer the user allocated is reachable from a peer's kernel through its handle. With the
/// peer not on NVLink only the registration is checked, and the check is a skip.
fn registered_buffer(cx: &Ctx) -> Checked {
    let mut done = Vec::new();
    for kind in [UserAlloc::MemAlloc, UserAlloc::Vmm, UserAlloc::Pool] {
        done.push(registered_kind(cx, kind)?);
        cx.host_barrier()?;
    }
    let peer = (cx.comm.rank() + 1) % cx.comm.world_size();
    if cx.comm.topology().kind(peer) != devcomm::LinkKind::Nvl {
        return Ok(Outcome::Skip(Skip::Unavailable(format!(
            "peer {peer} is not on NVLink: registration only ({})",
            done.join("; ")
        ))));
    }
    verified(Ok(done.join("; ")))
}

fn registered_kind(cx: &Ctx, kind: UserAlloc) -> Detail {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let bytes = (1usize << 20) + 333;
    let mine = cx
        .stream
        .clone_htod(&cx.data_of(rank, 77, bytes))
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    // Keep whichever allocation backs `ptr` alive until deregistration.
    let mut _pool = None;
    let mut _vmm = None;
    let mut _raw = None;
    let ptr = match kind {
        UserAlloc::MemAlloc => {
            // A plain cuMemAlloc allocation, freed when `_raw` drops, after deregistration.
            let ctx = comm.context();
            let b = DeviceBuffer::zeroed(ctx, bytes).map_err(|e| e.to_string())?;
            devcomm::testing::synchronize(ctx).map_err(|e| e.to_string())?;
            let p = b.ptr();
            _raw = Some(b);
            p
        }
        UserAlloc::Vmm => {
            use devcomm::testing::{Mapping, PhysicalMemory};
            let phys = PhysicalMemory::create(comm.context(), bytes).map_err(|e| e.to_string())?;
            let map =
                Mapping::new(comm.context(), &phys, phys.bytes()).map_err(|e| e.to_string())?;
            let p = map.ptr();
            _vmm = Some((phys, map));
            p
        }
        UserAlloc::Pool => {
            let s: CudaSlice<u8> = cx.stream.alloc_zeros(bytes).map_err(|e| e.to_string())?;
            let p = {
                let (p, _g) = s.device_ptr(&cx.stream);
                p
            };
            _pool = Some(s);
            p
        }
    };
    cx.copy_to_ptr(ptr, &mine)?;
    // SAFETY: whichever allocation backs `ptr` (`_raw`, `_vmm`, `_pool`) holds `bytes` and
    // is dropped after the registration (released below, or dropped inside the closure).
    let registered = unsafe { comm.register(ptr, bytes) };
    let result = (|| -> Detail {
        let registration = match (kind, registered) {
            (UserAlloc::Pool, Err(e)) if e.to_string().contains("pool") => {
                return Ok("pool memory refused on every rank with a clear error".into());
            }
            (UserAlloc::Pool, r) => {
                return Err(format!("pool memory: expected a refusal, got {r:?}"))
            }
            (_, r) => r.map_err(|e| e.to_string())?,
        };
        let peer = (rank + 1) % world;
        let reachable = comm.topology().kind(peer) == devcomm::LinkKind::Nvl;
        let module = cx.foundation()?;
        let f = module
            .function("read_registered")
            .map_err(|e| e.to_string())?;
        let mut dst = cx
            .stream
            .clone_htod(&vec![0x5Au8; bytes])
            .map_err(|e| e.to_string())?;
        cx.sync()?;
        if reachable {
            let mut l = cx.stream.launch_builder(&f);
            let peer_i = peer as i32;
            let n = bytes as u64;
            let handle = registration.device_handle();
            l.arg(&handle).arg(&peer_i).arg(&mut dst).arg(&n);
            // SAFETY: read_registered(const RegisteredBuffer*, int, void*, u64); dst holds bytes.
            unsafe { l.launch(cfg(8, 256)) }.map_err(|e| e.to_string())?;
        }
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
        cx.host_barrier()?;
        registration.release().map_err(|e| e.to_string())?;
        if !reachable {
            return Ok(format!(
                "{kind:?}: peer {peer} not on NVLink; registration only"
            ));
        }
        let expect = cx.data_of(peer, 77, bytes);
        match got.iter().zip(&expect).position(|(a, b)| a != b) {
            Some(i) => Err(format!(
                "{kind:?}: byte {i} from peer {peer}: {:#x} != {:#x}",
                got[i], expect[i]
            )),
            None => Ok(format!(
                "{kind:?}: {bytes} bytes read from peer {peer}'s registered buffer"
            )),
        }
    })();
    result
}

/// `Comm::barrier` (the public API) enqueued many times in a row completes on every rank.
fn comm_barrier(cx: &Ctx, n: usize) -> Detail {
    // One call first, so the kernel's compile and load stay out of the time.
    cx.comm.barrier(&cx.stream).map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    let t = Instant::now();
    for _ in 0..n {
        cx.comm.barrier(&cx.stream).map_err(|e| e.to_string())?;
    }
    cx.sync()?;
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    cx.host_barrier()?;
    Ok(format!(
        "{n} Comm::barrier calls back to back, {us:.2} us each"
    ))
}

/// 100 window creations and destructions leave device memory where it was.
fn window_churn(cx: &Ctx, cycles: usize) -> Detail {
    let comm = &cx.comm;
    let len = 64usize << 20;
    // One cycle first so that lazily created driver state is not counted as a leak.
    drop(comm.window::<u8>(len, 16).map_err(|e| e.to_string())?);
    // Free memory is the device's: every rank measures at the same quiet point (ranks that
    // share a GPU, DEVCOMM_SHARE_GPU, would otherwise count each other's windows).
    cx.sync()?;
    cx.host_barrier()?;
    let (free_before, _) = comm.context().mem_get_info().map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    for _ in 0..cycles {
        let w = comm.window::<u8>(len, 16).map_err(|e| e.to_string())?;
        drop(w);
    }
    cx.sync()?;
    cx.host_barrier()?;
    let (free_after, _) = comm.context().mem_get_info().map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    let lost = free_before.saturating_sub(free_after);
    if lost > 4 << 20 {
        return Err(format!(
            "{cycles} cycles of a 64 MiB window lost {} KiB",
            lost >> 10
        ));
    }
    Ok(format!(
        "{cycles} cycles of a 64 MiB window; free memory changed by {} KiB",
        lost >> 10
    ))
}
