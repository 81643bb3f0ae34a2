//! The object a user holds: joins the process group, discovers the topology, owns the kernel
//! cache, and creates windows and registrations.

mod builder;
mod collectives;
mod env;
mod p2p;
mod registration;
mod setup;
mod tiles;
mod zero_copy;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use devcomm_bootstrap::{RankInfo, Store};

use crate::collective::Collective;
use crate::cuda::info::DeviceInfo;
use crate::error::{CudaResultExt, Result};
use crate::group::Group;
use crate::jit::Jit;
use crate::memory::Registry;
use crate::p2p::P2P;
use crate::topology::Topology;

pub use builder::CommBuilder;
pub use collectives::HookArgs;
pub use env::{
    P2P_DEPTH_ENV, P2P_MAX_BLOCKS_ENV, P2P_SLOT_KIB_ENV, SETUP_TIMEOUT_ENV, TIMEOUT_ENV,
};
pub use zero_copy::RegisteredRange;

/// A communicator: one per process, one GPU per process.
#[derive(Debug)]
pub struct Comm {
    local_rank: usize,
    device: DeviceInfo,
    jit: Jit,
    registry: Registry,
    p2p: P2P,
    coll: Collective,
    // Dropped last: windows and registrations above release their mappings first.
    group: Arc<Group>,
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

    /// The bound of device waits.
    pub fn device_timeout(&self) -> Duration {
        self.group.device_timeout
    }

    /// Enqueues a barrier across all ranks on `stream`: kernels after it on any rank start only
    /// once every rank's work before it has finished. Bounded like every device wait. It is a
    /// call like send/recv and the collectives (docs/PROTOCOL.md, "Agreement"): every rank must
    /// make it at the same point of its calls (a rank in another call is named by
    /// [`Error::CallMismatch`]), on the stream of the communicator's send/recv calls.
    pub fn barrier(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.p2p.launch_barrier(&self.group, &self.jit, stream)
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
