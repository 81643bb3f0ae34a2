//! Send/recv over NVLink (docs/PROTOCOL.md): the p2p window, the per-(peer, block) step
//! counters, the guard before launch, and the launch of the fused send/recv kernel.
//!
//! Files: `plan.rs` decides a call (protocol, kernels, grids) as a pure function;
//! `launch.rs` carries a plan out; `copy_engine.rs` and `zero_copy.rs` are the copy-engine
//! and zero-copy paths; `kernels.rs` the kernel source and names; `protocol.rs`,
//! `window.rs`, `defaults.rs`, `sweep.rs`, `env.rs` the knobs (with `crate::abi`, re-exported by
//! `config`); `tune.rs` the tuning table. The kernels' argument structs are `crate::abi`'s.

mod barrier;
pub mod config;
mod copy_engine;
pub mod defaults;
mod kernels;
mod launch;
pub(crate) mod net;
mod net_keys;
pub(crate) mod plan;
pub mod protocol;
pub(crate) mod registered;
pub mod sweep;
pub mod switches;
pub mod tune;
pub mod window;
mod zero_copy;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream};

pub use config::{
    ce_config, ce_pulled, default_config, fit_to_sms, pull_by_default, staged_config,
    sweep_configs, zero_copy_blocks, zero_copy_route, P2PConfig, P2PLimits, Protocol, ZcRoute,
    CE_DEC_R, CE_DEC_S, CE_DEFAULT_MIN, CE_DONE, CE_DONE_R, CE_GO, CE_GO_R, CE_SIZE, CE_SLOTS,
    CE_WORDS, P2P_SIDE_ANNOUNCE, P2P_SIDE_GATED, P2P_SIDE_PULL,
};
pub use kernels::SENDRECV_SOURCE;
pub(crate) use kernels::{sendrecv_spec, KernelKey, NET_THREADS};

/// The send/recv module under `config` (`DEVCOMM_P2P_OPTIONS`, tracing): what its load path
/// loads and `crate::kernels::kernel_spec` returns.
pub(crate) fn module_spec(config: &crate::config::Config) -> crate::jit::KernelSpec {
    crate::kernel_load::configured(sendrecv_spec(), &config.p2p_options, config.trace)
}
pub use switches::Switches;
pub use tune::{TuneEntry, TuneTable, TUNE_FILE_ENV};
pub(crate) use zero_copy::ZcRole;

use crate::abi::{P2PLaunch, P2PSide};

use crate::cuda::InternalStream;
use crate::error::{CudaResultExt, Error, Result};
use crate::group::{Group, KernelGate};
use crate::jit::{Jit, LoadedModule};
use crate::window::Window;

/// One direction of a send/recv call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Device address of the source (send) or destination (recv).
    pub ptr: u64,
    /// Bytes to move.
    pub bytes: u64,
    /// The peer rank.
    pub peer: usize,
    /// Launch knobs; `None` takes the default for the size. Sender and receiver of one message
    /// must use the same protocol, block count and chunk size.
    pub config: Option<P2PConfig>,
}

// Counter arrays: bulk steps [world][max_channels], low-latency calls [world][max_blocks],
// zero-copy send calls [world][max_blocks], zero-copy receive calls [world].
#[derive(Debug, Clone, Copy)]
pub(super) enum Counter {
    SendSteps,
    RecvSteps,
    LlSend,
    LlRecv,
    ZcSend,
    ZcRecv,
}

/// Per-communicator send/recv state (one signal namespace, bound to one stream).
#[derive(Debug)]
pub(crate) struct P2P {
    /// The network transport, in a job with network links (first: it stops its proxy and
    /// leaves the job before the memory below goes).
    net: Option<net::NetPeers>,
    limits: P2PLimits,
    window: Window<u8>,
    /// Owns the memory `counters_base` points into.
    _counters: CudaSlice<u64>,
    counters_base: u64,
    pub(crate) bound_stream: Mutex<Option<usize>>,
    module: OnceLock<Arc<LoadedModule>>,
    /// Peers known to have loaded `module` (see [`KernelGate`]).
    gate: KernelGate,
    functions: Mutex<HashMap<KernelKey, CudaFunction>>,
    /// The configuration's send/recv switches.
    switches: Switches,
    /// The measured configurations, checked against `limits` and equal on every rank.
    tune: Option<TuneTable>,
    /// Streams of copy-engine messages.
    ce: CeStreams,
}

