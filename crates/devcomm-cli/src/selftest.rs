//! `devcomm selftest`: checks the device operations on the GPUs against host references, on
//! fresh random data with poisoned outputs, and prints a pass/fail table (rank 0).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use devcomm::jit::KernelSpec;
use devcomm::{Comm, DeviceWindow, Error};
use rand::{RngCore, SeedableRng};

/// Arguments of `devcomm selftest`.
#[derive(Debug, clap::Args)]
pub struct SelftestArgs {
    /// Run only the checks whose names contain this text.
    #[arg(long)]
    only: Option<String>,
    /// Iterations of the cross-rank barrier check.
    #[arg(long, default_value_t = 10_000)]
    barrier_iters: u64,
    /// Window create/destroy cycles of the leak check.
    #[arg(long, default_value_t = 100)]
    churn: usize,
    /// Back-to-back send/recv calls of the stress check.
    #[arg(long, default_value_t = 10_000)]
    calls: usize,
    /// Back-to-back all-to-all-v calls of the collective stress check.
    #[arg(long, default_value_t = 500)]
    coll_calls: usize,
    /// Replays of the captured send/recv and all-to-all-v graphs.
    #[arg(long, default_value_t = 1_000)]
    replays: usize,
    /// Device timeout used by the timeout check, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    timeout_ms: u64,
}

/// One check's outcome on one rank.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Outcome {
    name: String,
    passed: bool,
    detail: String,
    seconds: f64,
}

type CheckResult = Result<String, String>;

/// Context shared by the checks.
pub(crate) struct Ctx {
    pub(crate) comm: Comm,
    /// Host barriers are named after the running check and counted within it, so a rank that
    /// leaves a check early cannot shift the names of every later barrier.
    phase: std::cell::RefCell<(String, u64)>,
    pub(crate) stream: Arc<CudaStream>,
    /// Agreed by all ranks, fresh each run: data are derived from it.
    pub(crate) seed: u64,
    /// Whether the context was in cudarc's multi-stream mode right after the communicator was
    /// made (before this context made its own stream): devcomm must leave it out.
    multi_stream_after_init: bool,
}

impl Ctx {
    pub(crate) fn new() -> Result<Self, String> {
        let comm = Comm::from_env().map_err(|e| e.to_string())?;
        let multi_stream_after_init = comm.context().is_in_multi_stream_mode();
        let stream = comm.context().new_stream().map_err(|e| e.to_string())?;
        let mine = rand::random::<u64>().to_le_bytes();
        let all = comm
            .store()
            .all_gather("__devcomm_cli/seed", &mine, comm.setup_timeout())
            .map_err(|e| e.to_string())?;
        let seed = u64::from_le_bytes(all[0][..8].try_into().map_err(|_| "bad seed")?);
        Ok(Self {
            comm,
            stream,
            seed,
            multi_stream_after_init,
            phase: std::cell::RefCell::new(("start".into(), 0)),
        })
    }

    /// Deterministic bytes for (sender, tag): every rank can regenerate any sender's data.
    pub(crate) fn data_of(&self, sender: usize, tag: u64, len: usize) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(
            self.seed ^ (sender as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ tag.rotate_left(17),
        );
        let mut v = vec![0u8; len];
        rng.fill_bytes(&mut v);
        v
    }

    pub(crate) fn foundation(&self) -> Result<Arc<devcomm::jit::LoadedModule>, String> {
        self.comm
            .jit()
            .load(self.comm.context(), &KernelSpec::foundation())
            .map_err(|e| e.to_string())
    }

    /// Copies a device slice to a raw device address (e.g. a window's data) and waits.
    pub(crate) fn copy_to_ptr(&self, dst: u64, src: &CudaSlice<u8>) -> Result<(), String> {
        let (sp, _g) = src.device_ptr(&self.stream);
        devcomm::cuda::memcpy_dtod_async(dst, sp, src.len(), &self.stream)
            .map_err(|e| e.to_string())?;
        self.sync()
    }

