//! The object a user holds: joins the process group, discovers the topology, owns the kernel
//! cache, and creates windows and registrations.

pub mod raw;
mod reduce_ops;
mod zero_copy;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use devcomm_bootstrap::{RankInfo, Store};

use crate::collective::{
    AllToAllVCounts, CollCall, CollShape, Collective, Hooks, MODE_DEVICE_COUNTS, MODE_PEER_ROWS,
    MODE_UNIFORM,
};
use crate::cuda::info::DeviceInfo;
use crate::cuda::ErrorState;
use crate::error::{CudaResultExt, Error, Result};
use crate::group::Group;
use crate::jit::{Jit, KernelSpec};
use crate::memory::Registry;
use crate::p2p::{P2PConfig, P2PLimits, Transfer, TuneTable, P2P, TUNE_FILE_ENV};
use crate::topology::Topology;
use crate::window::Window;

pub use zero_copy::RegisteredRange;

/// Environment variable: bound of every device wait, in milliseconds (default 10,000).
pub const TIMEOUT_ENV: &str = "DEVCOMM_TIMEOUT_MS";
/// Environment variable: bound of every host setup step, in milliseconds (default 120,000).
pub const SETUP_TIMEOUT_ENV: &str = "DEVCOMM_SETUP_TIMEOUT_MS";

const DEFAULT_DEVICE_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_SETUP_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds a [`Comm`] with explicit settings. [`Comm::from_env`] is the usual way in.
#[derive(Debug, Clone)]
pub struct CommBuilder {
    info: RankInfo,
    device: Option<usize>,
    device_timeout: Duration,
    setup_timeout: Duration,
    p2p_limits: P2PLimits,
    /// Whether `p2p_limits.max_blocks` was asked for (builder or environment) rather than the
    /// default, which is lowered to fit a GPU with few SMs (`p2p::fit_to_sms`).
    p2p_max_blocks_explicit: bool,
    tune: Option<TuneTable>,
}

impl CommBuilder {
    /// Starts from an explicit rank description; timeouts come from the environment or defaults.
    pub fn new(info: RankInfo) -> Result<Self> {
        Ok(Self {
            info,
            device: None,
            device_timeout: duration_env(TIMEOUT_ENV, DEFAULT_DEVICE_TIMEOUT)?,
            setup_timeout: duration_env(SETUP_TIMEOUT_ENV, DEFAULT_SETUP_TIMEOUT)?,
            p2p_limits: p2p_limits_env()?,
            p2p_max_blocks_explicit: std::env::var_os(P2P_MAX_BLOCKS_ENV).is_some(),
            tune: match std::env::var_os(TUNE_FILE_ENV) {
                Some(path) => Some(TuneTable::load(std::path::Path::new(&path))?),
                None => None,
            },
        })
    }

    /// The CUDA device ordinal to use (default: the local rank).
    pub fn device(mut self, ordinal: usize) -> Self {
        self.device = Some(ordinal);
        self
    }

    /// Bound of every device wait. A wait that expires makes the host call return
    /// [`Error::PeerTimeout`] naming the peer, and the communicator must be rebuilt.
    pub fn device_timeout(mut self, timeout: Duration) -> Self {
        self.device_timeout = timeout;
        self
    }

    /// Bound of every host setup step (joining, exchanging handles, agreements).
    pub fn setup_timeout(mut self, timeout: Duration) -> Self {
        self.setup_timeout = timeout;
        self
    }

    /// The send/recv tuning table (as `devcomm tune` writes it; default: the file named by
    /// [`TUNE_FILE_ENV`], if set). Every rank must pass the same table: `build` checks it
    /// against the GPU and the window, and compares it across ranks.
    pub fn tune_table(mut self, table: Option<TuneTable>) -> Self {
        self.tune = table;
        self
    }

    /// Sizes of the send/recv window (staging slots, depth, blocks); every rank must pass the
    /// same values. A `max_blocks` whose launches cannot all be resident on the smallest GPU
    /// of the group makes `build` fail (the default is lowered to fit instead).
    pub fn p2p_limits(mut self, limits: P2PLimits) -> Self {
        self.p2p_limits = limits;
        self.p2p_max_blocks_explicit = true;
        self
    }

