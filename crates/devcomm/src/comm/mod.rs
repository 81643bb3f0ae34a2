//! The object a user holds: joins the process group, discovers the topology, owns the kernel
//! cache, and creates windows and registrations.

mod builder;
mod collectives;
mod moe;
mod p2p;
mod pool;
pub mod raw;
mod raw_registered;
mod reduce_ops;
mod reduce_plans;
mod reduce_tuning;
mod registration;
mod setup;
mod tiles;
mod trace;
mod tuning;
mod zero_copy;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use devcomm_bootstrap::{RankInfo, Store};

use crate::collective::Collective;
use crate::cuda::info::DeviceInfo;
use crate::error::{CudaResultExt, Result};
use crate::group::Group;
use crate::jit::{Jit, KernelSpec};
use crate::kernels::KernelKind;
use crate::memory::{Pool, Registry};
use crate::p2p::P2P;
use crate::topology::Topology;

pub use builder::CommBuilder;
pub use collectives::HookArgs;
pub use moe::{DispatchBuffers, Moe};
pub use pool::PoolSlice;
pub use registration::{RegisteredRange, Registration};
pub use tuning::Tuning;

/// A communicator: one per process, one GPU per process.
#[derive(Debug)]
pub struct Comm {
    /// The memory pool's segments: torn down first (collectively), while the registry and
    /// the network transport their registrations use are still there.
    pool: Pool,
    local_rank: usize,
    device: DeviceInfo,
    jit: Jit,
    registry: Arc<Registry>,
    p2p: P2P,
    coll: Collective,
    /// The stream given to the builder, bound at build.
    stream: Option<Arc<CudaStream>>,
    /// The reductions' window, counters and kernels (`reduce::launch`).
    reduce: crate::reduce::family::Reductions,
    // Dropped last: windows and registrations above release their mappings first.
    pub(crate) group: Arc<Group>,
}

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

    /// The spec of `kind`'s module exactly as this communicator's calls load it: its settings'
    /// kernel options (`DEVCOMM_*_OPTIONS`) and whether the job has network links
    /// ([`crate::kernel_spec`]). What `devcomm precompile` or a prewarming step should compile.
    pub fn kernel_spec(&self, kind: KernelKind<'_>) -> KernelSpec {
        crate::kernels::kernel_spec(kind, &self.group.config, self.net_links())
    }

    /// Compiles (or reads from the kernel cache) and loads the modules of `kinds` now, so
    /// that the first call using them does not compile. Local to this rank: no peer takes part
    /// (each may prewarm different kinds). While it loads, the rank is marked as loading, so
    /// a peer already waiting at one of these kernels' gates keeps waiting. Compile errors
    /// (bad hooks) come back as [`crate::Error::Compile`].
    pub fn prewarm(&self, kinds: &[KernelKind<'_>]) -> Result<()> {
        for &kind in kinds {
            crate::kernels::load(&self.group, &self.jit, kind, self.net_links())?;
        }
        Ok(())
    }

    /// Whether the job has network links, as the mesh decided at setup (then the collectives
    /// load their instantiation for network peers, and the reductions and barrier take the
    /// network path; [`Tuning::has_network_links`]).
    pub(crate) fn net_links(&self) -> bool {
        self.group.mesh.network_in_job()
    }

    /// Collective, in a job with network links: the network key of a registration of
    /// `[ptr, ptr + bytes)` (`None` without network links or when the transport refused it).
    pub(crate) fn network_key(
        &self,
        ptr: u64,
        bytes: usize,
    ) -> Result<Option<crate::memory::NetworkKey>> {
        self.p2p.network_key(self.rank(), ptr, bytes)
    }

    /// What the reductions' network algorithm and the barrier launch through.
    pub(crate) fn families(&self) -> crate::reduce::net::NetCtx<'_> {
        crate::reduce::net::NetCtx {
            group: &self.group,
            jit: &self.jit,
            p2p: &self.p2p,
            coll: &self.coll,
            net: self.p2p.coll_net_args(),
        }
    }

    /// The stream this communicator was built with ([`CommBuilder::stream`]), to which its
    /// send/recv and collectives are bound: a call on another stream is refused, since two
    /// streams on one set of send/recv counters would race. `None` when the builder was given
    /// none; then the first stream a call uses is bound ([`Comm::bind_stream`] binds one
    /// explicitly).
    pub fn stream(&self) -> Option<&Arc<CudaStream>> {
        self.stream.as_ref()
    }

    /// Binds the communicator's send/recv and collectives to `stream` now (what the first call
    /// would do); refused when another stream is bound already.
    pub fn bind_stream(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.p2p.bind(&self.group, stream)
    }

    /// The bound of device waits.
    pub fn device_timeout(&self) -> Duration {
        self.group.device_timeout
    }

    /// Enqueues a barrier across all ranks on `stream`: kernels after it on any rank start only
    /// once every rank's work before it has finished. Bounded like every device wait. It is a
    /// call like send/recv and the collectives (docs/PROTOCOL.md, "Agreement"): every rank must
    /// make it at the same point of its calls (a rank in another call is named by
    /// [`crate::Error::CallMismatch`]), on the stream of the communicator's send/recv calls.
    pub fn barrier(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.reduce.barrier(&self.families(), stream)
    }

    /// Host-side barrier through the store (no GPU work).
    pub fn host_barrier(&self) -> Result<()> {
        let tag = self.group.next_tag("__devcomm/host_barrier");
        Ok(self.group.store.barrier(&tag, self.group.setup_timeout)?)
    }

    /// Returns the first device error recorded by this communicator's kernels, if any
    /// ([`Error::PeerTimeout`](crate::Error::PeerTimeout) the first time,
    /// [`Error::Aborted`](crate::Error::Aborted) after).
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

    /// The device address of a cudarc slice that call `op` reads, with the guard that orders
    /// the slice's uses on `stream`: the one way a call turns a slice into an address, so that
    /// no call skips its graph-capture readiness check ([`Comm::capture_ready`], made first).
    pub(crate) fn slice_ptr<'s, T, S: DevicePtr<T>>(
        &self,
        op: &'static str,
        slice: &'s S,
        stream: &'s Arc<CudaStream>,
    ) -> Result<(u64, SyncOnDrop<'s>)> {
        self.capture_ready(op, stream)?;
        Ok(slice.device_ptr(stream))
    }

    /// [`Comm::slice_ptr`] for a slice that call `op` writes.
    pub(crate) fn slice_ptr_mut<'s, T, S: DevicePtrMut<T>>(
        &self,
        op: &'static str,
        slice: &'s mut S,
        stream: &'s Arc<CudaStream>,
    ) -> Result<(u64, SyncOnDrop<'s>)> {
        self.capture_ready(op, stream)?;
        Ok(slice.device_ptr_mut(stream))
    }

    /// Graph-capture readiness of a call that takes cudarc slices: refused while `stream` is
    /// capturing and cudarc manages cross-stream synchronisation for the context (event
    /// tracking on and more than one stream), since cudarc would then wait on the slices'
    /// events inside the capture, which CUDA refuses, and the capture would fail later with
    /// a driver error far from its cause.
    pub(crate) fn capture_ready(&self, op: &'static str, stream: &CudaStream) -> Result<()> {
        let managing = stream.context().is_managing_stream_synchronization();
        if !managing {
            return Ok(());
        }
        let capturing = crate::cuda::graph::is_capturing(stream)
            .map_err(|e| crate::cuda::with_rank(e, self.rank()))?;
        match capture_refusal(op, self.rank(), managing, capturing) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The error of a call on cudarc slices made on a capturing stream while cudarc tracks the
/// slices' uses with events (see [`Comm::capture_ready`]), or `None` when the call may go on.
fn capture_refusal(
    op: &'static str,
    rank: usize,
    managing: bool,
    capturing: bool,
) -> Option<crate::Error> {
    (managing && capturing).then(|| crate::Error::InvalidArgument {
        op,
        reason: format!(
            "rank {rank}: the stream is capturing a CUDA graph while cudarc's event tracking is \
             on for this context; cudarc would wait on the buffers' events inside the capture, \
             which CUDA refuses. Allocate the buffers of a captured call after \
             `CudaContext::disable_event_tracking` (see its safety rules), or use the `_raw` \
             forms"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::capture_refusal;

    /// The classes of bug behind two defects: a call that takes a slice's address without its
    /// capture readiness check, and a launch path that checks the recorded error with `check`
    /// (which returns an earlier call's soft error and launches nothing, leaving the peers to
    /// time out) instead of the guard before launch. Every source file of the communicator is
    /// read: a slice's address comes only from `slice_ptr`/`slice_ptr_mut`, and `check()` is
    /// called only by `synchronize`.
    #[test]
    fn every_call_takes_slices_through_the_capture_check_and_launches_through_the_guard() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/comm");
        let mut offenders = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("src/comm") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source");
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let mut function = "";
            // The tests below a file's `#[cfg(test)]` are not calls.
            let calls = text.split("#[cfg(test)]").next().unwrap_or("");
            for (i, line) in calls.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if let Some(rest) = code.split("fn ").nth(1) {
                    function = rest.split(['(', '<']).next().unwrap_or("");
                }
                let takes_slice = code.contains(".device_ptr(stream)")
                    || code.contains(".device_ptr_mut(stream)");
                let in_helper = name == "mod.rs" && code.trim_start().starts_with("Ok(slice.");
                if takes_slice && !in_helper {
                    offenders.push(format!("{name}:{}: {}", i + 1, line.trim()));
                }
                if code.contains("self.check()") && function != "synchronize" {
                    offenders.push(format!("{name}:{}: {}", i + 1, line.trim()));
                }
            }
        }
        assert!(offenders.is_empty(), "{offenders:#?}");
    }

    #[test]
    fn capture_is_refused_only_when_cudarc_tracks_events() {
        assert!(capture_refusal("send", 0, false, false).is_none());
        assert!(capture_refusal("send", 0, true, false).is_none());
        assert!(capture_refusal("send", 0, false, true).is_none());
        let e = capture_refusal("all_to_all", 3, true, true)
            .expect("refused")
            .to_string();
        assert!(e.contains("all_to_all") && e.contains("rank 3"), "{e}");
        assert!(e.contains("event tracking"), "{e}");
    }
}
