//! Send/recv over NVLink (docs/PROTOCOL.md): the p2p window, the per-(peer, block) step
//! counters, the guard before launch, and the launch of the fused send/recv kernel.

pub mod config;
pub mod handle;
pub mod tune;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream};

pub use config::{
    auto_pull, ce_config, ce_pulled, default_config, fit_to_sms, staged_config, sweep_configs,
    zero_copy_blocks, zero_copy_ce_min, zero_copy_route, P2PConfig, P2PLimits, Protocol, ZcRoute,
    CE_DEC_R, CE_DEC_S, CE_DEFAULT_MIN, CE_DONE, CE_DONE_R, CE_GO, CE_GO_R, CE_SIZE, CE_SLOTS,
    CE_WORDS, P2P_SIDE_ANNOUNCE, P2P_SIDE_GATED, P2P_SIDE_PULL,
};

use config::MAX_ROLE_THREADS;
use handle::{P2PLaunch, P2PNegotiated, P2PSide, ZcLaunch};
pub use tune::{TuneEntry, TuneTable, TUNE_FILE_ENV};

use crate::cuda::{launch_struct, linear_launch, InternalStream};
use crate::error::{CudaResultExt, Error, Result};
use crate::group::{Group, KernelGate};
use crate::jit::{Jit, KernelSpec, LoadedModule};
use crate::topology::LinkKind;
use crate::window::Window;

/// The send/recv kernels' source.
pub const SENDRECV_SOURCE: &str = include_str!("../../cuda/kernels/sendrecv.cu");

/// Threads per role that kernels are instantiated for.
const ROLE_THREADS: [u32; 3] = [0, 256, 512];

fn kernel_expression(send_threads: u32, recv_threads: u32) -> String {
    format!("devcomm::p2p::p2p_kernel<{send_threads}, {recv_threads}>")
}

fn split_expression(threads: u32, interleave: bool) -> String {
    format!("devcomm::p2p::p2p_split_kernel<{threads}, {interleave}>")
}

/// Environment variable: `0` gives the split kernel's roles runs of consecutive blocks (all
/// senders, then all receivers) instead of taking blocks in turn (docs/PERFORMANCE.md, v12).
/// Only which block serves which (role, index) changes, not the channels, so ranks may differ.
pub const INTERLEAVE_ENV: &str = "DEVCOMM_P2P_INTERLEAVE";

fn split_interleave() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var(INTERLEAVE_ENV).map_or(true, |v| v.trim() != "0"))
}

/// A loaded kernel of the send/recv module; its name expression is made only on a cache miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum KernelKey {
    /// `p2p_kernel<SEND_THREADS, RECV_THREADS>`.
    Fused(u32, u32),
    /// `p2p_split_kernel<THREADS, INTERLEAVE>`.
    Split(u32, bool),
    /// `p2p_zc_kernel<ZC_THREADS>`.
    ZeroCopy,
    /// `p2p_ce_send_kernel<CE_SEND_THREADS>` (the copy-engine pacer and outbox fillers).
    CeSend,
    /// `p2p_ce_recv_kernel<THREADS>`.
    CeRecv(u32),
    /// `p2p_zc_ce_kernel` (the pacer of a zero-copy send by copy engine).
    ZeroCopyCe,
    /// `p2p_negotiated_kernel<MAX_ROLE_THREADS, INTERLEAVE>` (a launch with two roles and a
    /// negotiated large message).
    Negotiated(bool),
}

impl KernelKey {
    fn expression(self) -> String {
        match self {
            Self::Fused(s, r) => kernel_expression(s, r),
            Self::Split(t, i) => split_expression(t, i),
            Self::ZeroCopy => zc_expression(),
            Self::CeSend => ce_send_expression(),
            Self::CeRecv(t) => ce_recv_expression(t),
            Self::ZeroCopyCe => ZC_CE_EXPRESSION.to_owned(),
            Self::Negotiated(i) => negotiated_expression(i),
        }
    }
}

/// Threads per block of the zero-copy kernel.
const ZC_THREADS: u32 = 512;

fn zc_expression() -> String {
    format!("devcomm::p2p::p2p_zc_kernel<{ZC_THREADS}>")
}

/// Threads per block of the copy-engine sender (block 0's first warp paces, the other blocks
/// copy pulled chunks into the outbox).
const CE_SEND_THREADS: u32 = 512;
fn ce_send_expression() -> String {
    format!("devcomm::p2p::p2p_ce_send_kernel<{CE_SEND_THREADS}>")
}
const ZC_CE_EXPRESSION: &str = "devcomm::p2p::p2p_zc_ce_kernel";
fn negotiated_expression(interleave: bool) -> String {
    format!("devcomm::p2p::p2p_negotiated_kernel<{MAX_ROLE_THREADS}, {interleave}>")
}

fn ce_recv_expression(threads: u32) -> String {
    format!("devcomm::p2p::p2p_ce_recv_kernel<{threads}>")
}

/// Environment variable: `2` alternates the pushed copy-engine chunks between two copy
/// streams (for comparison; the default queues them on one). Only the sender's setting
/// matters.
pub const CE_STREAMS_ENV: &str = "DEVCOMM_P2P_CE_STREAMS";