    /// Collective: joins the group, opens the GPU, discovers the topology and creates the
    /// communicator's control window. Every rank gets the communicator or an error.
    pub fn build(self) -> Result<Comm> {
        let rank = self.info.rank;
        let store = Store::connect(&self.info, self.setup_timeout)?;
        let ordinal = match self.device {
            Some(d) => Ok(d),
            None => CudaContext::device_count()
                .cuda(rank as i32, "cuDeviceGetCount")
                .and_then(|count| {
                    default_ordinal(self.info.local_rank, count, crate::topology::share_gpu())
                }),
        };
        // Every rank's outcome goes through the agreement, so a rank that cannot open its GPU
        // fails the others at once instead of leaving them to time out.
        let opened = ordinal
            .and_then(|o| CudaContext::new(o).cuda(rank as i32, "cuCtxCreate (CudaContext::new)"));
        let ctx = agree_on_store(&store, "open device", rank, opened, self.setup_timeout)?;
        let device = agree_on_store(
            &store,
            "query device",
            rank,
            DeviceInfo::query(&ctx).map_err(|e| crate::cuda::with_rank(e, rank)),
            self.setup_timeout,
        )?;
        // The send/recv window is sized for the GPU with the fewest SMs (an MPS share, say).
        let sms = store.all_gather(
            "__devcomm/p2p/sm_count",
            &device.sm_count.to_le_bytes(),
            self.setup_timeout,
        )?;
        let fewest_sms = sms
            .iter()
            .filter_map(|b| Some(i32::from_le_bytes(b.get(..4)?.try_into().ok()?)))
            .min()
            .unwrap_or(device.sm_count)
            .max(0) as u32;
        let p2p_limits = agree_on_store(
            &store,
            "send/recv window",
            rank,
            crate::p2p::fit_to_sms(self.p2p_limits, self.p2p_max_blocks_explicit, fewest_sms),
            self.setup_timeout,
        )?;
        if p2p_limits != self.p2p_limits {
            log::info!(
                "rank {rank}: send/recv uses at most {} blocks per direction ({} SMs on the \
                 smallest GPU of the group)",
                p2p_limits.max_blocks,
                fewest_sms
            );
        }
        let tune = agree_on_store(
            &store,
            "tuning table",
            rank,
            match &self.tune {
                Some(t) => t
                    .validate(&p2p_limits, &device.name)
                    .map(|()| Some(t.clone())),
                None => Ok(None),
            },
            self.setup_timeout,
        )?;
        same_table_everywhere(&store, rank, tune.as_ref(), self.setup_timeout)?;
        let topology = Topology::discover(
            rank,
            self.info.world_size,
            &store,
            &ctx,
            &device,
            self.setup_timeout,
        )?;
        let errors = agree_on_store(
            &store,
            "error state",
            rank,
            ErrorState::new(&ctx, rank),
            self.setup_timeout,
        )?;
        let group = Arc::new(Group::new(
            rank,
            self.info.world_size,
            store,
            ctx,
            topology,
            errors,
            self.device_timeout,
            self.setup_timeout,
        ));
        let control = Window::<u64>::new(&group, group.world_size, 0)?;
        let p2p = P2P::new(&group, p2p_limits, tune)?;
        let coll = Collective::new(&group, device.sm_count)?;
        let reduce = crate::reduce::launch::Reduce::new(&group, device.sm_count)?;
        let comm = Comm {
            p2p,
            coll,
            reduce,
            local_rank: self.info.local_rank,
            device,
            jit: Jit::new(),
            registry: Registry::new(),
            control,
            barrier_fn: std::sync::OnceLock::new(),
            barrier_gate: crate::group::KernelGate::new("comm-barrier", group.world_size),
            group,
        };
        log::debug!("rank {rank}: communicator ready on {}", comm.device.name);
        Ok(comm)
    }
}

/// The device a rank opens when the builder names none, where `count` GPUs are visible: its
/// local rank, or with [`crate::topology::SHARE_GPU_ENV`] the local rank modulo `count`.
fn default_ordinal(local_rank: usize, count: i32, share: bool) -> Result<usize> {
    let count = usize::try_from(count).unwrap_or(0);
    if count == 0 {
        return Err(Error::InvalidArgument {
            op: "Comm",
            reason: "no GPU is visible".into(),
        });
    }
    if share {
        return Ok(local_rank % count);
    }
    if local_rank >= count {
        return Err(Error::InvalidArgument {
            op: "Comm",
            reason: format!(
                "LOCAL_RANK {local_rank} opens GPU {local_rank}, but {count} GPU(s) are visible: \
                 start at most one rank per GPU, or set {}=1 to run several ranks on one GPU for \
                 functional tests (docs/TESTING.md)",
                crate::topology::SHARE_GPU_ENV
            ),
        });
    }
    Ok(local_rank)
}

