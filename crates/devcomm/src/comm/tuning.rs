//! [`Tuning`]: what a communicator decided or would decide (limits, switches, routes, plans)
//! for benchmarks, the self-test and tuning work. Nothing here moves data but
//! [`Tuning::reduction_raw_with`], the tuner's way to time one choice; a program that only
//! communicates does not need it, so it stays off [`Comm`]'s own methods.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::reduce_ops::invalid;
use super::reduce_plans::NO_CHOICE_BY_NETWORK;
use super::Comm;
use crate::collective::CollShape;
use crate::error::Result;
use crate::p2p::{P2PConfig, P2PLimits, Switches, TuneTable, ZcRoute};
use crate::reduce::tune::{ReduceTuneTable, TunedWindow};
use crate::reduce::tuned_plan::Choice;
use crate::reduce::{Collective, DataType, Plan, ReduceLimits, ReduceOp};

/// A view of a communicator's decisions ([`Comm::tuning`]).
#[derive(Debug, Clone, Copy)]
pub struct Tuning<'c> {
    comm: &'c Comm,
}

impl Comm {
    /// What this communicator decided or would decide: its send/recv window and switches, the
    /// configuration and route of a message, the collective's grid, a reduction's plan.
    pub fn tuning(&self) -> Tuning<'_> {
        Tuning { comm: self }
    }
}

impl<'c> Tuning<'c> {
    /// Sizes of the send/recv window.
    pub fn p2p_limits(&self) -> &'c P2PLimits {
        self.comm.p2p.limits()
    }

    /// The send/recv switches of the configuration.
    pub fn p2p_switches(&self) -> &'c Switches {
        self.comm.p2p.switches()
    }

    /// The configuration a send/recv of `bytes` uses when the call names none: the tuning
    /// table's (if one is loaded and covers the size), the built-in defaults otherwise.
    pub fn p2p_config(&self, bytes: u64) -> P2PConfig {
        self.comm.p2p.config_for(bytes)
    }

    /// The send/recv tuning table the communicator loaded, if any.
    pub fn tune_table(&self) -> Option<&'c TuneTable> {
        self.comm.p2p.tune_table()
    }

    /// The route a message of `bytes` into a registered destination takes (the same on both
    /// ends: it depends on the size and the must-agree settings only).
    pub fn zero_copy_route(&self, bytes: u64) -> ZcRoute {
        crate::p2p::zero_copy_route(bytes, self.p2p_limits(), self.p2p_switches())
    }

    /// The collective kernel's blocks (docs/COLLECTIVES.md, "Grid"): for a plain all-to-all
    /// (copy hooks) of `self_bytes` input bytes per peer, or `None` for device counts
    /// (all-to-all-v).
    pub fn collective_shape(&self, self_bytes: Option<u64>) -> CollShape {
        let c = self.comm;
        c.coll.shape(
            c.group.world_size,
            c.p2p.limits().max_blocks,
            self_bytes,
            true,
        )
    }

    /// The plan a reduction of `count` elements of `dtype` takes on ordinary buffers (as the
    /// calls name the count: all-reduce elements, reduce-scatter output elements, all-gather
    /// input elements); `None` for 0 elements (nothing runs).
    pub fn reduction_plan(
        &self,
        collective: Collective,
        dtype: DataType,
        count: u64,
    ) -> Result<Option<Plan>> {
        self.comm.reduction_plan(collective, dtype, count)
    }

    /// The plan of a reduction at device addresses `(input, output, count)`: the zero-copy
    /// paths where both lie in the memory pool, else [`reduction_plan`](Self::reduction_plan)'s.
    pub fn reduction_plan_at(
        &self,
        collective: Collective,
        dtype: DataType,
        at: (u64, u64, u64),
    ) -> Result<Option<Plan>> {
        self.comm.reduction_plan_at(collective, dtype, at)
    }

    /// The reductions' sizes and blocks that the default plans are made with (the settings'
    /// and the defaults', fitted to the smallest GPU).
    pub fn reduction_limits(&self) -> ReduceLimits {
        *self.comm.reduce.limits()
    }

    /// The sizes the reductions' window holds: [`reduction_limits`](Self::reduction_limits)'
    /// and, where larger, the tuning table's or the builder's
    /// ([`CommBuilder::reduce_window`](super::CommBuilder::reduce_window)). Tuned choices fit
    /// these; a tuning table records them.
    pub fn reduction_window(&self) -> TunedWindow {
        TunedWindow::of(self.comm.reduce.window_limits())
    }

    /// The reductions' tuning table the communicator loaded, if any (a file, a table given to
    /// the builder or the built-in one of this GPU model and world size).
    pub fn reduce_tune_table(&self) -> Option<&'c ReduceTuneTable> {
        self.comm.reduce.tune_table()
    }

    /// The plan of a reduction at device addresses `(input, output, count)` with `choice` in
    /// place of the tuning table's and the default plan, or an error when the choice cannot
    /// serve the call (its algorithm has no kernel for the collective or the buffers, its
    /// sizes do not fit the window, its blocks are out of range: `reduce::tuned_plan`); `None`
    /// for 0 elements.
    pub fn reduction_plan_with(
        &self,
        collective: Collective,
        dtype: DataType,
        at: (u64, u64, u64),
        choice: Choice,
    ) -> Result<Option<Plan>> {
        self.comm
            .reduction_plan_with(collective, dtype, at, Some(choice))
    }

    /// Runs one reduction on raw device addresses `(input, output, count)` (as
    /// [`Comm::all_reduce_raw`], [`Comm::reduce_scatter_raw`] and [`Comm::all_gather_raw`]
    /// take them; `op` is ignored for the all-gather) with `choice` in place of the tuning
    /// table's and the default plan: what `devcomm tune` times for each candidate. Every rank
    /// must pass the same choice. An error, nothing launched, when the choice cannot serve
    /// the call ([`reduction_plan_with`](Self::reduction_plan_with)) or the job has network
    /// links. The result is bitwise the default plan's: every algorithm reduces in rank order.
    ///
    /// # Safety
    ///
    /// As the raw form of the collective.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduction_raw_with(
        &self,
        collective: Collective,
        dtype: DataType,
        op: ReduceOp,
        at: (u64, u64, u64),
        choice: Choice,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = self.comm;
        if c.reduce.by_network() {
            return Err(invalid(collective, c.rank())(NO_CHOICE_BY_NETWORK.into()));
        }
        let op = (collective != Collective::AllGather).then_some(op);
        c.reduction_with(collective, dtype, op, at, None, Some(choice), stream)
    }

    /// Whether some link of the job, on any rank, is reached over the network (the same answer
    /// on every rank): then the reductions and `Comm::barrier` take the network path
    /// (docs/NETWORK.md), and the collectives load their instantiation for network peers.
    pub fn has_network_links(&self) -> bool {
        self.comm.net_links()
    }

    /// Whether some peer of this rank is reached over the network.
    pub fn has_network_peers(&self) -> bool {
        self.comm.group.mesh.has_network_peers()
    }
}
