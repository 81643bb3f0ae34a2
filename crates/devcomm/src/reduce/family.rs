//! The reduction family's entry (docs/ARCHITECTURE.md, "Transports and the mesh"): the NVLink
//! kernels ([`Reduce`]) and, in a job with network links, the network algorithm
//! ([`NetReduce`]); every call and the barrier go through [`Reductions`], which picks one.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::launch::{Reduce, ReduceCall, ReduceTuning};
use super::net::{NetCtx, NetReduce};
use super::plan::{Plan, ReduceLimits, Shape};
use super::tune::ReduceTuneTable;
use crate::error::{Error, Result};
use crate::group::Group;
use crate::jit::Jit;

/// The reductions of a communicator.
#[derive(Debug)]
pub(crate) struct Reductions {
    kernels: Reduce,
    /// The network algorithm's scratch, in a job with network links (the mesh's answer at
    /// setup): then every reduction and the barrier take it.
    net: Option<NetReduce>,
}

impl Reductions {
    /// Collective: the NVLink kernels' window and counters (tuned as `tuning` says), and the
    /// network scratch when the job has network links.
    pub(crate) fn new(group: &Arc<Group>, sm_count: i32, tuning: ReduceTuning) -> Result<Self> {
        let kernels = Reduce::new(group, sm_count, tuning)?;
        let net = match group.mesh.network_in_job() {
            true => Some(NetReduce::new(group)?),
            false => None,
        };
        Ok(Self { kernels, net })
    }

    /// The sizes and blocks the default plans are made with.
    pub(crate) fn limits(&self) -> &ReduceLimits {
        self.kernels.limits()
    }

    /// The limits with the window's sizes, which tuned choices fit.
    pub(crate) fn window_limits(&self) -> &ReduceLimits {
        self.kernels.window_limits()
    }

    /// The NVLink kernels' tuning table, if the communicator loaded one (the network
    /// algorithm takes none).
    pub(crate) fn tune_table(&self) -> Option<&ReduceTuneTable> {
        self.kernels.tune_table()
    }

    /// Launches `call` on the NVLink kernels (a refused call's part, which the network
    /// algorithm has none of: see [`Reductions::by_network`]).
    pub(crate) fn launch(
        &self,
        group: &Group,
        jit: &Jit,
        call: ReduceCall<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.kernels.launch(group, jit, call, stream)
    }

    /// Whether the reductions take the network algorithm (the job has network links): then
    /// calls take no zero-copy path and a refused call is not joined on the device.
    pub(crate) fn by_network(&self) -> bool {
        self.net.is_some()
    }

    /// The plan `call` takes (its shape only: a call on ordinary buffers, or on the buffers
    /// `call.pool` places), without launching.
    pub(crate) fn plan_of(
        &self,
        call: &ReduceCall<'_>,
        (rank, world): (usize, usize),
    ) -> Result<Plan> {
        let Some(nr) = &self.net else {
            return self
                .kernels
                .choose(call, (rank, world))
                .map(|(plan, _)| plan);
        };
        let es = call.dtype.size_bytes() as u64;
        let shape = Shape {
            collective: call.collective,
            count: call.count,
            elem_bytes: es,
            world,
            row_len: call.hooks.map(|(_, _, row)| row),
        };
        let p = nr
            .plan(&shape, self.limits())
            .map_err(|reason| Error::InvalidArgument {
                op: call.collective.name(),
                reason: format!("rank {rank}: {reason}"),
            })?;
        Ok(NetReduce::summary(&p, es, self.kernels.sm_count()))
    }

    /// Runs `call` (its buffers resolved and checked, `count` > 0, the stream bound): the
    /// network algorithm in a job with network links, else the NVLink kernels.
    pub(crate) fn run(
        &self,
        cx: &NetCtx<'_>,
        call: ReduceCall<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        match &self.net {
            Some(nr) => nr.run(cx, &self.kernels, call, stream),
            None => self.kernels.launch(cx.group, cx.jit, call, stream),
        }
    }

    /// `Comm::barrier`: the barrier kernel reaches NVLink peers only; in a job with network
    /// links the barrier is an all-to-all of one byte, which reaches every peer.
    pub(crate) fn barrier(&self, cx: &NetCtx<'_>, stream: &Arc<CudaStream>) -> Result<()> {
        match &self.net {
            Some(nr) => {
                cx.group.errors.check_before_launch()?;
                nr.barrier(cx, stream)
            }
            None => cx.p2p.launch_barrier(cx.group, cx.jit, stream),
        }
    }
}