/// Fails on every rank unless every rank loaded the same tuning table (or none): sender and
/// receiver of a message must pick the same configuration from it.
fn same_table_everywhere(
    store: &Store,
    rank: usize,
    table: Option<&TuneTable>,
    timeout: Duration,
) -> Result<()> {
    let mine = table.map_or_else(Vec::new, |t| t.fingerprint().to_vec());
    let all = store.all_gather("__devcomm/tune/fingerprint", &mine, timeout)?;
    let failures: Vec<(usize, String)> = all
        .iter()
        .enumerate()
        .filter(|(_, f)| **f != all[0])
        .map(|(r, f)| {
            let what = if f.is_empty() {
                "no tuning table"
            } else {
                "another tuning table"
            };
            (
                r,
                format!("{what} than rank 0 (set {TUNE_FILE_ENV} alike on every rank)"),
            )
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        log::debug!("rank {rank}: tuning tables differ: {failures:?}");
        Err(Error::Setup {
            step: "tuning table".into(),
            failures,
        })
    }
}

/// Agreement before the `Group` exists (same protocol as `Group::agree`).
fn agree_on_store<T>(
    store: &Store,
    step: &str,
    rank: usize,
    local: Result<T>,
    timeout: Duration,
) -> Result<T> {
    let agreed = crate::group::agree_on(
        store,
        &format!("__devcomm/agree/{step}"),
        step,
        local,
        timeout,
    );
    if let Err(Error::Setup { failures, .. }) = &agreed {
        log::debug!("rank {rank}: step {step} failed somewhere: {failures:?}");
    }
    agreed
}

/// Environment variables that size the send/recv window (every rank must see the same).
pub const P2P_SLOT_KIB_ENV: &str = "DEVCOMM_P2P_SLOT_KIB";
/// Staging slots per channel.
pub const P2P_DEPTH_ENV: &str = "DEVCOMM_P2P_DEPTH";
/// Most blocks per direction of a send/recv launch (1 to 64, default 32): the channels, their
/// staging and signals, and the low-latency credit slots scale with it. For experiments; set
/// it alike on every rank.
pub const P2P_MAX_BLOCKS_ENV: &str = "DEVCOMM_P2P_MAX_BLOCKS";

fn p2p_limits_env() -> Result<P2PLimits> {
    let mut limits = P2PLimits::default();
    // A variable's value if set: a number in `lo..=hi` (`unit` names it in the error).
    let parse = |var: &'static str, lo: u64, hi: u64, unit: &str| -> Result<Option<u64>> {
        let Ok(v) = std::env::var(var) else {
            return Ok(None);
        };
        let n = v
            .trim()
            .parse::<u64>()
            .map_err(|_| Error::InvalidArgument {
                op: "Comm",
                reason: format!("{var}={v:?} is not a number"),
            })?;
        if !(lo..=hi).contains(&n) {
            return Err(Error::InvalidArgument {
                op: "Comm",
                reason: format!("{var}={n}: use {lo} to {hi}{unit}"),
            });
        }
        Ok(Some(n))
    };
    if let Some(kib) = parse(P2P_SLOT_KIB_ENV, 1, 1024, " KiB")? {
        limits.slot_bytes = kib << 10;
    }
    if let Some(depth) = parse(P2P_DEPTH_ENV, 2, 16, "")? {
        limits.depth = depth as u32;
    }
    if let Some(blocks) = parse(P2P_MAX_BLOCKS_ENV, 1, 64, "")? {
        limits.max_blocks = blocks as u32;
    }
    Ok(limits)
}

fn duration_env(var: &'static str, default: Duration) -> Result<Duration> {
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| Error::InvalidArgument {
                op: "Comm",
                reason: format!("{var}={v:?} is not milliseconds"),
            }),
        Err(_) => Ok(default),
    }
}

/// A communicator: one per process, one GPU per process.
#[derive(Debug)]
pub struct Comm {
    local_rank: usize,
    device: DeviceInfo,
    jit: Jit,
    registry: Registry,
    control: Window<u64>,
    /// The barrier kernel, loaded on first use.
    barrier_fn: std::sync::OnceLock<cudarc::driver::CudaFunction>,
    /// Every rank has loaded the barrier kernel (see `group::KernelGate`).
    barrier_gate: crate::group::KernelGate,
    p2p: P2P,
    coll: Collective,
    /// The reductions' window, counters and kernels (`reduce::launch`).
    reduce: crate::reduce::launch::Reduce,
    // Dropped last: windows and registrations above release their mappings first.
    group: Arc<Group>,
}

const BARRIER_KERNEL: &str = r#"
#include "devcomm/devcomm.cuh"
extern "C" __global__ void devcomm_comm_barrier(devcomm::DeviceWindow w) {
  devcomm::barrier(devcomm::Block{}, w);
}
"#;

