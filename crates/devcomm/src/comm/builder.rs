//! [`CommBuilder`]: explicit settings, and the collective setup of a communicator.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use devcomm_bootstrap::{RankInfo, Store};

use super::reduce_tuning::{reduce_tuning, TuningAsked};
use super::setup::{
    agree_on_config, agree_on_store, default_ordinal, same_table_everywhere, REDUCTION_TABLE,
    REDUCTION_WINDOW, SEND_RECV_TABLE,
};
use super::Comm;
use crate::collective::Collective;
use crate::config::Config;
use crate::cuda::info::DeviceInfo;
use crate::cuda::ErrorState;
use crate::error::{CudaResultExt, Result};
use crate::group::Group;
use crate::jit::Jit;
use crate::kernels::KernelKind;
use crate::memory::{Pool, Registry};
use crate::p2p::{P2PLimits, TuneTable, P2P};
use crate::reduce::tune::{ReduceTuneTable, TunedWindow};
use crate::topology::Topology;

/// Builds a [`Comm`] with explicit settings. [`Comm::from_env`] is the usual way in.
#[derive(Debug)]
pub struct CommBuilder {
    info: RankInfo,
    /// A store joined by the caller ([`CommBuilder::on_store`]); otherwise `build` connects.
    store: Option<Store>,
    /// Whether [`Comm::local_rank`] comes from the topology rather than `info`.
    local_from_topology: bool,
    device: Option<usize>,
    config: Config,
    /// A window given in code ([`CommBuilder::p2p_limits`]); otherwise the configuration's.
    p2p_limits: Option<P2PLimits>,
    /// A table given in code ([`CommBuilder::tune_table`]); otherwise the configuration's file.
    tune: Option<Option<TuneTable>>,
    /// The reductions' table and window asked for in code ([`CommBuilder::reduce_tune_table`],
    /// [`CommBuilder::reduce_window`]).
    reduce_tuning: TuningAsked,
    stream: Option<Arc<CudaStream>>,
}

impl CommBuilder {
    /// Starts from an explicit rank description and the settings of the environment
    /// ([`Config::from_env`]; a bad value is an error naming the variable).
    pub fn new(info: RankInfo) -> Result<Self> {
        Ok(Self::with_config(info, Config::from_env()?))
    }

    /// Starts from an explicit rank description and settings made in code.
    pub fn with_config(info: RankInfo, config: Config) -> Self {
        Self {
            info,
            store: None,
            local_from_topology: false,
            device: None,
            config,
            p2p_limits: None,
            tune: None,
            reduce_tuning: TuningAsked::default(),
            stream: None,
        }
    }

    /// Builds on a store the caller has joined already (rank, world size and local rank are
    /// the store's), with the settings of the environment: for groups that meet through
    /// another channel (`Store::host_fresh` / `Store::join_address`), where no port is known
    /// before rank 0 binds one. The store must be fresh: every communicator needs a store of
    /// its own (its setup keys carry no communicator id).
    pub fn on_store(store: Store) -> Result<Self> {
        Ok(Self::on_store_with_config(store, Config::from_env()?))
    }

    /// Like [`CommBuilder::on_store`] with settings made in code.
    pub fn on_store_with_config(store: Store, config: Config) -> Self {
        let mut b = Self::with_config(store.info().clone(), config);
        b.store = Some(store);
        b
    }

    /// [`Comm::local_rank`] becomes this rank's position among the ranks that the topology
    /// finds on its host, for a group whose launcher gave no local rank (a subgroup, a
    /// process group started without torchrun). Give the device ([`CommBuilder::device`]):
    /// the default device is the local rank of the rank description.
    pub fn local_rank_from_topology(mut self) -> Self {
        self.local_from_topology = true;
        self
    }

    /// Replaces every setting (docs/CONFIG.md); `build` validates them and compares the ones
    /// that must agree across ranks.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The stream the communicator's send/recv and collectives run on, bound at `build`
    /// (see [`Comm::stream`]). It must be a stream of the device's primary context (made from
    /// `CudaContext::new(ordinal)`); `build` refuses another. Without it, the first stream a
    /// call uses is bound.
    pub fn stream(mut self, stream: Arc<CudaStream>) -> Self {
        self.stream = Some(stream);
        self
    }

    /// The CUDA device ordinal to use (default: the local rank).
    pub fn device(mut self, ordinal: usize) -> Self {
        self.device = Some(ordinal);
        self
    }

    /// Bound of every device wait. A wait that expires makes the host call return
    /// [`Error::PeerTimeout`](crate::Error::PeerTimeout) naming the peer, and the communicator must be rebuilt.
    pub fn device_timeout(mut self, timeout: Duration) -> Self {
        self.config.device_timeout = timeout;
        self
    }

    /// Bound of every host setup step (joining, exchanging handles, agreements).
    pub fn setup_timeout(mut self, timeout: Duration) -> Self {
        self.config.setup_timeout = timeout;
        self
    }

