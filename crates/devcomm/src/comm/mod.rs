//! The object a user holds: joins the process group, discovers the topology, owns the kernel
//! cache, and creates windows and registrations.

mod builder;
mod collectives;
mod p2p;
pub mod raw;
mod raw_registered;
mod reduce_ops;
mod registration;
mod setup;
mod tiles;
mod zero_copy;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, PushKernelArg};
use devcomm_bootstrap::{RankInfo, Store};

use crate::collective::Collective;
use crate::cuda::info::DeviceInfo;
use crate::error::{CudaResultExt, Result};
use crate::group::Group;
use crate::jit::{Jit, KernelSpec};
use crate::memory::Registry;
use crate::p2p::P2P;
use crate::topology::Topology;
use crate::window::Window;

pub use builder::CommBuilder;
pub use collectives::HookArgs;
pub use zero_copy::RegisteredRange;

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