impl Comm {
    /// Joins the group described by the torchrun-style environment
    /// (`RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT`).
    pub fn from_env() -> Result<Self> {
        CommBuilder::new(RankInfo::from_env()?)?.build()
    }

    /// A builder for explicit settings.
    pub fn builder(info: RankInfo) -> Result<CommBuilder> {
        CommBuilder::new(info)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.group.world_size
    }

    /// Rank among this host's processes.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The link kind of every peer.
    pub fn topology(&self) -> &Topology {
        &self.group.topology
    }

    /// This rank's GPU.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.device
    }

    /// This rank's CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.group.ctx
    }

    /// The kernel compiler and cache.
    pub fn jit(&self) -> &Jit {
        &self.jit
    }

    /// The bound of device waits.
    pub fn device_timeout(&self) -> Duration {
        self.group.device_timeout
    }

    /// Collective: a symmetric window of `len` elements and `signal_count` user signal slots
    /// on every rank.
    pub fn window<T: DeviceRepr>(&self, len: usize, signal_count: usize) -> Result<Window<T>> {
        Window::new(&self.group, len, signal_count)
    }

    /// Collective: registers a buffer the user allocated (`cuMemAlloc`/`cudaMalloc` memory or
    /// a `cuMem` virtual-memory allocation) so that peers' kernels can reach it. Returns the
    /// device address of its `RegisteredBuffer` struct.
    pub fn register(&self, ptr: u64, bytes: usize) -> Result<u64> {
        self.registry.register(&self.group, ptr, bytes)
    }

    /// Collective: releases a registration made by [`Comm::register`]. The user may free the
    /// buffer once this returns.
    pub fn deregister(&self, handle: u64) -> Result<()> {
        self.registry.deregister(&self.group, handle)
    }

    /// The peer's address of a registered buffer as mapped here, or `None` without NVLink or
    /// for an unknown handle.
    pub fn registered_nvlink_address(&self, handle: u64, peer: usize) -> Option<u64> {
        self.registry.get_nvlink_address(handle, peer)
    }

    /// Enqueues a barrier across all ranks on `stream`: kernels after it on any rank start only
    /// once every rank's work before it has finished. Bounded like every device wait.
    pub fn barrier(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.check()?;
        let func = match self.barrier_fn.get() {
            Some(f) => f.clone(),
            None => {
                let spec = KernelSpec::new("devcomm_comm_barrier", BARRIER_KERNEL)
                    .name_expression("devcomm_comm_barrier");
                let module = self.jit.load(self.context(), &spec)?;
                let f = module.function("devcomm_comm_barrier")?;
                self.barrier_fn.get_or_init(|| f).clone()
            }
        };
        self.barrier_gate.pass(&self.group, 0..self.world_size())?;
        let handle = self.control.device_handle();
        let cfg = crate::cuda::linear_launch(1, 32);
        let mut launch = stream.launch_builder(&func);
        launch.arg(&handle);
        // SAFETY: the kernel takes one DeviceWindow by value, which is what is pushed; the
        // window's memory outlives the launch because `self.control` lives as long as `self`
        // and `Drop` of windows synchronises with peers before unmapping.
        unsafe { launch.launch(cfg) }.cuda(self.rank() as i32, "cuLaunchKernel (barrier)")?;
        Ok(())
    }

    /// Host-side barrier through the store (no GPU work).
    pub fn host_barrier(&self) -> Result<()> {
        let tag = self.group.next_tag("__devcomm/host_barrier");
        Ok(self.group.store.barrier(&tag, self.group.setup_timeout)?)
    }

    /// Returns the first device error recorded by this communicator's kernels, if any
    /// ([`Error::PeerTimeout`] the first time, [`Error::Aborted`] after).
    pub fn check(&self) -> Result<()> {
        self.group.errors.check()
    }

    /// Waits for `stream` to finish, then reports device errors. Never hangs: every device
    /// wait is bounded by the device timeout.
    pub fn synchronize(&self, stream: &Arc<CudaStream>) -> Result<()> {
        let synced = stream
            .synchronize()
            .cuda(self.rank() as i32, "cuStreamSynchronize");
        self.check()?;
        synced
    }

    /// Raises the abort flag: every in-flight device wait of this communicator returns.
    pub fn abort(&self) {
        self.group.errors.raise_abort();
    }

    /// The store, for callers that exchange their own setup data (benchmarks, NCCL ids).
    pub fn store(&self) -> &Store {
        &self.group.store
    }

    /// The bound of host setup steps.
    pub fn setup_timeout(&self) -> Duration {
        self.group.setup_timeout
    }
}