    /// The send/recv tuning table (as `devcomm tune` writes it; default: the file named by
    /// `DEVCOMM_TUNE_FILE`, if set). Every rank must pass the same table: `build` checks it
    /// against the GPU and the window, and compares it across ranks.
    pub fn tune_table(mut self, table: Option<TuneTable>) -> Self {
        self.tune = Some(table);
        self
    }

    /// The reductions' tuning table (as `devcomm tune --op all_reduce,...` writes it; default:
    /// the file named by `DEVCOMM_REDUCE_TUNE_FILE`, else the table built into the library for
    /// this GPU model and world size, if any). `None`: no table, whatever the settings. Every
    /// rank must pass the same table: `build` checks it against the GPU model, the world size
    /// and the staged rounds, and compares it across ranks.
    pub fn reduce_tune_table(mut self, table: Option<ReduceTuneTable>) -> Self {
        self.reduce_tuning.table = Some(table);
        self
    }

    /// Sizes the reductions' window holds beyond the settings' (the line one-shot's payload,
    /// the two-shot on lines' size; `chunk_bytes` must be the configuration's round), as a
    /// tuning run asks so that its candidates beyond the default limits fit. The default plans
    /// keep choosing by the settings. Every rank must pass the same.
    pub fn reduce_window(mut self, window: TunedWindow) -> Self {
        self.reduce_tuning.window = Some(window);
        self
    }

    /// Sizes of the send/recv window (staging slots, depth, blocks); every rank must pass the
    /// same values. A `max_blocks` whose launches cannot all be resident on the smallest GPU
    /// of the group makes `build` fail (the default is lowered to fit instead).
    pub fn p2p_limits(mut self, limits: P2PLimits) -> Self {
        self.p2p_limits = Some(limits);
        self
    }

    /// The send/recv window: given in code, or from the configuration; and whether its
    /// `max_blocks` was asked for rather than the default, which is lowered to fit a GPU with
    /// few SMs (`p2p::fit_to_sms`).
    fn window(&self) -> (P2PLimits, bool) {
        if let Some(limits) = self.p2p_limits {
            return (limits, true);
        }
        let c = &self.config;
        let default = P2PLimits::default();
        let limits = P2PLimits {
            slot_bytes: u64::from(c.p2p_slot_kib) << 10,
            depth: c.p2p_depth,
            max_blocks: c.p2p_max_blocks.unwrap_or(default.max_blocks),
            ..default
        };
        (limits, c.p2p_max_blocks.is_some())
    }