/// Copy streams for pushed chunks. One: two streams let the copy engine run two pushes at once,
/// each at half the link, so both slots wait to be copied out at the same time and the link
/// idles meanwhile (1 GiB one way: 375 GB/s on two streams, 393 on one; docs/PERFORMANCE.md,
/// v15).
fn ce_copy_streams() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(
        || match std::env::var(CE_STREAMS_ENV).as_deref().map(str::trim) {
            Ok("2") => 2,
            _ => 1,
        },
    )
}

/// Environment variable: which engines a launch that sends to and receives from the same peer
/// by copy engine uses for its copy-engine halves, as `SEND-RECV` with each of `ce` or `sm`
/// (the pushed chunks of its send, the pulled chunks of its receive). A one-way launch always
/// uses the copy engine for both. Each side's choice is its own: the slots and signals are
/// the same either way.
pub const CE_BOTH_ENV: &str = "DEVCOMM_P2P_CE_BOTH";

/// Whether the sending (`send`) or receiving side of a copy-engine message with an explicit
/// configuration moves its copy-engine half by SMs: only in a launch that also moves data the
/// other way with the same peer (`both_ways`), as [`CE_BOTH_ENV`] says (default `sm-ce`: SMs
/// push, the receiver's copy engine pulls, the fastest of the four both ways:
/// docs/PERFORMANCE.md, v15).
fn ce_by_sm(send: bool, both_ways: bool) -> bool {
    static MODE: OnceLock<[bool; 2]> = OnceLock::new();
    let mode = MODE.get_or_init(|| parse_ce_both(&std::env::var(CE_BOTH_ENV).unwrap_or_default()));
    both_ways && mode[usize::from(!send)]
}

/// [`CE_BOTH_ENV`]'s value as [send role by SMs, receive role by SMs]; anything but the
/// other engine keeps a role's default (SMs push, the copy engine pulls).
fn parse_ce_both(value: &str) -> [bool; 2] {
    let mut parts = value.trim().split('-');
    let send_sm = parts.next() != Some("ce");
    let recv_sm = parts.next() == Some("sm");
    [send_sm, recv_sm]
}

/// Environment variable: `0` runs both directions in one block per index (warp-specialised
/// roles sharing a CTA); otherwise, when both roles have the same thread count, sender and
/// receiver roles get blocks of their own in the same launch.
pub const SPLIT_ENV: &str = "DEVCOMM_P2P_SPLIT";

/// The kernel spec with every (send threads, recv threads) instantiation.
pub fn sendrecv_spec() -> KernelSpec {
    static OPTIONS: OnceLock<Vec<String>> = OnceLock::new();
    let mut spec = KernelSpec::new("sendrecv", SENDRECV_SOURCE)
        .name_expression(zc_expression())
        .name_expression(ce_send_expression())
        .name_expression(ZC_CE_EXPRESSION.to_owned())
        .name_expression(negotiated_expression(true))
        .name_expression(negotiated_expression(false));
    for t in [256, 512] {
        spec = spec
            .name_expression(split_expression(t, true))
            .name_expression(split_expression(t, false))
            .name_expression(ce_recv_expression(t));
    }
    for s in ROLE_THREADS {
        for r in ROLE_THREADS {
            if s + r > 0 {
                spec = spec.name_expression(kernel_expression(s, r));
            }
        }
    }
    spec.options.extend(
        OPTIONS
            .get_or_init(|| crate::jit::env_options(P2P_OPTIONS_ENV))
            .iter()
            .cloned(),
    );
    spec
}

/// `DEVCOMM_P2P_OPTIONS`: extra NVRTC options for the send/recv kernels, split at whitespace
/// (e.g. `-DDC_LL128_UNROLL=4`, docs/TUNING.md). For experiments: both ends of a transfer must
/// use the same. Part of the kernel cache's key.
pub const P2P_OPTIONS_ENV: &str = "DEVCOMM_P2P_OPTIONS";

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

/// One role of a zero-copy call: `bytes` between `buf` (the source when sending, this rank's
/// destination when receiving) and `peer`, landing in registration `reg` at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZcRole {
    pub buf: u64,
    pub bytes: u64,
    pub peer: usize,
    pub reg: u64,
    pub offset: u64,
    /// Sending: the destination as mapped here (`peer`'s registered buffer plus `offset`).
    /// Receiving: unused (0).
    pub remote: u64,
}