/// Send/recv and the collectives composed from them.
impl Comm {
    /// Sends `buf` to `peer` on `stream`. The peer must post a [`Comm::recv`] (or a
    /// [`Comm::sendrecv`] receiving from this rank) of the same size. A send and a recv between
    /// the same two ranks in opposite directions must be one [`Comm::sendrecv`]: as two calls
    /// on one stream each would wait for the other (and time out).
    pub fn send<T: DeviceRepr, S: DevicePtr<T>>(
        &self,
        buf: &S,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (ptr, _sync) = buf.device_ptr(stream);
        let t = Transfer {
            ptr,
            bytes: buf.num_bytes() as u64,
            peer,
            config: None,
        };
        self.p2p
            .launch(&self.group, &self.jit, Some(t), None, stream)
    }

    /// Receives from `peer` into `buf` on `stream`; the message must be `buf`'s size.
    pub fn recv<T: DeviceRepr, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let bytes = buf.num_bytes() as u64;
        let (ptr, _sync) = buf.device_ptr_mut(stream);
        let t = Transfer {
            ptr,
            bytes,
            peer,
            config: None,
        };
        self.p2p
            .launch(&self.group, &self.jit, None, Some(t), stream)
    }

    /// Sends `send_buf` to `send_peer` and receives `recv_buf` from `recv_peer` in one kernel.
    /// The peers may be the same (both directions at once) or differ (ring schedules).
    pub fn sendrecv<T: DeviceRepr, U: DeviceRepr, S: DevicePtr<T>, R: DevicePtrMut<U>>(
        &self,
        send_buf: &S,
        send_peer: usize,
        recv_buf: &mut R,
        recv_peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (sp, _s) = send_buf.device_ptr(stream);
        let bytes = recv_buf.num_bytes() as u64;
        let (rp, _r) = recv_buf.device_ptr_mut(stream);
        let send = Transfer {
            ptr: sp,
            bytes: send_buf.num_bytes() as u64,
            peer: send_peer,
            config: None,
        };
        let recv = Transfer {
            ptr: rp,
            bytes,
            peer: recv_peer,
            config: None,
        };
        self.p2p
            .launch(&self.group, &self.jit, Some(send), Some(recv), stream)
    }

    /// Send/recv on raw device addresses with optional explicit launch knobs: either
    /// direction may be absent.
    ///
    /// # Safety
    ///
    /// Each `Transfer::ptr` must be a device address of this rank's context valid for
    /// `Transfer::bytes` bytes (readable for `send`, writable for `recv`) until the work on
    /// `stream` completes, and nothing else may write a recv buffer meanwhile.
    pub unsafe fn sendrecv_raw(
        &self,
        send: Option<Transfer>,
        recv: Option<Transfer>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.p2p.launch(&self.group, &self.jit, send, recv, stream)
    }

    /// The collective kernel's blocks (docs/COLLECTIVES.md, "Grid"): for a plain all-to-all
    /// (copy hooks) of `self_bytes` input bytes per peer, or `None` for device counts
    /// (all-to-all-v).
    pub fn collective_shape(&self, self_bytes: Option<u64>) -> CollShape {
        self.coll.shape(
            self.group.world_size,
            self.p2p.limits().max_blocks,
            self_bytes,
            true,
        )
    }

    /// Sizes of this communicator's send/recv window.
    pub fn p2p_limits(&self) -> &P2PLimits {
        self.p2p.limits()
    }

    /// The configuration a send/recv of `bytes` uses when the call names none: the tuning
    /// table's (if one is loaded and covers the size), the built-in defaults otherwise.
    pub fn p2p_config(&self, bytes: u64) -> P2PConfig {
        self.p2p.config_for(bytes)
    }

    /// The send/recv tuning table this communicator loaded, if any.
    pub fn tune_table(&self) -> Option<&TuneTable> {
        self.p2p.tune_table()
    }

    /// Ring all-gather composed from `sendrecv`: `recv` (world_size x `send`'s length) gets
    /// every rank's `send`, in rank order. `world_size - 1` steps; step s forwards the block
    /// received at step s - 1 to the next rank.
    pub fn all_gather_ring<T: DeviceRepr, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let world = self.world_size();
        let rank = self.rank();
        let bytes = send.num_bytes() as u64;
        if recv.num_bytes() as u64 != bytes * world as u64 {
            return Err(Error::InvalidArgument {
                op: "all_gather_ring",
                reason: format!(
                    "recv holds {} bytes; world size {world} x {bytes} bytes = {} are needed",
                    recv.num_bytes(),
                    bytes * world as u64
                ),
            });
        }
        let (sp, _s) = send.device_ptr(stream);
        let (rp, _r) = recv.device_ptr_mut(stream);
        let block = |i: usize| rp + (i as u64) * bytes;
        crate::cuda::memcpy_dtod_async(block(rank), sp, bytes as usize, stream)
            .map_err(|e| crate::cuda::with_rank(e, rank))?;
        let next = (rank + 1) % world;
        let prev = (rank + world - 1) % world;
        for step in 0..world.saturating_sub(1) {
            let send_block = (rank + world - step) % world;
            let recv_block = (rank + world - step - 1) % world;
            let s = Transfer {
                ptr: block(send_block),
                bytes,
                peer: next,
                config: None,
            };
            let r = Transfer {
                ptr: block(recv_block),
                bytes,
                peer: prev,
                config: None,
            };
            self.p2p
                .launch(&self.group, &self.jit, Some(s), Some(r), stream)?;
        }
        Ok(())
    }
}