    /// Collective: joins the group, opens the GPU, discovers the topology and creates the
    /// communicator's send/recv window. Every rank gets the communicator or an error.
    pub fn build(mut self) -> Result<Comm> {
        self.config.validate()?;
        let rank = self.info.rank;
        let setup_timeout = self.config.setup_timeout;
        let store = match self.store.take() {
            Some(store) => store,
            None => Store::connect(&self.info, setup_timeout)?,
        };
        // Before any CUDA call: ranks whose must-agree settings differ fail here, all alike.
        agree_on_config(&store, rank, &self.config)?;
        let (window, max_blocks_explicit) = self.window();
        // cudarc panics in its loader without a driver: ask first (the error goes through the
        // agreement below like any other failure to open the device).
        let ordinal = crate::cuda::ensure_driver().and_then(|()| match self.device {
            Some(d) => Ok(d),
            None => CudaContext::device_count()
                .cuda(rank as i32, "cuDeviceGetCount")
                .and_then(|count| {
                    default_ordinal(self.info.local_rank, count, self.config.share_gpu)
                }),
        });
        // Every rank's outcome goes through the agreement, so a rank that cannot open its GPU
        // fails the others at once instead of leaving them to time out.
        let opened = ordinal
            .and_then(|o| CudaContext::new(o).cuda(rank as i32, "cuCtxCreate (CudaContext::new)"));
        let opened = opened.and_then(|ctx| match &self.stream {
            Some(s) if s.context().cu_ctx() != ctx.cu_ctx() => Err(crate::Error::InvalidArgument {
                op: "CommBuilder::stream",
                reason: format!(
                    "rank {rank}: the stream belongs to another context than device {}'s \
                     primary context",
                    ctx.ordinal()
                ),
            }),
            _ => Ok(ctx),
        });
        let ctx = agree_on_store(&store, "open device", rank, opened, setup_timeout)?;
        let device = agree_on_store(
            &store,
            "query device",
            rank,
            DeviceInfo::query(&ctx).map_err(|e| crate::cuda::with_rank(e, rank)),
            setup_timeout,
        )?;
        // The send/recv window is sized for the GPU with the fewest SMs (an MPS share, say).
        let sms = store.all_gather(
            "__devcomm/p2p/sm_count",
            &device.sm_count.to_le_bytes(),
            setup_timeout,
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
            crate::p2p::fit_to_sms(window, max_blocks_explicit, fewest_sms),
            setup_timeout,
        )?;
        if p2p_limits != window {
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
            self.tune_table_to_use().and_then(|table| match table {
                Some(t) => t.validate(&p2p_limits, &device.name).map(|()| Some(t)),
                None => Ok(None),
            }),
            setup_timeout,
        )?;
        same_table_everywhere(
            &store,
            rank,
            &SEND_RECV_TABLE,
            tune.as_ref().map(TuneTable::fingerprint),
            setup_timeout,
        )?;
        let reduce_tuning = agree_on_store(
            &store,
            "reduction tuning table",
            rank,
            reduce_tuning(
                &self.reduce_tuning,
                &self.config,
                crate::reduce::tune_builtin::BUILTIN,
                &device.name,
                self.info.world_size,
            ),
            setup_timeout,
        )?;
        same_table_everywhere(
            &store,
            rank,
            &REDUCTION_TABLE,
            reduce_tuning
                .table
                .as_ref()
                .map(ReduceTuneTable::fingerprint),
            setup_timeout,
        )?;
        same_table_everywhere(
            &store,
            rank,
            &REDUCTION_WINDOW,
            reduce_tuning.window.as_ref().map(TunedWindow::fingerprint),
            setup_timeout,
        )?;
        let topology = Topology::discover(
            rank,
            self.info.world_size,
            &store,
            &ctx,
            &device,
            &self.config,
        )?;
        let mesh = crate::mesh::Mesh::agree(&store, &topology, setup_timeout)?;
        let errors = agree_on_store(
            &store,
            "error state",
            rank,
            ErrorState::new(&ctx, rank),
            setup_timeout,
        )?;
        let local_rank = if self.local_from_topology {
            let local = topology.local_ranks();
            local.iter().position(|&r| r == rank).unwrap_or(0)
        } else {
            self.info.local_rank
        };
        let group = Arc::new(Group::new(
            rank,
            self.info.world_size,
            store,
            ctx,
            (topology, mesh),
            errors,
            Arc::new(self.config.clone()),
        ));
        let p2p = P2P::new(&group, p2p_limits, tune)?;
        let coll = Collective::new(&group, device.sm_count)?;
        let reduce =
            crate::reduce::family::Reductions::new(&group, device.sm_count, reduce_tuning)?;
        let registry = Arc::new(Registry::new());
        let comm = Comm {
            pool: Pool::new(&group, registry.clone()),
            p2p,
            coll,
            reduce,
            local_rank,
            device,
            jit: Jit::from_config(&self.config),
            registry,
            stream: self.stream,
            group,
        };
        if let Some(stream) = &comm.stream {
            comm.p2p.bind(&comm.group, stream)?;
        }
        if self.config.trace {
            // Every rank takes this step: the setting must agree (a setup error otherwise).
            let trace = agree_on_store(
                &comm.group.store,
                "trace ring",
                rank,
                crate::kernels::load(&comm.group, &comm.jit, KernelKind::TraceClock, false)
                    .and_then(|clock| {
                        let g = &comm.group;
                        crate::trace::DeviceTrace::new(
                            &g.ctx,
                            rank,
                            self.config.trace_events,
                            clock,
                        )
                    }),
                setup_timeout,
            )?;
            // Set before any traced module is loaded (the clock kernel is not one):
            // `kernels::load` attaches each to it.
            let _ = comm.group.trace.set(trace);
        }
        if self.config.pool_mib > 0 {
            comm.grow_pool(self.config.pool_mib as usize * (1 << 20))?;
        }
        log::debug!("rank {rank}: communicator ready on {}", comm.device.name);
        Ok(comm)
    }

    /// The tuning table: the one given in code, else the configuration's file, if any.
    fn tune_table_to_use(&self) -> Result<Option<TuneTable>> {
        match (&self.tune, &self.config.tune_file) {
            (Some(table), _) => Ok(table.clone()),
            (None, Some(path)) => TuneTable::load(path).map(Some),
            (None, None) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devcomm_bootstrap::StoreAddress;

    const T: Duration = Duration::from_secs(20);

    /// Two ranks (rank 1 on a thread) join a fresh store first, as a caller meeting through
    /// another channel would, and build on it with settings that disagree: the agreement,
    /// which runs on the given store before any CUDA call, fails on both ranks alike. Had
    /// `build` connected a store of its own (on 127.0.0.1:29500), the ranks would not meet.
    #[test]
    #[allow(clippy::field_reassign_with_default)] // one setting changed on purpose
    fn builds_on_a_store_joined_first() {
        let s0 = Store::host_fresh(&RankInfo::new(0, 2), "127.0.0.1", T).expect("host");
        let address = s0.address().expect("token").encode();
        let rank1 = std::thread::spawn(move || {
            let a = StoreAddress::parse(&address).expect("address");
            let s1 = Store::join_address(&RankInfo::new(1, 2), &a, T).expect("join");
            let mut other = Config::default();
            other.p2p_ll128 = false;
            let b = CommBuilder::on_store_with_config(s1, other);
            assert_eq!((b.info.rank, b.info.world_size), (1, 2));
            b.build().map(|_| ())
        });
        let b = CommBuilder::on_store_with_config(s0, Config::default());
        assert_eq!((b.info.rank, b.info.world_size), (0, 2));
        let r0 = b.build().map(|_| ());
        let r1 = rank1.join().expect("rank 1 thread");
        for r in [r0, r1] {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("DEVCOMM_P2P_LL128") && e.contains("on rank(s) [1]"),
                "{e}"
            );
        }
    }
}