// Counter arrays: bulk steps [world][max_channels], low-latency calls [world][max_blocks],
// zero-copy send calls [world][max_blocks], zero-copy receive calls [world].
#[derive(Debug, Clone, Copy)]
enum Counter {
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
    /// Both directions in separate blocks (see [`SPLIT_ENV`]).
    split: bool,
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
        Ok(Self {
            limits,
            window,
            _counters: counters,
            counters_base,
            bound_stream: Mutex::new(None),
            module: OnceLock::new(),
            gate: KernelGate::new("sendrecv", world),
            functions: Mutex::new(HashMap::new()),
            split: std::env::var(SPLIT_ENV).map_or(true, |v| v.trim() != "0"),
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
            .unwrap_or_else(|| default_config(bytes, &self.limits))
    }

    /// The loaded tuning table.
    pub(crate) fn tune_table(&self) -> Option<&TuneTable> {
        self.tune.as_ref()
    }

    /// The window sizes.
    pub(crate) fn limits(&self) -> &P2PLimits {
        &self.limits
    }

    fn counter_ptr(&self, counter: Counter, peer: usize, world: usize) -> u64 {
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

    /// The guard before launch, then the launch. Nothing is written when it returns an error.
    pub(crate) fn launch(
        &self,
        group: &Group,
        jit: &Jit,
        send: Option<Transfer>,
        recv: Option<Transfer>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        group.errors.check()?;
        self.bind(group, stream)?;
        let world = group.world_size;
        let send = send.filter(|t| t.bytes > 0);
        let recv = recv.filter(|t| t.bytes > 0);
        // Per role: the side for the SM kernel and the side for the copy-engine kernels (a
        // negotiated role of a launch with two roles has both, each gated on the decision).
        let mut sm = [P2PSide::unused(); 2];
        let mut ce = [P2PSide::unused(); 2];
        let mut sm_threads = [0u32; 2];
        let mut ce_threads = [0u32; 2];
        let alone = send.is_none() || recv.is_none();
        for (i, t) in [send, recv].iter().enumerate() {
            let Some(t) = t else { continue };
            let op = if i == 0 { "send" } else { "recv" };
            self.check_peer(group, op, t.peer)?;
            let cfg = t.config.unwrap_or_else(|| self.config_for(t.bytes));
            // A large message on the built-in defaults: its layout is negotiated (p2p.cuh).
            let negotiated = t.config.is_none()
                && cfg.protocol == Protocol::CopyEngine
                && self
                    .tune
                    .as_ref()
                    .and_then(|x| x.config_for(t.bytes))
                    .is_none();
            let kind = if i == 0 {
                (Counter::SendSteps, Counter::LlSend)
            } else {
                (Counter::RecvSteps, Counter::LlRecv)
            };
            // The same launch also moves data the other way with this peer.
            let other = if i == 0 { recv } else { send };
            let both_ways = other.is_some_and(|o| o.peer == t.peer);
            let side = |cfg: P2PConfig, flags: u32| -> Result<P2PSide> {
                cfg.check(op, t.bytes, &self.limits)
                    .map_err(|e| with_peer(e, t.peer))?;
                Ok(P2PSide {
                    buf: t.ptr,
                    bytes: t.bytes,
                    steps: self.counter_ptr(kind.0, t.peer, world),
                    ll_steps: self.counter_ptr(kind.1, t.peer, world),
                    chunk_bytes: cfg.chunk_bytes,
                    peer: t.peer as i32,
                    blocks: cfg.blocks,
                    low_latency: cfg.protocol.line_kind(),
                    pull: flags
                        | u32::from(match cfg.protocol {
                            Protocol::Pull => i == 0,
                            Protocol::Bulk => i == 0 && auto_pull(t.bytes, both_ways),
                            Protocol::CopyEngine => flags == 0 && ce_by_sm(i == 0, both_ways),
                            Protocol::Push | Protocol::LowLatency | Protocol::LowLatency128 => {
                                false
                            }
                        }),
                })
            };
            if negotiated && !alone {
                // Both layouts, gated: the copy-engine one by SMs (a host-enqueued copy could
                // not be called off), the staged one as without the copy engine.
                let staged = staged_config(t.bytes, &self.limits);
                sm[i] = side(staged, P2P_SIDE_GATED)?;
                sm_threads[i] = staged.threads;
                ce[i] = side(cfg, P2P_SIDE_GATED | P2P_SIDE_PULL)?;
                ce_threads[i] = cfg.threads;
            } else if cfg.protocol == Protocol::CopyEngine {
                let flags = if negotiated { P2P_SIDE_ANNOUNCE } else { 0 };
                ce[i] = side(cfg, flags)?;
                ce_threads[i] = cfg.threads;
            } else {
                sm[i] = side(cfg, 0)?;
                sm_threads[i] = cfg.threads;
            }
        }
        let peer = |i: usize| sm[i].peer.max(ce[i].peer);
        if peer(0) < 0 && peer(1) < 0 {
            return Ok(()); // nothing to move
        }
        self.ready(group, jit, [peer(0), peer(1)])?;
        // A negotiated role's copy-engine side rides in the SM kernel (moved by SMs when
        // chosen); only the other copy-engine roles need the copy-engine streams.
        let gated = [0, 1].map(|i| ce[i].pull & P2P_SIDE_GATED != 0);
        let unless = |want: bool| {
            [0, 1].map(|i| {
                if gated[i] == want {
                    ce[i]
                } else {
                    P2PSide::unused()
                }
            })
        };
        let (negotiated, ce) = (unless(true), unless(false));
        if ce[0].peer >= 0 || ce[1].peer >= 0 {
            return self.launch_with_copy_engine(
                group,
                jit,
                [sm, negotiated],
                ce,
                sm_threads,
                ce_threads,
                stream,
            );
        }
        self.launch_sm(group, jit, [sm, negotiated], sm_threads, stream)
    }

    /// Launches the SM kernel for the roles in `sides` (either may be unused, not both), whose
    /// negotiated ones (`P2P_SIDE_GATED`) have their copy-engine side in `negotiated`: then
    /// `p2p_negotiated_kernel`, where each such role decides its layout on the GPU.
    fn launch_sm(
        &self,
        group: &Group,
        jit: &Jit,
        [sides, negotiated]: [[P2PSide; 2]; 2],
        threads: [u32; 2],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let args = P2PLaunch {
            send: sides[0],
            recv: sides[1],
            ..self.base_launch()
        };
        if negotiated[0].peer >= 0 || negotiated[1].peer >= 0 {
            return self.launch_negotiated(group, jit, args, negotiated, threads, stream);
        }
        let split =
            self.split && sides[0].peer >= 0 && sides[1].peer >= 0 && threads[0] == threads[1];
        // Split: each role in blocks of its own; fused: both roles in every block.
        let (key, cfg) = if split {
            let blocks = sides[0].blocks + sides[1].blocks;
            (
                KernelKey::Split(threads[0], split_interleave()),
                linear_launch(blocks, threads[0]),
            )
        } else {
            let blocks = sides[0].blocks.max(sides[1].blocks);
            let key = KernelKey::Fused(threads[0], threads[1]);
            (key, linear_launch(blocks, threads[0] + threads[1]))
        };
        let func = self.function(group, jit, key)?;
        // SAFETY: p2p_kernel<S, R>(P2PLaunch) takes exactly this struct by value and enters
        // through enter_after_previous_kernel; its pointers are the p2p window (alive as long
        // as `self`), this communicator's counters, and the caller's buffers, whose sizes the
        // caller vouched for (the safe wrappers take them from cudarc slices). The guard above
        // checked peers, blocks and chunk against the window, so the kernel writes only inside
        // the receiver's region for this sender.
        unsafe { launch_struct(stream, &func, cfg, &args, group.pdl) }
            .cuda(group.rank as i32, "cuLaunchKernelEx (sendrecv)")?;
        Ok(())
    }

    /// The launch of a call with a negotiated large message (docs/PROTOCOL.md, "Which large
    /// messages use it"): one `p2p_negotiated_kernel` on the caller's stream holds both roles;
    /// a negotiated role decides on the GPU between its staged side (in `args`) and its
    /// copy-engine side moved by SMs (in `negotiated`), and puts its decision back to 0 when
    /// done, so the call needs no stream of its own and no host work between calls.
    fn launch_negotiated(
        &self,
        group: &Group,
        jit: &Jit,
        args: P2PLaunch,
        negotiated: [P2PSide; 2],
        threads: [u32; 2],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let rank = group.rank as i32;
        let sides = [args.send, args.recv];
        // Blocks per role, as the kernel counts them (negotiated_blocks).
        let mut blocks = [0u32; 2];
        for i in 0..2 {
            if sides[i].peer < 0 {
                continue;
            }
            blocks[i] = sides[i].blocks;
            if negotiated[i].peer >= 0 {
                // Staged and copy-engine sides of a negotiated role run on the kernel's threads.
                let ce_threads = if i == 0 { CE_SEND_THREADS } else { threads[i] };
                if threads[i] != MAX_ROLE_THREADS || ce_threads != MAX_ROLE_THREADS {
                    return Err(Error::InvalidArgument {
                        op: "send/recv",
                        reason: format!(
                            "a negotiated large message runs on {MAX_ROLE_THREADS} threads per \
                             block, not {}",
                            threads[i]
                        ),
                    });
                }
                blocks[i] = blocks[i].max(negotiated[i].blocks + 1);
            }
        }
        let func = self.function(group, jit, KernelKey::Negotiated(split_interleave()))?;
        let n = P2PNegotiated {
            a: args,
            ce_send: negotiated[0],
            ce_recv: negotiated[1],
            threads,
        };
        let cfg = linear_launch(blocks[0] + blocks[1], MAX_ROLE_THREADS);
        // SAFETY: p2p_negotiated_kernel<512, I>(P2PNegotiated) takes exactly this struct by
        // value and enters through enter_after_previous_kernel; as for the SM kernel, its
        // pointers are the p2p window, this communicator's counters and the caller's buffers
        // (sized by the caller), and the guard checked both sides of each negotiated role
        // against the window: whichever layout a role takes, it writes only inside the
        // receiver's region for this sender, this rank's outbox for the receiver and the
        // destination.
        unsafe { launch_struct(stream, &func, cfg, &n, group.pdl) }
            .cuda(rank, "cuLaunchKernelEx (sendrecv, negotiated)")?;
        Ok(())
    }

    /// A call with a copy-engine role (docs/PROTOCOL.md, "Copy engine"): forks from `stream`
    /// onto the copy-engine streams, enqueues the pacing kernel and the copies of a send, the
    /// receiving kernel of a receive and the SM kernel of any other role, then joins them back
    /// into `stream`, so the call is one unit in stream order (and in a captured graph).
    #[allow(clippy::too_many_arguments)]
    fn launch_with_copy_engine(
        &self,
        group: &Group,
        jit: &Jit,
        [sm, negotiated]: [[P2PSide; 2]; 2],
        sides: [P2PSide; 2],
        sm_threads: [u32; 2],
        threads: [u32; 2],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let rank = group.rank as i32;
        let streams = &self.ce;
        let base = self.base_launch();
        // `sides`: the roles by copy engine; `sm`: the SM kernel's roles.
        let ce = [sides[0].peer >= 0, sides[1].peer >= 0];
        let mut joins: Vec<&Arc<CudaStream>> = Vec::new();
        // One event marks the fork point for every stream that starts from it.
        let forked = stream
            .record_event(None)
            .cuda(rank, "cuEventRecord (fork)")?;
        let fork = |s: &Arc<CudaStream>| s.wait(&forked).cuda(rank, "cuStreamWaitEvent (fork)");
        // Every kernel is resolved before anything is enqueued, so a load failure leaves the
        // streams untouched.
        let pace_fn = if ce[0] {
            Some(self.function(group, jit, KernelKey::CeSend)?)
        } else {
            None
        };
        let recv_fn = if ce[1] {
            Some(self.function(group, jit, KernelKey::CeRecv(threads[1]))?)
        } else {
            None
        };
        if let Some(func) = pace_fn {
            let s = sides[0];
            let args = P2PLaunch { send: s, ..base };
            fork(&streams.pace)?;
            let cfg = ce_grid(true, s, CE_SEND_THREADS);
            // SAFETY: p2p_ce_send_kernel<512>(P2PLaunch) takes this struct by value and enters
            // through enter_after_previous_kernel; it touches this namespace's signal pad, the
            // peer's pad words of this pair and the staging step counters (read), reads the
            // caller's source (`bytes`, sized by the caller) and writes only the outbox slots
            // of this receiver (the guard checked the chunk against a slot).
            unsafe { launch_struct(&streams.pace, &func, cfg, &args, group.pdl) }
                .cuda(rank, "cuLaunchKernelEx (copy-engine sender)")?;
            joins.push(&streams.pace);
            if s.pull & P2P_SIDE_PULL == 0 {
                for c in &streams.copy {
                    fork(c)?;
                    joins.push(c);
                }
                self.enqueue_copies(group, s, &streams.copy)?;
            }
        }
        let sm_used = sm[0].peer >= 0 || sm[1].peer >= 0;
        if sm_used {
            // A role only the copy engine takes gets no threads in the SM kernel.
            let sm_threads = [0, 1].map(|i| if sm[i].peer < 0 { 0 } else { sm_threads[i] });
            self.launch_sm(group, jit, [sm, negotiated], sm_threads, stream)?;
        }
        if let Some(func) = recv_fn {
            let args = P2PLaunch {
                recv: sides[1],
                ..base
            };
            let on = if sm_used {
                fork(&streams.recv)?;
                joins.push(&streams.recv);
                &streams.recv
            } else {
                stream
            };
            let cfg = ce_grid(false, sides[1], threads[1]);
            // SAFETY: p2p_ce_recv_kernel<T>(P2PLaunch) takes this struct by value and enters
            // through enter_after_previous_kernel; it writes `bytes` at the caller's
            // destination (sized by the caller) and this namespace's own pad words, and reads
            // the staging region of the sender.
            unsafe { launch_struct(on, &func, cfg, &args, group.pdl) }
                .cuda(rank, "cuLaunchKernelEx (copy-engine receiver)")?;
            if sides[1].pull & P2P_SIDE_PULL == 0 {
                fork(&streams.pull)?;
                joins.push(&streams.pull);
                self.enqueue_pulls(group, sides[1], &streams.pull)?;
            }
        }
        for s in joins {
            stream.join(s).cuda(rank, "cuStreamWaitEvent (join)")?;
        }
        Ok(())
    }

    /// The copy streams' part of a copy-engine send of `s`: pushed chunk k (even slot i = k %
    /// CE_SLOTS) goes to copy stream i / 2, which waits for GO[i] >= k + 1 (set by the pacer
    /// once the slot is free), copies the chunk into the peer's inbox slot, then writes DONE[i]
    /// = k + 1 (after a memory barrier); at the end each stream puts the GO word of its slot
    /// back to 0 for the next call (the pacer, which sets them, is done with them by then).
    /// Pulled chunks (odd slots) are the sender kernel's and the receiver's copy stream's.
    fn enqueue_copies(&self, group: &Group, s: P2PSide, copy: &[InternalStream; 2]) -> Result<()> {
        let (rank, world, peer) = (group.rank, group.world_size, s.peer as usize);
        let word = |w: usize| self.ce_word(world, peer, w);
        let remote =
            self.peer_window(group, "send", peer)? + rank as u64 * self.limits.region_bytes();
        let ctx = |e: Error| crate::cuda::with_rank(e, rank);
        let streams = ce_copy_streams();
        for (k, i, off, len) in self.ce_chunks(s, false) {
            let c = &copy[(i / 2) % streams];
            crate::cuda::stream_wait_geq(c, word(CE_GO + i), k + 1).map_err(ctx)?;
            let to = remote + self.limits.ce_slot_offset(i);
            crate::cuda::memcpy_dtod_async(to, s.buf + off, len, c).map_err(ctx)?;
            crate::cuda::stream_write(c, word(CE_DONE + i), k + 1).map_err(ctx)?;
        }
        for i in (0..CE_SLOTS as usize).step_by(2) {
            crate::cuda::stream_write(&copy[(i / 2) % streams], word(CE_GO + i), 0).map_err(ctx)?;
        }
        Ok(())
    }

    /// The receiver's copy stream for a copy-engine receive of `r`: pulled chunk k (odd slot
    /// i) waits for GOR[i] >= k + 1 (set by the receiver's pacer once the sender announced it
    /// and it matches this call), copies the chunk from the sender's outbox slot straight into
    /// the destination, then writes DONER[i] = k + 1; at the end GOR goes back to 0.
    fn enqueue_pulls(&self, group: &Group, r: P2PSide, pull: &InternalStream) -> Result<()> {
        let (rank, world, peer) = (group.rank, group.world_size, r.peer as usize);
        let word = |w: usize| self.ce_word(world, peer, w);
        let outbox =
            self.peer_window(group, "recv", peer)? + self.limits.outbox_offset(world, rank);
        let ctx = |e: Error| crate::cuda::with_rank(e, rank);
        for (k, i, off, len) in self.ce_chunks(r, true) {
            crate::cuda::stream_wait_geq(pull, word(CE_GO_R + i), k + 1).map_err(ctx)?;
            let from = outbox + self.limits.ce_slot_offset(i);
            crate::cuda::memcpy_dtod_async(r.buf + off, from, len, pull).map_err(ctx)?;
            crate::cuda::stream_write(pull, word(CE_DONE_R + i), k + 1).map_err(ctx)?;
        }
        for i in (1..CE_SLOTS as usize).step_by(2) {
            crate::cuda::stream_write(pull, word(CE_GO_R + i), 0).map_err(ctx)?;
        }
        Ok(())
    }

    /// Where `peer`'s p2p window is mapped here (an error naming `op` if it is not).
    fn peer_window(&self, group: &Group, op: &'static str, peer: usize) -> Result<u64> {
        self.window
            .get_nvlink_address(peer)
            .ok_or_else(|| Error::NoPath {
                op,
                rank: group.rank,
                peer,
                kind: "no NVLink mapping".into(),
            })
    }

    /// The chunks of a copy-engine message `s` on one path (pushed into the inbox or pulled
    /// from the outbox): (chunk index, slot, byte offset, bytes).
    fn ce_chunks(
        &self,
        s: P2PSide,
        pulled: bool,
    ) -> impl Iterator<Item = (u64, usize, u64, usize)> {
        let chunks = s.bytes.div_ceil(s.chunk_bytes);
        (0..chunks).filter_map(move |k| {
            let i = (k % CE_SLOTS) as usize;
            let off = k * s.chunk_bytes;
            let len = (s.bytes - off).min(s.chunk_bytes) as usize;
            (ce_pulled(i) == pulled).then_some((k, i, off, len))
        })
    }

    /// Zero-copy send, receive or both into registered buffers, each role by the route of its
    /// size ([`zero_copy_route`], the same on both ranks): the ordinary send/recv path into
    /// the registered destination (low-latency lines, or staged chunks where they measured
    /// faster than writing straight into the peer's buffer), SM blocks of `p2p_zc_kernel`, or
    /// the copy engine. The caller has checked that each range lies inside its registered
    /// buffer; peers are checked here. Roles on the ordinary path launch first, on both ranks,
    /// so the launches of the two ranks cannot wait on each other.
    pub(crate) fn launch_zero_copy(
        &self,
        group: &Group,
        jit: &Jit,
        send: Option<ZcRole>,
        recv: Option<ZcRole>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        group.errors.check()?;
        self.bind(group, stream)?;
        // Both roles are checked before either route launches anything.
        if let Some(t) = send {
            self.check_peer(group, "send_registered", t.peer)?;
        }
        if let Some(t) = recv {
            self.check_peer(group, "recv_registered", t.peer)?;
        }
        let peer = |t: Option<ZcRole>| t.map_or(-1, |t| t.peer as i32);
        self.ready(group, jit, [peer(send), peer(recv)])?;
        let route = |t: &ZcRole| zero_copy_route(t.bytes, &self.limits);
        let staged = |t: &ZcRole| route(t) == ZcRoute::Staged;
        let ordinary = |t: ZcRole| Transfer {
            ptr: t.buf,
            bytes: t.bytes,
            peer: t.peer,
            config: None,
        };
        let (o_send, o_recv) = (
            send.filter(staged).map(ordinary),
            recv.filter(staged).map(ordinary),
        );
        if o_send.is_some() || o_recv.is_some() {
            self.launch(group, jit, o_send, o_recv, stream)?;
        }
        let send = send.filter(|t| !staged(t));
        let recv = recv.filter(|t| !staged(t));
        let z = self.zc_launch(group.world_size, send, recv);
        match send {
            Some(t) if route(&t) == ZcRoute::CopyEngine => {
                self.launch_zero_copy_ce(group, jit, z, stream)
            }
            _ => self.launch_zc_kernel(group, jit, z, stream),
        }
    }

    /// The zero-copy kernels' arguments for these roles (neither on the staged route).
    fn zc_launch(&self, world: usize, send: Option<ZcRole>, recv: Option<ZcRole>) -> ZcLaunch {
        // The copy-engine route has one DONE slot: the receiver waits for one "block".
        let side = |t: ZcRole, counter: Counter| P2PSide {
            buf: t.buf,
            bytes: t.bytes,
            steps: self.counter_ptr(counter, t.peer, world),
            peer: t.peer as i32,
            blocks: match zero_copy_route(t.bytes, &self.limits) {
                ZcRoute::Blocks(b) => b,
                ZcRoute::CopyEngine | ZcRoute::Staged => 1,
            },
            ..P2PSide::unused()
        };
        let mut z = ZcLaunch {
            p: P2PLaunch {
                send: send.map_or(P2PSide::unused(), |t| side(t, Counter::ZcSend)),
                recv: recv.map_or(P2PSide::unused(), |t| side(t, Counter::ZcRecv)),
                ..self.base_launch()
            },
            zc_slot0: self.limits.zc_slot0(world) as u64,
            ..Default::default()
        };
        if let Some(t) = send {
            (z.send_dst, z.send_reg, z.send_offset) = (t.remote, t.reg, t.offset);
        }
        if let Some(t) = recv {
            (z.recv_reg, z.recv_offset) = (t.reg, t.offset);
        }
        z
    }

    /// `p2p_zc_kernel` for the roles of `z` (either may be unused): `send.blocks` sender blocks
    /// and one receiving block.
    fn launch_zc_kernel(
        &self,
        group: &Group,
        jit: &Jit,
        z: ZcLaunch,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let send_blocks = if z.p.send.peer >= 0 {
            z.p.send.blocks
        } else {
            0
        };
        let blocks = send_blocks + u32::from(z.p.recv.peer >= 0);
        if blocks == 0 {
            return Ok(());
        }
        let func = self.function(group, jit, KernelKey::ZeroCopy)?;
        let cfg = linear_launch(blocks, ZC_THREADS);
        // SAFETY: p2p_zc_kernel<512>(ZcLaunch) takes exactly this struct by value and enters
        // through enter_after_previous_kernel. The send role writes `bytes` at `send_dst`,
        // which the caller checked lies inside the peer's registered buffer as mapped here,
        // and only after the receiver's descriptor matched; the source range is the caller's;
        // counters and signal slots are this namespace's.
        unsafe { launch_struct(stream, &func, cfg, &z, group.pdl) }
            .cuda(group.rank as i32, "cuLaunchKernelEx (zero-copy)")?;
        Ok(())
    }

    /// A zero-copy call whose send role goes by copy engine (docs/PROTOCOL.md, "Zero-copy by
    /// copy engine"): forks the pacing stream and the first copy stream from `stream`; the
    /// copy stream waits for GO, copies the whole message into the receiver's registered
    /// buffer, then writes GO = 0 and DONE = 1; the pacer (`p2p_zc_ce_kernel`) checks the
    /// receiver's descriptor, releases GO and announces DONE. A receive role runs in
    /// `p2p_zc_kernel` on `stream` meanwhile; both streams are joined back into `stream`.
    fn launch_zero_copy_ce(
        &self,
        group: &Group,
        jit: &Jit,
        z: ZcLaunch,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let rank = group.rank;
        let pace_fn = self.function(group, jit, KernelKey::ZeroCopyCe)?;
        if z.p.recv.peer >= 0 {
            // Resolved before anything is enqueued, so a load failure leaves the streams as
            // they were.
            self.function(group, jit, KernelKey::ZeroCopy)?;
        }
        let (pace, copy) = (&self.ce.pace, &self.ce.copy[0]);
        let forked = stream
            .record_event(None)
            .cuda(rank as i32, "cuEventRecord (fork)")?;
        for st in [pace, copy] {
            st.wait(&forked)
                .cuda(rank as i32, "cuStreamWaitEvent (fork)")?;
        }
        self.enqueue_zc_ce_send(group, &pace_fn, z, pace, copy)?;
        if z.p.recv.peer >= 0 {
            self.launch_zc_kernel(group, jit, recv_only(z), stream)?;
        }
        for st in [pace, copy] {
            stream
                .join(st)
                .cuda(rank as i32, "cuStreamWaitEvent (join)")?;
        }
        Ok(())
    }

    /// The send role of `z` by copy engine, without fork or join: the pacer on `pace`, the
    /// copy stream's wait for GO, the copy and its GO = 0, DONE = 1 on `copy`.
    fn enqueue_zc_ce_send(
        &self,
        group: &Group,
        pace_fn: &CudaFunction,
        z: ZcLaunch,
        pace: &Arc<CudaStream>,
        copy: &Arc<CudaStream>,
    ) -> Result<()> {
        let rank = group.rank;
        let s = z.p.send;
        let word = |w: usize| self.ce_word(group.world_size, s.peer as usize, w);
        let pacer = ZcLaunch {
            p: P2PLaunch {
                recv: P2PSide::unused(),
                ..z.p
            },
            ..z
        };
        // SAFETY: p2p_zc_ce_kernel(ZcLaunch) takes exactly this struct by value; it reads and
        // writes only this namespace's signal words (its pad, the receiver's DONE slots) and
        // zero-copy counters. The copy below is the only writer of data.
        unsafe { launch_one_warp(pace, pace_fn, &pacer, group.pdl) }
            .cuda(rank as i32, "cuLaunchKernelEx (zero-copy pacer)")?;
        let ctx = |e: Error| crate::cuda::with_rank(e, rank);
        crate::cuda::stream_wait_geq(copy, word(CE_GO), 1).map_err(ctx)?;
        // `send_dst` .. + bytes lies inside the peer's registered buffer (checked by the
        // caller against the registration's size).
        crate::cuda::memcpy_dtod_async(z.send_dst, s.buf, s.bytes as usize, copy).map_err(ctx)?;
        crate::cuda::stream_write(copy, word(CE_GO), 0).map_err(ctx)?;
        crate::cuda::stream_write(copy, word(CE_DONE), 1).map_err(ctx)
    }

    /// Device address of copy-engine word `w` of `peer`'s block in this rank's signal pad.
    fn ce_word(&self, world: usize, peer: usize, w: usize) -> u64 {
        let own = self.window.device_handle();
        own.signals + 8 * (world + self.limits.ce_slot0(world) + peer * CE_WORDS + w) as u64
    }

    fn check_peer(&self, group: &Group, op: &'static str, peer: usize) -> Result<()> {
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
        match group.topology.kind(peer) {
            LinkKind::Nvl => Ok(()),
            other => Err(Error::NoPath {
                op,
                rank: group.rank,
                peer,
                kind: other.to_string(),
            }),
        }
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
    fn ready(&self, group: &Group, jit: &Jit, peers: [i32; 2]) -> Result<()> {
        self.module(group, jit)?;
        let peers = peers.into_iter().filter_map(|p| usize::try_from(p).ok());
        self.gate.pass(group, peers)
    }

    /// The send/recv module, loaded on first use.
    fn module(&self, group: &Group, jit: &Jit) -> Result<&Arc<LoadedModule>> {
        if let Some(m) = self.module.get() {
            return Ok(m);
        }
        let m = jit.load(&group.ctx, &sendrecv_spec())?;
        // Every kernel now: under the driver's lazy loading a kernel's first launch can wait
        // for kernels already running, and a negotiating role's kernels are enqueued behind
        // one that waits on the peer (seen on 2 H200s: the first large both-ways call stalled
        // until that wait timed out).
        m.load_every_kernel()?;
        Ok(self.module.get_or_init(|| m))
    }

    fn function(&self, group: &Group, jit: &Jit, key: KernelKey) -> Result<CudaFunction> {
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

/// The grid of a copy-engine kernel for `side`: sending, a pacing block and `blocks` blocks
/// that fill the outbox (`CE_SEND_THREADS` each); receiving, `blocks` blocks that copy out of
/// the inbox and a pacing block (`threads` each).
fn ce_grid(send: bool, side: P2PSide, threads: u32) -> cudarc::driver::LaunchConfig {
    linear_launch(
        side.blocks + 1,
        if send { CE_SEND_THREADS } else { threads },
    )
}

/// Launches `func(args)` as one block of one warp on `stream` (the copy-engine pacers).
///
/// # Safety
///
/// `func` must take exactly one parameter of type `A` by value, and everything it touches
/// through `args` must stay valid until the kernel has finished.
unsafe fn launch_one_warp<A: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    func: &CudaFunction,
    args: &A,
    pdl: bool,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    // SAFETY: the caller's contract above; the pacers enter through
    // enter_after_previous_kernel.
    unsafe { launch_struct(stream, func, linear_launch(1, 32), args, pdl) }
}

/// `z` with its send role removed.
fn recv_only(z: ZcLaunch) -> ZcLaunch {
    ZcLaunch {
        p: P2PLaunch {
            send: P2PSide::unused(),
            ..z.p
        },
        ..z
    }
}

fn with_peer(e: Error, peer: usize) -> Error {
    match e {
        Error::CapacityExceeded {
            op,
            bytes,
            capacity,
            ..
        } => Error::CapacityExceeded {
            op,
            peer,
            bytes,
            capacity,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_ce_both;

    #[test]
    fn ce_both_names_each_roles_engine() {
        assert_eq!(parse_ce_both(""), [true, false]);
        assert_eq!(parse_ce_both("sm-ce"), [true, false]);
        assert_eq!(parse_ce_both("ce-ce"), [false, false]);
        assert_eq!(parse_ce_both("ce-sm"), [false, true]);
        assert_eq!(parse_ce_both(" sm-sm "), [true, true]);
        assert_eq!(parse_ce_both("ce"), [false, false]);
    }
}