/// Extra arguments of a hooked collective.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HookArgs {
    /// Device address of the user arguments the hooks see as `ctx.user` (0: none). It must stay
    /// valid until the collective's work on the stream has finished.
    pub user: u64,
    /// Elements per row (`ctx.cols`). All-to-all: 0 makes each peer's chunk one row.
    /// All-to-all-v and the `*_tiles` calls: counts are in rows of this many elements; 0
    /// means 1.
    pub row_len: usize,
}

fn elems<T>(bytes: usize) -> u64 {
    (bytes / std::mem::size_of::<T>().max(1)) as u64
}

fn sizes<I, O>() -> (Option<usize>, Option<usize>) {
    (
        Some(std::mem::size_of::<I>()),
        Some(std::mem::size_of::<O>()),
    )
}

/// Collectives on the send/recv protocol, with hooks (docs/COLLECTIVES.md).
impl Comm {
    /// All-to-all: `send` holds `world_size` equal chunks, chunk `p` for rank `p` (itself
    /// included); `recv` gets rank `p`'s chunk for this rank at chunk `p`. One fused kernel.
    pub fn all_to_all<T: DeviceRepr, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let hooks = Hooks::copy::<T>()?;
        self.all_to_all_hooked(&hooks, send, recv, HookArgs::default(), stream)
    }

    /// All-to-all through the user's hooks: `produce` runs on the sender for every tile of a
    /// chunk, `consume` on the receiver. `send` and `recv` hold `world_size` chunks of the same
    /// element count (of `I` and `O`).
    pub fn all_to_all_hooked<I: DeviceRepr, O: DeviceRepr, S: DevicePtr<I>, R: DevicePtrMut<O>>(
        &self,
        hooks: &Hooks,
        send: &S,
        recv: &mut R,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (i, o) = sizes::<I, O>();
        hooks.check_sizes("all_to_all", i, o)?;
        let (in_elems, out_elems) = (elems::<I>(send.num_bytes()), elems::<O>(recv.num_bytes()));
        let (input, _s) = send.device_ptr(stream);
        let (output, _r) = recv.device_ptr_mut(stream);
        self.all_to_all_at(hooks, (input, in_elems), (output, out_elems), args, stream)
    }

    /// The all-to-all of [`Comm::all_to_all_hooked`] on device addresses and element counts
    /// (the hooks' element sizes already checked).
    fn all_to_all_at(
        &self,
        hooks: &Hooks,
        (input, in_elems): (u64, u64),
        (output, out_elems): (u64, u64),
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const OP: &str = "all_to_all";
        let world = self.world_size() as u64;
        if in_elems % world != 0 || out_elems % world != 0 || in_elems != out_elems {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "send holds {in_elems} and recv {out_elems} elements; both must be world size \
                     {world} x the same chunk"
                ),
            });
        }
        let n = in_elems / world;
        if n == 0 {
            return Ok(());
        }
        let row_len = if args.row_len == 0 {
            n
        } else {
            args.row_len as u64
        };
        if n % row_len != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("row length {row_len} does not divide the chunk of {n} elements"),
            });
        }
        let call = CollCall {
            op: OP,
            input,
            output,
            in_elems,
            out_elems,
            row_len,
            rows: n / row_len,
            send_counts: 0,
            send_offsets: 0,
            recv_counts: 0,
            recv_offsets: 0,
            user: args.user,
            mode: MODE_UNIFORM,
            peer_rows: [[0; 32]; 2],
        };
        self.coll
            .launch(&self.group, &self.jit, &self.p2p, hooks, call, stream)
    }

    /// All-to-all-v with counts on the GPU: rank `p` gets `counts.send_counts[p]` rows of
    /// `row_len` elements (from `counts.send_offsets[p]`, or packed in rank order). The kernel
    /// exchanges the counts itself and writes `counts.recv_counts` and `counts.recv_offsets`
    /// (data from rank `p` lands packed in rank order): no host synchronisation, so the call
    /// can be captured in a CUDA graph. Counts that would overrun `recv` (or read past `send`)
    /// are caught on the GPU: nothing is written out of bounds and the next check returns
    /// [`Error::CountOverflow`].
    pub fn all_to_allv<T: DeviceRepr, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &mut AllToAllVCounts,
        row_len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let hooks = Hooks::copy::<T>()?;
        let args = HookArgs { user: 0, row_len };
        self.all_to_allv_hooked(&hooks, send, recv, counts, args, stream)
    }

    /// [`Comm::all_to_allv`] through the user's hooks.
    pub fn all_to_allv_hooked<I: DeviceRepr, O: DeviceRepr, S: DevicePtr<I>, R: DevicePtrMut<O>>(
        &self,
        hooks: &Hooks,
        send: &S,
        recv: &mut R,
        counts: &mut AllToAllVCounts,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const OP: &str = "all_to_allv";
        let (i, o) = sizes::<I, O>();
        hooks.check_sizes(OP, i, o)?;
        let world = self.world_size();
        let short = [
            ("send_counts", counts.send_counts.len()),
            ("recv_counts", counts.recv_counts.len()),
            ("recv_offsets", counts.recv_offsets.len()),
            (
                "send_offsets",
                counts.send_offsets.as_ref().map_or(world, |s| s.len()),
            ),
        ]
        .into_iter()
        .find(|(_, len)| *len < world);
        if let Some((name, len)) = short {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("{name} holds {len} entries; world size {world} are needed"),
            });
        }
        let row_len = args.row_len.max(1) as u64;
        let (in_elems, out_elems) = (elems::<I>(send.num_bytes()), elems::<O>(recv.num_bytes()));
        let (input, _s) = send.device_ptr(stream);
        let (output, _r) = recv.device_ptr_mut(stream);
        let (send_counts, _a) = counts.send_counts.device_ptr(stream);
        let send_offsets = match &counts.send_offsets {
            Some(o) => o.device_ptr(stream).0,
            None => 0,
        };
        let (recv_counts, _c) = counts.recv_counts.device_ptr_mut(stream);
        let (recv_offsets, _d) = counts.recv_offsets.device_ptr_mut(stream);
        let call = CollCall {
            op: OP,
            input,
            output,
            in_elems,
            out_elems,
            row_len,
            rows: 0,
            send_counts,
            send_offsets,
            recv_counts,
            recv_offsets,
            user: args.user,
            mode: MODE_DEVICE_COUNTS,
            peer_rows: [[0; 32]; 2],
        };
        self.coll
            .launch(&self.group, &self.jit, &self.p2p, hooks, call, stream)
    }
}

