//! [`CommBuilder`]: explicit settings, and the collective setup of a communicator.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use devcomm_bootstrap::{RankInfo, Store};

use super::env::{
    duration_env, p2p_limits_env, DEFAULT_DEVICE_TIMEOUT, DEFAULT_SETUP_TIMEOUT, P2P_MAX_BLOCKS_ENV,
};
use super::setup::{agree_on_store, default_ordinal, same_table_everywhere};
use super::{Comm, SETUP_TIMEOUT_ENV, TIMEOUT_ENV};
use crate::collective::Collective;
use crate::cuda::info::DeviceInfo;
use crate::cuda::ErrorState;
use crate::error::{CudaResultExt, Result};
use crate::group::Group;
use crate::jit::Jit;
use crate::memory::Registry;
use crate::p2p::{P2PLimits, TuneTable, P2P, TUNE_FILE_ENV};
use crate::topology::Topology;

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
    /// communicator's send/recv window. Every rank gets the communicator or an error.
    pub fn build(self) -> Result<Comm> {
        let rank = self.info.rank;
        let store = Store::connect(&self.info, self.setup_timeout)?;
        // cudarc panics in its loader without a driver: ask first (the error goes through the
        // agreement below like any other failure to open the device).
        let ordinal = crate::cuda::ensure_driver().and_then(|()| match self.device {
            Some(d) => Ok(d),
            None => CudaContext::device_count()
                .cuda(rank as i32, "cuDeviceGetCount")
                .and_then(|count| {
                    default_ordinal(self.info.local_rank, count, crate::topology::share_gpu())
                }),
        });
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
        let p2p = P2P::new(&group, p2p_limits, tune)?;
        let coll = Collective::new(&group, device.sm_count)?;
        let comm = Comm {
            p2p,
            coll,
            local_rank: self.info.local_rank,
            device,
            jit: Jit::new(),
            registry: Registry::new(),
            group,
        };
        log::debug!("rank {rank}: communicator ready on {}", comm.device.name);
        Ok(comm)
    }
}