    /// Captures what `work` enqueues on this stream into a CUDA graph (thread-local capture
    /// mode). Capture always ends, so an error from `work` leaves the stream usable.
    pub(crate) fn capture<E: std::fmt::Display>(
        &self,
        work: impl FnOnce() -> Result<(), E>,
    ) -> Result<cudarc::driver::CudaGraph, String> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| e.to_string())?;
        let captured = work();
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .map_err(|e| e.to_string())?;
        captured.map_err(|e| e.to_string())?;
        graph.ok_or_else(|| "capture produced no graph".to_owned())
    }

    /// Reads `bytes` at a raw device address back to the host.
    pub(crate) fn read_ptr(&self, src: u64, bytes: usize) -> Result<Vec<u8>, String> {
        let mut tmp = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| e.to_string())?;
        {
            let (dp, _g) = tmp.device_ptr_mut(&self.stream);
            devcomm::cuda::memcpy_dtod_async(dp, src, bytes, &self.stream)
                .map_err(|e| e.to_string())?;
        }
        self.stream.clone_dtoh(&tmp).map_err(|e| e.to_string())
    }

    pub(crate) fn sync(&self) -> Result<(), String> {
        self.comm
            .synchronize(&self.stream)
            .map_err(|e| e.to_string())
    }

    pub(crate) fn host_barrier(&self) -> Result<(), String> {
        let tag = {
            let mut phase = self.phase.borrow_mut();
            phase.1 += 1;
            format!("__devcomm_cli/{}/{}", phase.0, phase.1)
        };
        self.comm
            .store()
            .barrier(&tag, self.comm.setup_timeout())
            .map_err(|e| e.to_string())
    }

    /// Starts a new phase (a check): every rank enters it together, whatever happened before.
    pub(crate) fn enter_phase(&self, name: &str) -> Result<(), String> {
        *self.phase.borrow_mut() = (name.to_owned(), 0);
        let tag = format!("__devcomm_cli/{name}/enter");
        self.comm
            .store()
            .barrier(&tag, self.comm.setup_timeout())
            .map_err(|e| e.to_string())
    }
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
fn check_put_signal(cx: &Ctx) -> CheckResult {
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
    Ok(format!("{checked} bytes verified from {} peers", world - 1))
}