/// The streams a copy-engine message forks onto from the caller's stream (and joins back):
/// the pacing kernel and the copies must run beside each other and beside any kernel of the
/// other direction.
#[derive(Debug)]
struct CeStreams {
    pace: InternalStream,
    /// Pushed chunks queue on the first; `DEVCOMM_P2P_CE_STREAMS=2` alternates the two
    /// (docs/PERFORMANCE.md, v15).
    copy: [InternalStream; 2],
    recv: InternalStream,
    /// The receiver's copy stream: pulled chunks, from the sender's outbox into the
    /// destination. Apart from the sender's streams: in a launch that sends and receives by
    /// copy engine, a pull queued behind this rank's pushes (which wait on the peer) could
    /// wait on itself through the peer.
    pull: InternalStream,
}

impl P2P {
    /// Collective: creates the p2p window (staging for every sender, signal pad) and zeroed
    /// counters.
    pub(crate) fn new(
        group: &Arc<Group>,
        limits: P2PLimits,
        tune: Option<TuneTable>,
    ) -> Result<Self> {
        let world = group.world_size;
        let data =
            usize::try_from(limits.window_bytes(world)).map_err(|_| Error::InvalidArgument {
                op: "p2p setup",
                reason: "staging regions do not fit in memory".into(),
            })?;
        let window = Window::<u8>::new(group, data, limits.signal_slots(world))?;
        let rank = group.rank as i32;
        let stream = group.ctx.default_stream();
        let n = 2 * world * (limits.max_channels() + limits.max_blocks) as usize
            + world * (limits.max_blocks as usize + 1);
        let counters = stream
            .alloc_zeros::<u64>(n)
            .cuda(rank, "cuMemAlloc (p2p counters)")?;
        stream.synchronize().cuda(rank, "cuStreamSynchronize")?;
        // Made now, not at the first copy-engine message, which may come inside a graph
        // capture; outside cudarc's stream count, so that the caller's context stays in the
        // mode it was in (InternalStream's doc).
        let new =
            || InternalStream::new(&group.ctx).map_err(|e| crate::cuda::with_rank(e, group.rank));
        let ce = CeStreams {
            pace: new()?,
            copy: [new()?, new()?],
            recv: new()?,
            pull: new()?,
        };
        let counters_base = {
            use cudarc::driver::DevicePtr;
            let (p, _sync) = counters.device_ptr(&stream);
            p
        };
        let net = net::NetPeers::new(group)?;
        Ok(Self {
            net,
            limits,
            window,
            _counters: counters,
            counters_base,
            bound_stream: Mutex::new(None),
            module: OnceLock::new(),
            gate: KernelGate::new("sendrecv", world),
            functions: Mutex::new(HashMap::new()),
            switches: Switches::from_config(&group.config),
            tune,
            ce,
        })
    }

    /// The configuration a call of `bytes` without an explicit one uses: the tuning table's
    /// bucket when a table is loaded and covers the size, the built-in defaults otherwise.
    pub(crate) fn config_for(&self, bytes: u64) -> P2PConfig {
        self.tune
            .as_ref()
            .and_then(|t| t.config_for(bytes))
            .unwrap_or_else(|| default_config(bytes, &self.limits, &self.switches))
    }

    /// The configuration's send/recv switches.
    pub(crate) fn switches(&self) -> &Switches {
        &self.switches
    }

    /// The loaded tuning table.
    pub(crate) fn tune_table(&self) -> Option<&TuneTable> {
        self.tune.as_ref()
    }

    /// The window sizes.
    pub(crate) fn limits(&self) -> &P2PLimits {
        &self.limits
    }

