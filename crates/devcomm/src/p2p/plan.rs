//! The decision of a send/recv call, as a pure function: which protocol each role takes
//! (LL, LL128, staged push or pull, copy engine, or a negotiated large message), whether its
//! copy-engine half moves by SMs, and which kernels run on how many blocks. [`plan`] takes
//! the tuning table and the environment switches as arguments and reads nothing else; the
//! launcher (`launch.rs`) only carries the plan out.

use super::defaults::{default_config, pull_by_default, staged_config};
use super::kernels::{KernelKey, CE_SEND_THREADS};
use super::protocol::{P2PConfig, Protocol};
use super::switches::Switches;
use super::tune::TuneTable;
use super::window::{P2PLimits, MAX_ROLE_THREADS};
use super::Transfer;
use crate::abi::{P2P_SIDE_ANNOUNCE, P2P_SIDE_GATED, P2P_SIDE_PULL};
use crate::error::{Error, Result};

/// What a plan depends on besides the call itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanInputs<'a> {
    /// The window sizes.
    pub limits: &'a P2PLimits,
    /// The loaded tuning table, if any.
    pub tune: Option<&'a TuneTable>,
    /// The environment switches.
    pub switches: Switches,
}

impl PlanInputs<'_> {
    /// The configuration a call of `bytes` without an explicit one uses: the tuning table's
    /// bucket when a table is loaded and covers the size, the built-in defaults otherwise.
    pub(crate) fn config_for(&self, bytes: u64) -> P2PConfig {
        self.tune
            .and_then(|t| t.config_for(bytes))
            .unwrap_or_else(|| default_config(bytes, self.limits, &self.switches))
    }
}

/// One role of a launch as a kernel gets it, less the counters' addresses (the launcher's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlannedSide {
    /// The peer rank.
    pub peer: usize,
    /// Source (send) or destination (recv).
    pub buf: u64,
    /// Bytes to move.
    pub bytes: u64,
    /// Protocol, blocks, threads and chunk.
    pub config: P2PConfig,
    /// The kernel's `P2PSide::pull` word (`P2P_SIDE_*` bits).
    pub flags: u32,
}

/// A kernel and its one-dimensional grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grid {
    /// Which kernel.
    pub kernel: KernelKey,
    /// Blocks.
    pub blocks: u32,
    /// Threads per block.
    pub threads: u32,
}

/// Everything a send/recv launch does, decided before anything is enqueued. Index 0 is the
/// send role, 1 the receive role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The roles of the SM kernel (LL, LL128, staged; the staged side of a negotiated role).
    pub sm: [Option<PlannedSide>; 2],
    /// The copy-engine side of a negotiated role (gated, moved by SMs when chosen); it rides
    /// in the SM kernel.
    pub negotiated: [Option<PlannedSide>; 2],
    /// The roles on the copy-engine streams.
    pub ce: [Option<PlannedSide>; 2],
    /// Threads per block of each role in the SM kernel (0: none).
    pub sm_threads: [u32; 2],
    /// The SM kernel, if any role runs in it.
    pub sm_kernel: Option<Grid>,
    /// The copy-engine sender (pacing block and outbox fillers).
    pub ce_send: Option<Grid>,
    /// The copy-engine receiver.
    pub ce_recv: Option<Grid>,
}

impl Plan {
    /// True when the call moves nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.peers() == [-1, -1]
    }

    /// The peer of each role (-1: none).
    pub(crate) fn peers(&self) -> [i32; 2] {
        [0, 1].map(|i| {
            self.sm[i]
                .or(self.negotiated[i])
                .or(self.ce[i])
                .map_or(-1, |s| s.peer as i32)
        })
    }

    /// True when the copy streams push the send role's chunks (a copy-engine send whose
    /// pushed half is not moved by SMs).
    pub(crate) fn pushes_by_copy_engine(&self) -> bool {
        self.ce[0].is_some_and(|s| s.flags & P2P_SIDE_PULL == 0)
    }

    /// True when the receiver's copy stream pulls the receive role's chunks.
    pub(crate) fn pulls_by_copy_engine(&self) -> bool {
        self.ce[1].is_some_and(|s| s.flags & P2P_SIDE_PULL == 0)
    }
}