/// The cross-rank barrier holds `iters` times in a row inside one kernel.
fn check_barrier(cx: &Ctx, iters: u64) -> CheckResult {
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

/// A buffer the user allocated is reachable from a peer's kernel through its handle.
fn check_registered(cx: &Ctx) -> CheckResult {
    let mut done = Vec::new();
    for kind in [UserAlloc::MemAlloc, UserAlloc::Vmm, UserAlloc::Pool] {
        done.push(check_registered_kind(cx, kind)?);
        cx.host_barrier()?;
    }
    Ok(done.join("; "))
}

fn check_registered_kind(cx: &Ctx, kind: UserAlloc) -> CheckResult {
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
    let mut raw = None;
    let ptr = match kind {
        UserAlloc::MemAlloc => {
            // SAFETY: a plain allocation of `bytes`, freed below after deregistration.
            let p =
                unsafe { cudarc::driver::result::malloc_sync(bytes) }.map_err(|e| e.to_string())?;
            raw = Some(p);
            p
        }
        UserAlloc::Vmm => {
            use devcomm::cuda::vmm::{Mapping, PhysicalMemory};
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
    let registered = comm.register(ptr, bytes);
    let result = (|| -> CheckResult {
        let handle = match (kind, registered) {
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
            l.arg(&handle).arg(&peer_i).arg(&mut dst).arg(&n);
            // SAFETY: read_registered(const RegisteredBuffer*, int, void*, u64); dst holds bytes.
            unsafe { l.launch(cfg(8, 256)) }.map_err(|e| e.to_string())?;
        }
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
        cx.host_barrier()?;
        comm.deregister(handle).map_err(|e| e.to_string())?;
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
    if let Some(p) = raw {
        // SAFETY: allocated above with malloc_sync, deregistered (or never registered) and no
        // kernel uses it any more (the stream was synchronised).
        unsafe { cudarc::driver::result::free_sync(p) }.map_err(|e| e.to_string())?;
    }
    result
}

/// `Comm::barrier` (the public API) enqueued many times in a row completes on every rank.
fn check_comm_barrier(cx: &Ctx, n: usize) -> CheckResult {
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
fn check_churn(cx: &Ctx, cycles: usize) -> CheckResult {
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

/// A wait on a signal that never comes returns an error naming the peer within the timeout.
fn check_timeout(cx: &Ctx, timeout: Duration) -> CheckResult {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let module = cx.foundation()?;
    let f = module.function("wait_forever").map_err(|e| e.to_string())?;
    let win = comm.window::<u8>(64, 4).map_err(|e| e.to_string())?;
    let status = cx.stream.alloc_zeros::<i32>(1).map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    let mut handle: DeviceWindow = win.device_handle();
    handle.timeout_ns = timeout.as_nanos() as u64;
    let peer = ((rank + 1) % world) as i32;
    let slot = 3u64;
    let t = Instant::now();
    let mut l = cx.stream.launch_builder(&f);
    l.arg(&handle).arg(&peer).arg(&slot).arg(&status);
    // SAFETY: wait_forever(DeviceWindow, int, u64, int*); slot 3 < 4 user slots.
    unsafe { l.launch(cfg(1, 32)) }.map_err(|e| e.to_string())?;
    let err = cx.sync().err();
    let waited = t.elapsed();
    let e = match comm.check() {
        Err(e @ Error::Aborted { .. }) | Err(e @ Error::PeerTimeout { .. }) => e.to_string(),
        Err(other) => return Err(format!("unexpected error: {other}")),
        Ok(()) => return Err(format!("no error after {waited:?} (sync: {err:?})")),
    };
    if !e.contains(&format!("peer {peer}")) {
        return Err(format!("error does not name peer {peer}: {e}"));
    }
    if waited > timeout + Duration::from_secs(5) {
        return Err(format!("took {waited:?} for a {timeout:?} timeout"));
    }
    Ok(format!("returned after {:.2} s: {e}", waited.as_secs_f64()))
}

/// devcomm's own streams (copy engine) stay out of cudarc's stream count: a user on one stream
/// keeps single-stream mode, without per-buffer event calls (cuda::InternalStream).
fn check_context_mode(cx: &Ctx) -> CheckResult {
    if cx.multi_stream_after_init {
        return Err(
            "making the communicator put the context into cudarc's multi-stream mode".into(),
        );
    }
    Ok("the communicator left the context in single-stream mode".into())
}

/// Runs the checks on every rank and prints the table on rank 0.
pub fn run(args: &SelftestArgs) -> Result<i32, String> {
    let cx = Ctx::new()?;
    let wanted = |name: &str| args.only.as_deref().is_none_or(|o| name.contains(o));
    let mut outcomes = Vec::new();
    let mut run_one = |name: &str, f: &dyn Fn(&Ctx) -> CheckResult| {
        if !wanted(name) {
            return;
        }
        if let Err(e) = cx.enter_phase(name) {
            eprintln!("{name}: ranks did not meet: {e}");
        }
        let t = Instant::now();
        let r = f(&cx);
        let seconds = t.elapsed().as_secs_f64();
        let (passed, detail) = match r {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        eprintln!(
            "{name}: {} ({detail})",
            if passed { "pass" } else { "FAIL" }
        );
        outcomes.push(Outcome {
            name: name.to_owned(),
            passed,
            detail,
            seconds,
        });
    };
    run_one("context_mode", &check_context_mode);
    run_one("put_signal", &check_put_signal);
    run_one("barrier", &|cx| check_barrier(cx, args.barrier_iters));
    run_one("comm_barrier", &|cx| check_comm_barrier(cx, 1000));
    run_one("registered_buffer", &check_registered);
    run_one("window_churn", &|cx| check_churn(cx, args.churn));
    run_one("sendrecv_guard", &crate::selftest_p2p::check_guard);
    run_one("sendrecv_sizes", &crate::selftest_p2p::check_sizes);
    run_one("sendrecv_types", &crate::selftest_p2p::check_types);
    run_one("sendrecv_ring", &crate::selftest_p2p::check_ring);
    run_one("sendrecv_back_to_back", &|cx| {
        crate::selftest_p2p::check_back_to_back(cx, args.calls)
    });
    run_one("sendrecv_pull", &|cx| {
        crate::selftest_p2p::check_pull(cx, args.calls)
    });
    run_one("sendrecv_ll128", &|cx| {
        crate::selftest_p2p::check_ll128(cx, args.calls)
    });
    run_one("sendrecv_copy_engine", &|cx| {
        crate::selftest_p2p::check_copy_engine(cx, args.calls)
    });
    run_one(
        "sendrecv_negotiated",
        &crate::selftest_p2p::check_negotiated,
    );
    run_one("sendrecv_graph", &|cx| {
        crate::selftest_p2p::check_graph(cx, args.replays)
    });
    run_one("all_gather_ring", &crate::selftest_p2p::check_all_gather);
    run_one("zc_sizes", &crate::selftest_zc::check_sizes);
    run_one("zc_errors", &crate::selftest_zc::check_errors);
    run_one("zc_ring", &crate::selftest_zc::check_ring);
    run_one("zc_back_to_back", &|cx| {
        crate::selftest_zc::check_back_to_back(cx, args.calls)
    });
    run_one("zc_graph", &|cx| {
        crate::selftest_zc::check_graph(cx, args.replays)
    });
    run_one("zc_all_to_all", &crate::selftest_zc::check_all_to_all);
    run_one("a2a_sizes", &crate::selftest_coll::check_all_to_all);
    run_one("a2av_counts", &crate::selftest_coll::check_all_to_allv);
    run_one("a2a_examples", &crate::selftest_coll::check_examples);
    run_one("a2a_tiles", &crate::selftest_coll::check_tiles);
    run_one("a2a_mixed_kinds", &crate::selftest_coll::check_mixed_kinds);
    run_one("a2a_late_loader", &crate::selftest_coll::check_late_loader);
    run_one("a2av_back_to_back", &|cx| {
        crate::selftest_coll::check_back_to_back(cx, args.coll_calls)
    });
    run_one("a2av_graph", &|cx| {
        crate::selftest_coll::check_graph(cx, args.replays)
    });
    run_one("a2av_overflow", &crate::selftest_coll::check_overflow);
    crate::selftest_reduce::run_all(&mut run_one, args.calls, args.replays);
    // Last: a timeout leaves the communicator aborted.
    run_one("wait_timeout", &|cx| {
        check_timeout(cx, Duration::from_millis(args.timeout_ms))
    });
    report(&cx, &outcomes)
}

fn report(cx: &Ctx, outcomes: &[Outcome]) -> Result<i32, String> {
    let blob = serde_json::to_vec(outcomes).map_err(|e| e.to_string())?;
    let all = cx
        .comm
        .store()
        .all_gather("__devcomm_cli/selftest", &blob, cx.comm.setup_timeout())
        .map_err(|e| e.to_string())?;
    let per_rank: Vec<Vec<Outcome>> = all
        .iter()
        .map(|b| serde_json::from_slice(b).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let failed = per_rank.iter().flatten().any(|o| !o.passed);
    if cx.comm.rank() == 0 {
        println!(
            "\n{:<22} {}",
            "check",
            (0..per_rank.len())
                .map(|r| format!("rank{r:<3}"))
                .collect::<String>()
        );
        for (i, o) in outcomes.iter().enumerate() {
            let cells: String = per_rank
                .iter()
                .map(|rs| match rs.get(i) {
                    Some(x) if x.passed => "pass    ".to_owned(),
                    Some(_) => "FAIL    ".to_owned(),
                    None => "-       ".to_owned(),
                })
                .collect();
            println!("{:<22} {cells} {}", o.name, o.detail);
        }
        for (r, rs) in per_rank.iter().enumerate() {
            for o in rs.iter().filter(|o| !o.passed) {
                println!("rank {r} {}: {}", o.name, o.detail);
            }
        }
        println!(
            "{}",
            if failed {
                "SELFTEST FAILED"
            } else {
                "SELFTEST PASSED"
            }
        );
    }
    Ok(if failed { 1 } else { 0 })
}