/// One side of a hooked point-to-point transfer: device address, elements, peer.
type TileSide = Option<(u64, u64, usize)>;

/// Hooked send/recv (`send_tiles`, `recv_tiles`): level 2 of the framework, for users who
/// keep their own schedule. The same kernel and hooks as the collectives; a step of the
/// user's schedule is one call, and calls on one stream run in order.
impl Comm {
    /// Sends `buf` to `peer` through `hooks.produce`; the peer posts a matching
    /// [`Comm::recv_tiles`] (or [`Comm::sendrecv_tiles`]) of the same element count.
    pub fn send_tiles<I: DeviceRepr, S: DevicePtr<I>>(
        &self,
        hooks: &Hooks,
        buf: &S,
        peer: usize,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        hooks.check_sizes("send_tiles", Some(std::mem::size_of::<I>()), None)?;
        let n = elems::<I>(buf.num_bytes());
        let (ptr, _s) = buf.device_ptr(stream);
        self.tiles(hooks, Some((ptr, n, peer)), None, args, stream)
    }

    /// Receives from `peer` into `buf` through `hooks.consume`.
    pub fn recv_tiles<O: DeviceRepr, R: DevicePtrMut<O>>(
        &self,
        hooks: &Hooks,
        buf: &mut R,
        peer: usize,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        hooks.check_sizes("recv_tiles", None, Some(std::mem::size_of::<O>()))?;
        let n = elems::<O>(buf.num_bytes());
        let (ptr, _r) = buf.device_ptr_mut(stream);
        self.tiles(hooks, None, Some((ptr, n, peer)), args, stream)
    }