/// The plan of a call with roles `send` and `recv` (either may be `None`; empty messages are
/// dropped). `check_peer(op, peer)` vets each role's peer (in role order, before its
/// configuration is checked). Errors: a bad peer, a configuration the window cannot hold
/// (the guard, [`P2PConfig::check`]), a negotiated role not on [`MAX_ROLE_THREADS`] threads.
pub(crate) fn plan(
    send: Option<Transfer>,
    recv: Option<Transfer>,
    inputs: &PlanInputs<'_>,
    check_peer: impl Fn(&'static str, usize) -> Result<()>,
) -> Result<Plan> {
    let send = send.filter(|t| t.bytes > 0);
    let recv = recv.filter(|t| t.bytes > 0);
    let mut p = Plan::default();
    let mut ce_threads = [0u32; 2];
    let alone = send.is_none() || recv.is_none();
    for (i, t) in [send, recv].iter().enumerate() {
        let Some(t) = t else { continue };
        let op = if i == 0 { "send" } else { "recv" };
        check_peer(op, t.peer)?;
        crate::abi::check_message_bytes(op, t.bytes)?;
        let cfg = t.config.unwrap_or_else(|| inputs.config_for(t.bytes));
        // A large message on the built-in defaults: its layout is negotiated (p2p.cuh).
        let negotiated = t.config.is_none()
            && cfg.protocol == Protocol::CopyEngine
            && inputs.tune.and_then(|x| x.config_for(t.bytes)).is_none();
        // The same launch also moves data the other way with this peer.
        let other = if i == 0 { recv } else { send };
        let both_ways = other.is_some_and(|o| o.peer == t.peer);
        let side = |cfg: P2PConfig, flags: u32| -> Result<PlannedSide> {
            cfg.check(op, t.bytes, inputs.limits)
                .map_err(|e| with_peer(e, t.peer))?;
            let sw = &inputs.switches;
            Ok(PlannedSide {
                peer: t.peer,
                buf: t.ptr,
                bytes: t.bytes,
                config: cfg,
                flags: flags
                    | u32::from(match cfg.protocol {
                        Protocol::Pull => i == 0,
                        Protocol::Bulk => i == 0 && pull_by_default(t.bytes, both_ways, sw.pull),
                        // The copy-engine half by SMs: only both ways, as CE_BOTH_ENV says.
                        Protocol::CopyEngine => flags == 0 && both_ways && sw.ce_both[i],
                        Protocol::Push | Protocol::LowLatency | Protocol::LowLatency128 => false,
                    }),
            })
        };
        if negotiated && !alone {
            // Both layouts, gated: the copy-engine one by SMs (a host-enqueued copy could
            // not be called off), the staged one as without the copy engine.
            let staged = staged_config(t.bytes, inputs.limits);
            p.sm[i] = Some(side(staged, P2P_SIDE_GATED)?);
            p.sm_threads[i] = staged.threads;
            p.negotiated[i] = Some(side(cfg, P2P_SIDE_GATED | P2P_SIDE_PULL)?);
            ce_threads[i] = cfg.threads;
        } else if cfg.protocol == Protocol::CopyEngine {
            let flags = if negotiated { P2P_SIDE_ANNOUNCE } else { 0 };
            p.ce[i] = Some(side(cfg, flags)?);
            ce_threads[i] = cfg.threads;
        } else {
            p.sm[i] = Some(side(cfg, 0)?);
            p.sm_threads[i] = cfg.threads;
        }
    }
    if p.is_empty() {
        return Ok(p);
    }
    p.sm_kernel = sm_grid(&p, &inputs.switches)?;
    // A copy-engine kernel: sending, a pacing block and `blocks` blocks that fill the outbox
    // (CE_SEND_THREADS each); receiving, `blocks` blocks that copy out of the inbox and a
    // pacing block.
    p.ce_send = p.ce[0].map(|s| Grid {
        kernel: KernelKey::CeSend,
        blocks: s.config.blocks + 1,
        threads: CE_SEND_THREADS,
    });
    p.ce_recv = p.ce[1].map(|s| Grid {
        kernel: KernelKey::CeRecv(ce_threads[1]),
        blocks: s.config.blocks + 1,
        threads: ce_threads[1],
    });
    Ok(p)
}

/// The SM kernel of `p`'s SM roles: `p2p_negotiated_kernel` when a role is negotiated (each
/// such role decides its layout on the GPU), else the split kernel (each role in blocks of
/// its own) when both roles run on the same thread count and `split` is on, else the fused
/// kernel (both roles in every block).
fn sm_grid(p: &Plan, sw: &Switches) -> Result<Option<Grid>> {
    let threads = p.sm_threads;
    if p.negotiated.iter().any(Option::is_some) {
        // Blocks per role, as the kernel counts them (negotiated_blocks).
        let mut blocks = [0u32; 2];
        for i in 0..2 {
            let Some(s) = p.sm[i] else { continue };
            blocks[i] = s.config.blocks;
            if let Some(n) = p.negotiated[i] {
                // Staged and copy-engine sides of a negotiated role run on the kernel's
                // threads.
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
                blocks[i] = blocks[i].max(n.config.blocks + 1);
            }
        }
        return Ok(Some(Grid {
            kernel: KernelKey::Negotiated(sw.interleave),
            blocks: blocks[0] + blocks[1],
            threads: MAX_ROLE_THREADS,
        }));
    }
    let [send, recv] = p.sm;
    let blocks = |s: Option<PlannedSide>| s.map_or(0, |s| s.config.blocks);
    Ok(match (send, recv) {
        (None, None) => None,
        (Some(_), Some(_)) if sw.split && threads[0] == threads[1] => Some(Grid {
            kernel: KernelKey::Split(threads[0], sw.interleave),
            blocks: blocks(send) + blocks(recv),
            threads: threads[0],
        }),
        _ => Some(Grid {
            kernel: KernelKey::Fused(threads[0], threads[1]),
            blocks: blocks(send).max(blocks(recv)),
            threads: threads[0] + threads[1],
        }),
    })
}

/// `e` with the peer filled in where the guard could not know it.
pub(crate) fn with_peer(e: Error, peer: usize) -> Error {
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
#[path = "plan_tests.rs"]
mod tests;