    pub(super) fn counter_ptr(&self, counter: Counter, peer: usize, world: usize) -> u64 {
        let ch = self.limits.max_channels() as usize;
        let bl = self.limits.max_blocks as usize;
        let index = match counter {
            Counter::SendSteps => peer * ch,
            Counter::RecvSteps => (world + peer) * ch,
            Counter::LlSend => 2 * world * ch + peer * bl,
            Counter::LlRecv => 2 * world * ch + (world + peer) * bl,
            Counter::ZcSend => 2 * world * (ch + bl) + peer * bl,
            Counter::ZcRecv => 2 * world * (ch + bl) + world * bl + peer,
        };
        self.counters_base + (index * std::mem::size_of::<u64>()) as u64
    }

    /// The launch arguments every kernel on this namespace shares (no roles set).
    pub(crate) fn base_launch(&self) -> P2PLaunch {
        let w = self.window.device_handle();
        P2PLaunch {
            w,
            send: P2PSide::unused(),
            recv: P2PSide::unused(),
            slot_stride: self.limits.slot_bytes,
            region_bytes: self.limits.region_bytes(),
            ll_offset: self.limits.ll_offset(),
            ll_parity_bytes: self.limits.ll_parity_bytes(),
            max_blocks: self.limits.max_blocks,
            depth: self.limits.depth,
            max_channels: self.limits.max_channels(),
            mode_slot0: self.limits.mode_slot0(w.world_size as usize) as u32,
        }
    }

    /// Device address of the counter arrays (layout: [`Counter`]).
    pub(crate) fn counters_base(&self) -> u64 {
        self.counters_base
    }

    pub(super) fn check_peer(&self, group: &Group, op: &'static str, peer: usize) -> Result<()> {
        if peer >= group.world_size {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "peer {peer} is not a rank (world size {})",
                    group.world_size
                ),
            });
        }
        if peer == group.rank {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("peer {peer} is this rank; copy locally instead"),
            });
        }
        group.mesh.check_nvlink_peer(op, peer)
    }

    /// Binds the namespace to the first stream used; another stream is refused, because two
    /// streams on one set of counters would race.
    pub(crate) fn bind(&self, group: &Group, stream: &Arc<CudaStream>) -> Result<()> {
        let raw = stream.cu_stream() as usize;
        let mut bound = self.bound_stream.lock().map_err(|_| Error::Aborted {
            rank: group.rank as i32,
            reason: "a thread panicked during send/recv".into(),
        })?;
        match *bound {
            None => {
                *bound = Some(raw);
                Ok(())
            }
            Some(b) if b == raw => Ok(()),
            Some(b) => Err(Error::InvalidArgument {
                op: "send/recv",
                reason: format!(
                    "this communicator's send/recv namespace is bound to stream {b:#x}; stream \
                     {raw:#x} would race on its counters (use one stream per communicator)"
                ),
            }),
        }
    }

    /// Loads the send/recv module (once) and waits until `peers` (-1: none) have loaded it
    /// too, so that no kernel of this call waits on the device for a rank still compiling.
    pub(crate) fn ready(&self, group: &Group, jit: &Jit, peers: [i32; 2]) -> Result<()> {
        self.module(group, jit)?;
        let peers = peers.into_iter().filter_map(|p| usize::try_from(p).ok());
        self.gate.pass(group, peers)
    }

    /// The send/recv module, loaded on first use.
    fn module(&self, group: &Group, jit: &Jit) -> Result<&Arc<LoadedModule>> {
        if let Some(m) = self.module.get() {
            return Ok(m);
        }
        // Every kernel now: under the driver's lazy loading a kernel's first launch can wait
        // for kernels already running, and a negotiating role's kernels are enqueued behind
        // one that waits on the peer (seen on 2 H200s: the first large both-ways call stalled
        // until that wait timed out).
        let m = crate::kernel_load::load(group, jit, &module_spec(&group.config))?;
        Ok(self.module.get_or_init(|| m))
    }

    pub(crate) fn function(
        &self,
        group: &Group,
        jit: &Jit,
        key: KernelKey,
    ) -> Result<CudaFunction> {
        let poisoned = || Error::Aborted {
            rank: group.rank as i32,
            reason: "a thread panicked while loading kernels".into(),
        };
        if let Some(f) = self.functions.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(f.clone());
        }
        let f = self.module(group, jit)?.function(&key.expression())?;
        self.functions
            .lock()
            .map_err(|_| poisoned())?
            .insert(key, f.clone());
        Ok(f)
    }
}