    /// Sends `send` to `send_peer` and receives `recv` from `recv_peer` in one kernel, through
    /// the hooks (the peers may differ: rings and other schedules).
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv_tiles<I: DeviceRepr, O: DeviceRepr, S: DevicePtr<I>, R: DevicePtrMut<O>>(
        &self,
        hooks: &Hooks,
        send: &S,
        send_peer: usize,
        recv: &mut R,
        recv_peer: usize,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (i, o) = sizes::<I, O>();
        hooks.check_sizes("sendrecv_tiles", i, o)?;
        let (ns, nr) = (elems::<I>(send.num_bytes()), elems::<O>(recv.num_bytes()));
        let (sp, _s) = send.device_ptr(stream);
        let (rp, _r) = recv.device_ptr_mut(stream);
        self.tiles(
            hooks,
            Some((sp, ns, send_peer)),
            Some((rp, nr, recv_peer)),
            args,
            stream,
        )
    }

    fn tiles(
        &self,
        hooks: &Hooks,
        send: TileSide,
        recv: TileSide,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const OP: &str = "sendrecv_tiles";
        let world = self.world_size();
        let mut peer_rows = [[0u64; 32]; 2];
        let mut call = CollCall {
            op: OP,
            input: 0,
            output: 0,
            in_elems: 0,
            out_elems: 0,
            row_len: 1,
            rows: 0,
            send_counts: 0,
            send_offsets: 0,
            recv_counts: 0,
            recv_offsets: 0,
            user: args.user,
            mode: MODE_PEER_ROWS,
            peer_rows,
        };
        for (side, t) in [send, recv].into_iter().enumerate() {
            let Some((ptr, n, peer)) = t else { continue };
            if peer >= world || peer == self.rank() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "peer {peer} is not another rank (rank {}, world size {world})",
                        self.rank()
                    ),
                });
            }
            let row_len = args.row_len.max(1) as u64;
            if n % row_len != 0 {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!("row length {row_len} does not divide {n} elements"),
                });
            }
            call.row_len = row_len;
            peer_rows[side][peer] = n / row_len;
            if side == 0 {
                (call.input, call.in_elems) = (ptr, n);
            } else {
                (call.output, call.out_elems) = (ptr, n);
            }
        }
        call.peer_rows = peer_rows;
        if peer_rows.iter().flatten().all(|&r| r == 0) {
            return Ok(()); // nothing to move
        }
        self.coll
            .launch(&self.group, &self.jit, &self.p2p, hooks, call, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(20);

    #[test]
    fn each_rank_opens_its_own_gpu_unless_sharing() {
        assert_eq!(default_ordinal(1, 4, false).unwrap(), 1);
        let err = default_ordinal(1, 1, false).unwrap_err().to_string();
        assert!(err.contains("1 GPU(s) are visible") && err.contains("DEVCOMM_SHARE_GPU"));
        assert_eq!(default_ordinal(3, 1, true).unwrap(), 0);
        assert_eq!(default_ordinal(3, 2, true).unwrap(), 1);
        assert!(default_ordinal(0, 0, true).is_err());
    }

    /// The tuning module's sample table, its first bucket on `blocks` blocks.
    fn table(blocks: u32) -> TuneTable {
        let mut t = crate::p2p::tune::tests::table(&P2PLimits::default());
        t.entries[0].config.blocks = blocks;
        t
    }

    /// Two ranks in this process (rank 1 on a thread) compare their tables; returns each
    /// rank's outcome.
    fn compare(mine: Option<TuneTable>, theirs: Option<TuneTable>) -> [Result<()>; 2] {
        let info0 = RankInfo::new(0, 2).with_master("127.0.0.1", 0);
        let s0 = Store::connect(&info0, T).expect("rank 0 store");
        let info1 = RankInfo::new(1, 2).with_master("127.0.0.1", s0.master_port());
        let rank1 = std::thread::spawn(move || {
            let s1 = Store::connect(&info1, T).expect("rank 1 store");
            same_table_everywhere(&s1, 1, theirs.as_ref(), T)
        });
        let r0 = same_table_everywhere(&s0, 0, mine.as_ref(), T);
        [r0, rank1.join().expect("rank 1 thread")]
    }

    #[test]
    fn every_rank_must_load_the_same_tuning_table() {
        for r in compare(Some(table(32)), Some(table(32))) {
            r.unwrap();
        }
        for r in compare(None, None) {
            r.unwrap();
        }
        for r in compare(Some(table(32)), Some(table(16))) {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("rank(s) 1") && e.contains("another tuning table"),
                "{e}"
            );
        }
        for r in compare(Some(table(32)), None) {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("no tuning table") && e.contains(TUNE_FILE_ENV),
                "{e}"
            );
        }
    }
}
