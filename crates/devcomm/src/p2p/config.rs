//! Launch knobs of send/recv and the table of defaults chosen by message size.
//!
//! Sender and receiver of one message must use the same protocol, block count and chunk size,
//! so everything here that the peer relies on is a function of the message size alone (never
//! of whether the call is one-way or both ways, nor of the other direction's size).

use crate::error::{Error, Result};

/// How a message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Protocol {
    /// 16-byte lines of 8 payload bytes plus flags: one store moves and signals (small messages).
    LowLatency,
    /// 128-byte lines of 120 payload bytes and a flag word, written by eight lanes of a warp in
    /// one instruction (mid-size messages: a sixteenth of the wire overhead of
    /// [`Protocol::LowLatency`], and no fence or signal per chunk as in the staged protocols).
    /// Relies on NVLink delivering a warp's aligned 128-byte store whole, as NCCL's LL128 does;
    /// [`LL128_ENV`] = `0` keeps it out of the defaults.
    LowLatency128,
    /// Staged, pipelined chunks with TAIL/HEAD signals (large messages); the sender picks
    /// where the chunks are staged ([`auto_pull`]): pulled for a one-way message, pushed
    /// when the same launch also receives from that peer.
    Bulk,
    /// Staged and pushed: the sender writes each chunk over NVLink into staging in the
    /// receiver's memory, the receiver copies it out.
    Push,
    /// Staged and pulled: the sender copies each chunk into staging in its own memory, the
    /// receiver reads it over NVLink into the destination. The sender's per-chunk fence then
    /// waits for local stores only, and on H200 NVLink reads reach a higher one-way rate than
    /// NVLink writes (BASELINES.md: 373 against 354 GB/s with 32 blocks). Slower than push
    /// when the link carries data both ways (docs/PERFORMANCE.md, v7).
    Pull,
    /// Whole chunks written by the sender's copy engine into fixed slots of the receiver's
    /// staging, paced by a one-warp kernel, and copied out by the receiver's blocks
    /// (docs/PROTOCOL.md, "Copy engine"). The copy engine reaches 397 GB/s at 1 GiB where SM
    /// stores stop near 370 (BASELINES.md), and the sender spends one warp, not 16-32 SMs.
    /// `chunk_bytes` is the chunk (at most [`P2PLimits::ce_slot_bytes`]), `blocks` and
    /// `threads` the receiver's.
    CopyEngine,
}

impl Protocol {
    /// True for the staged protocols (any of which a receiver may meet: the sender's choice
    /// travels with each chunk).
    pub fn is_staged(self) -> bool {
        matches!(self, Protocol::Bulk | Protocol::Push | Protocol::Pull)
    }

    /// The kernel's `P2PSide.low_latency` value: 0 staged, 1 LL lines, 2 LL128 lines.
    pub fn line_kind(self) -> u32 {
        match self {
            Protocol::LowLatency => 1,
            Protocol::LowLatency128 => 2,
            _ => 0,
        }
    }
}

/// The knobs of one direction of a send/recv.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct P2PConfig {
    /// Protocol.
    pub protocol: Protocol,
    /// Thread blocks (one SM each) per direction.
    pub blocks: u32,
    /// Threads per block for this role: 256 or 512. Bulk transfers run one channel per warp,
    /// so `blocks * threads / 32` channels.
    pub threads: u32,
    /// Bulk bytes per pipeline step of one channel.
    pub chunk_bytes: u64,
}

/// Sizes of the p2p window, fixed when the communicator is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2PLimits {
    /// The most blocks a direction may use.
    pub max_blocks: u32,
    /// Staging slots per channel (pipeline depth).
    pub depth: u32,
    /// Bytes per staging slot: the largest chunk.
    pub slot_bytes: u64,
    /// Largest low-latency (LL) message.
    pub ll_max_bytes: u64,
    /// Largest LL128 message.
    pub ll128_max_bytes: u64,
}

impl Default for P2PLimits {
    fn default() -> Self {
        Self {
            max_blocks: 32,
            depth: 4,
            slot_bytes: 32 << 10,
            ll_max_bytes: 256 << 10,
            ll128_max_bytes: 8 << 20,
        }
    }
}

/// The most threads a role may have (and so the most warps per block).
pub const MAX_ROLE_THREADS: u32 = 512;

/// Blocks that the largest send/recv launch with `max_blocks` keeps on the GPU at once: two
/// roles of `max_blocks + 1` (a negotiated role, or a copy-engine side with its pacing block).
/// Its kernels wait on the peer's blocks and on each other's, so every one of them must be
/// resident together (docs/PROTOCOL.md, "Which large messages use it").
fn resident_blocks(max_blocks: u32) -> u32 {
    2 * (max_blocks + 1)
}

/// The most blocks per direction whose launches stay resident on `sms` SMs: one block of
/// [`MAX_ROLE_THREADS`] threads per SM, since those kernels use more than 64 registers a thread
/// (the negotiated kernel 128), so [`resident_blocks`] of it must not exceed `sms`. `None` when
/// not even one block per direction fits.
fn max_blocks_for_sms(sms: u32) -> Option<u32> {
    let fit = (sms / 2).checked_sub(1).filter(|&b| b >= 1)?;
    debug_assert!(resident_blocks(fit) <= sms);
    Some(fit)
}

/// The window's limits fitted to the smallest GPU of the group (`sms` SMs): a `max_blocks`
/// whose launches could not all be resident is lowered to what fits when it is the default,
/// and refused when the caller asked for it (`explicit`), since such a launch would wait for
/// blocks that never start until its bounded waits expire.
pub fn fit_to_sms(limits: P2PLimits, explicit: bool, sms: u32) -> Result<P2PLimits> {
    let fit = max_blocks_for_sms(sms).ok_or_else(|| Error::InvalidArgument {
        op: "Comm",
        reason: format!(
            "send/recv needs at least 4 SMs resident at once (two roles of a block and a \
             pacing block); the smallest GPU of the group has {sms}"
        ),
    })?;
    if limits.max_blocks <= fit {
        return Ok(limits);
    }
    if explicit {
        return Err(Error::InvalidArgument {
            op: "Comm",
            reason: format!(
                "{} blocks per direction need {} SMs for their launches to be resident at \
                 once; the smallest GPU of the group has {sms}: use at most {fit}",
                limits.max_blocks,
                resident_blocks(limits.max_blocks)
            ),
        });
    }
    Ok(P2PLimits {
        max_blocks: fit,
        ..limits
    })
}

impl P2PLimits {
    /// The most bulk channels (warps) a direction may use.
    pub fn max_channels(&self) -> u32 {
        self.max_blocks * (MAX_ROLE_THREADS / 32)
    }

    /// Bytes of the low-latency lines of one parity: 16 bytes per 8 payload bytes, plus one
    /// line of rounding per block, in whole 128-byte lines (the LL128 lines follow).
    pub fn ll_parity_bytes(&self) -> u64 {
        (2 * self.ll_max_bytes + 16 * u64::from(self.max_blocks)).next_multiple_of(128)
    }

    /// Bytes of the LL128 lines of one parity: a 128-byte line per 112 payload bytes (the
    /// smaller payload, of 16-byte units), plus a line of rounding per block.
    pub fn ll128_parity_bytes(&self) -> u64 {
        128 * (self.ll128_max_bytes.div_ceil(LL128_MIN_PAYLOAD) + u64::from(self.max_blocks))
    }

    /// Offset of the low-latency lines inside one sender's region.
    pub fn ll_offset(&self) -> u64 {
        u64::from(self.max_channels()) * u64::from(self.depth) * self.slot_bytes
    }

    /// One sender's region in a receiver's window: staging, two parities of LL lines, two of
    /// LL128 lines (`cuda/devcomm/p2p.cuh` derives the LL128 size from this).
    pub fn region_bytes(&self) -> u64 {
        self.ll_offset() + 2 * self.ll_parity_bytes() + 2 * self.ll128_parity_bytes()
    }

    /// Data bytes of the p2p window: a region per sender (push staging and low-latency
    /// lines), then an outbox per receiver (pull staging, `ll_offset()` bytes each).
    pub fn window_bytes(&self, world_size: usize) -> u64 {
        world_size as u64 * (self.region_bytes() + self.ll_offset())
    }

    /// User signal slots of the p2p window: TAIL and HEAD per (peer, channel), LLHEAD per
    /// (peer, block), the count exchange, zero-copy descriptors and DONE per (peer, block),
    /// MODE per (sender, channel, staging slot), then the copy-engine words per peer.
    pub fn signal_slots(&self, world_size: usize) -> usize {
        self.ce_slot0(world_size) + world_size * CE_WORDS
    }

    /// First copy-engine word: [`CE_WORDS`] per peer (`cuda/devcomm/p2p.cuh`).
    pub fn ce_slot0(&self, world_size: usize) -> usize {
        self.mode_slot0(world_size)
            + world_size * self.max_channels() as usize * self.depth as usize
    }

    /// Bytes of one copy-engine slot: half the push staging of a region (two slots there,
    /// two in the sender's outbox, which is as large), in whole 256-byte units (32 MiB with
    /// the default limits).
    pub fn ce_slot_bytes(&self) -> u64 {
        self.ll_offset() / 2 / 256 * 256
    }

    /// Offset of copy-engine slot `i` in its staging: even slots in the receiver's inbox
    /// for the sender, odd ones in the sender's outbox for the receiver.
    pub fn ce_slot_offset(&self, i: usize) -> u64 {
        (i / 2) as u64 * self.ce_slot_bytes()
    }

    /// Offset in the window's data of `receiver`'s outbox (pull staging) at each sender.
    pub fn outbox_offset(&self, world_size: usize, receiver: usize) -> u64 {
        world_size as u64 * self.region_bytes() + receiver as u64 * self.ll_offset()
    }

    /// First MODE slot: whether the chunk in a staging slot was pushed or pulled
    /// (`cuda/devcomm/p2p.cuh`).
    pub fn mode_slot0(&self, world_size: usize) -> usize {
        self.zc_slot0(world_size) + world_size * (4 + self.max_blocks as usize)
    }

    /// First user slot of zero-copy send/recv: a descriptor of 4 slots per receiver, then DONE
    /// per (sender, block) (`cuda/devcomm/p2p.cuh`).
    pub fn zc_slot0(&self, world_size: usize) -> usize {
        self.count_slot0(world_size) + 4 * world_size
    }

    /// First user slot of the all-to-all-v count exchange: per sender, a value and a sequence
    /// slot for each of two parities.
    pub fn count_slot0(&self, world_size: usize) -> usize {
        world_size * (2 * self.max_channels() as usize + self.max_blocks as usize)
    }
}

/// Copy-engine slots per (sender, receiver) and pad words per peer (`cuda/devcomm/p2p.cuh`).
pub const CE_SLOTS: u64 = 4;
/// Pad words of the copy-engine protocol per peer.
pub const CE_WORDS: usize = 56;

/// Whether copy-engine slot `i` is pulled by the receiver's copy engine from the sender's
/// outbox (odd) or pushed by the sender's into the receiver's inbox (even).
pub fn ce_pulled(i: usize) -> bool {
    i % 2 == 1
}
/// Offsets in a peer's block of copy-engine words that the host reads or writes (the whole
/// layout is in `cuda/devcomm/p2p.cuh`, `kCe*`): SIZE[slot] (in an error record), GO[slot] and
/// DONE[slot] (the copy streams' memory operations).
pub const CE_SIZE: usize = 8;
/// See [`CE_SIZE`].
pub const CE_GO: usize = 20;
/// See [`CE_SIZE`].
pub const CE_DONE: usize = 24;
/// `P2PSide::pull` bits (`cuda/devcomm/p2p.cuh`, `kSide*`): pull (staged) or by SMs (copy
/// engine); gated on the negotiation of a large message's layout; announces this side's type
/// for that negotiation.
pub const P2P_SIDE_PULL: u32 = 1;
/// See [`P2P_SIDE_PULL`].
pub const P2P_SIDE_GATED: u32 = 2;
/// See [`P2P_SIDE_PULL`].
pub const P2P_SIDE_ANNOUNCE: u32 = 4;

/// GOR[slot] and DONER[slot]: the receiver's copy stream's waits and reports (pulled chunks).
pub const CE_GO_R: usize = 36;
/// See [`CE_GO_R`].
pub const CE_DONE_R: usize = 40;
/// DEC_S and DEC_R: the negotiation's decision for this rank's current message to the peer and
/// from it (`p2p_negotiated_kernel` puts them back to 0 once the role's blocks are done).
pub const CE_DEC_S: usize = 50;
/// See [`CE_DEC_S`].
pub const CE_DEC_R: usize = 51;

/// Environment variable: `0` keeps messages of [`CE_DEFAULT_MIN`] bytes or more on the staged
/// protocol; otherwise the defaults give them the copy-engine layout where it was measured
/// faster (one role alone in a launch; docs/PROTOCOL.md, "Copy engine"). Set it alike on every
/// rank.
pub const CE_ENV: &str = "DEVCOMM_P2P_CE";

/// The smallest message the defaults send by the copy engine (when it is on): one way, the
/// copy engine was ahead of SM pull from 256 MiB and behind at 64 MiB (docs/PERFORMANCE.md,
/// v15).
pub const CE_DEFAULT_MIN: u64 = 256 << 20;

/// Whether the defaults may use [`Protocol::CopyEngine`] (see [`CE_ENV`]).
pub fn ce_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(CE_ENV).map_or(true, |v| v.trim() != "0"))
}

/// The default copy-engine configuration for a message of `bytes`: chunks of half a slot
/// (16 MiB: 1 GiB one way measured 2729 us against 2744 with whole slots, docs/PERFORMANCE.md,
/// v15), 15 blocks on each side copying chunks into the outbox and out of the inbox, so that
/// with its pacing block each side runs on 16 SMs.
pub fn ce_config(_bytes: u64, limits: &P2PLimits) -> P2PConfig {
    P2PConfig {
        protocol: Protocol::CopyEngine,
        blocks: 15.min(limits.max_blocks),
        threads: MAX_ROLE_THREADS,
        chunk_bytes: (limits.ce_slot_bytes() / 2).max(256),
    }
}

/// The largest message the defaults send as LL128, and the payload per block.
pub const LL128_DEFAULT_MAX: u64 = 4 << 20;
const LL128_BYTES_PER_BLOCK: u64 = 8 << 10;

/// Payload bytes of an LL128 line for 16-byte units (120 for 8-byte units, as send/recv uses).
pub const LL128_MIN_PAYLOAD: u64 = 112;

/// Environment variable: `0` keeps [`Protocol::LowLatency128`] out of the defaults (sizes it
/// would take go to the staged protocol). Set it alike on every rank.
pub const LL128_ENV: &str = "DEVCOMM_P2P_LL128";

/// Whether the defaults may use [`Protocol::LowLatency128`] (see [`LL128_ENV`]).
pub fn ll128_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(LL128_ENV).map_or(true, |v| v.trim() != "0"))
}

/// The default configuration for a message of `bytes` (measured on H200 NVLink; see
/// docs/PERFORMANCE.md).
pub fn default_config(bytes: u64, limits: &P2PLimits) -> P2PConfig {
    const KIB: u64 = 1 << 10;
    let clamp = |b: u64| (b.max(1) as u32).min(limits.max_blocks);
    if bytes <= (128 * KIB).min(limits.ll_max_bytes) {
        // About 2 KiB of payload per block (sweep of 2026-11-22: 64 KiB fastest on 32 blocks).
        let blocks = clamp(bytes / (2 * KIB));
        return P2PConfig {
            protocol: Protocol::LowLatency,
            blocks,
            threads: 256,
            chunk_bytes: 0,
        };
    }
    if ll128_enabled() && bytes <= LL128_DEFAULT_MAX.min(limits.ll128_max_bytes) {
        return P2PConfig {
            protocol: Protocol::LowLatency128,
            blocks: clamp(bytes.div_ceil(LL128_BYTES_PER_BLOCK)),
            threads: MAX_ROLE_THREADS,
            chunk_bytes: 0,
        };
    }
    if ce_enabled() && bytes >= CE_DEFAULT_MIN && limits.ce_slot_bytes() >= CE_MIN_CHUNK {
        return ce_config(bytes, limits);
    }
    staged_config(bytes, limits)
}

/// The smallest copy-engine chunk the guard accepts: below it the copy engine's per-copy cost
/// dominates.
pub const CE_MIN_CHUNK: u64 = 64 << 10;

/// The default staged ([`Protocol::Bulk`]) configuration for a message of `bytes`: what
/// [`default_config`] picks above the low-latency sizes, for any size.
pub fn staged_config(bytes: u64, limits: &P2PLimits) -> P2PConfig {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    let clamp = |b: u64| (b.max(1) as u32).min(limits.max_blocks);
    // From the one-way sweeps of 2026-11-22 on 2 H200s (docs/PERFORMANCE.md): one chunk per
    // channel up to a few MiB (fewest fences), then 32 blocks of 16 channels.
    let (blocks, threads, chunk) = if bytes <= MIB {
        (32, 256, 16 * KIB)
    } else if bytes <= 4 * MIB {
        (32, 256, 32 * KIB)
    } else if bytes <= 16 * MIB {
        (32, MAX_ROLE_THREADS, 16 * KIB)
    } else {
        (32, MAX_ROLE_THREADS, 32 * KIB)
    };
    P2PConfig {
        protocol: Protocol::Bulk,
        blocks: clamp(blocks),
        threads,
        chunk_bytes: chunk.min(limits.slot_bytes),
    }
}

/// Environment variable: `1` makes every [`Protocol::Bulk`] message pull, `0` push; unset,
/// [`auto_pull`] decides. Only the sender's setting matters: the receiver follows the choice
/// the sender records with each chunk.
pub const PULL_ENV: &str = "DEVCOMM_P2P_PULL";

/// One-way bulk messages from this size on are pulled by default (measured: pull is ahead
/// from 1 MiB on 32 blocks; docs/PERFORMANCE.md, v7).
pub const PULL_MIN_BYTES: u64 = 1 << 20;

/// Whether the sender of a [`Protocol::Bulk`] message of `bytes` stages it for the receiver
/// to pull. `receives_from_peer`: the same launch also receives from that peer, so the link
/// carries data both ways, where pushing is faster (pulling both ways, or pushing one way and
/// pulling the other, measured slower: docs/PERFORMANCE.md, v7).
pub fn auto_pull(bytes: u64, receives_from_peer: bool) -> bool {
    static FORCE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let force = *FORCE.get_or_init(|| match std::env::var(PULL_ENV).as_deref().map(str::trim) {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    });
    force.unwrap_or(bytes >= PULL_MIN_BYTES && !receives_from_peer)
}

/// Blocks (of 512 threads) that push a zero-copy message of `bytes` straight into the peer's
/// registered buffer. Sender and receiver both take it from the size. SM push reaches its
/// plateau with 8 blocks at 1 GiB and 181 GB/s at 1 MiB (BASELINES.md); a block per 64 KiB
/// keeps small messages on few SMs. [`ZC_BLOCKS_ENV`] caps it (for sweeps; set it on every rank).
pub fn zero_copy_blocks(bytes: u64, limits: &P2PLimits) -> u32 {
    static CAP: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let cap = *CAP.get_or_init(|| {
        std::env::var(ZC_BLOCKS_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(16)
    });
    let blocks = bytes.div_ceil(64 << 10).clamp(1, cap.max(1));
    (blocks as u32).min(limits.max_blocks)
}

/// Environment variable: the most blocks a zero-copy message uses (default 16).
pub const ZC_BLOCKS_ENV: &str = "DEVCOMM_ZC_BLOCKS";

/// Zero-copy messages from this size on are moved by the sender's copy engine
/// (docs/PROTOCOL.md, "Zero-copy by copy engine"). Measured on 2 H200s (docs/PERFORMANCE.md,
/// v10): ahead of SM blocks from 64 MiB one way (205 against 216 us) and both ways (equal at
/// 64 MiB, 780 against 816 us at 256 MiB); a fixed ~21 us per call puts it behind below.
pub const ZC_CE_MIN_BYTES: u64 = 64 << 20;

/// Environment variable: the smallest zero-copy message, in bytes, that the sender's copy
/// engine moves (default [`ZC_CE_MIN_BYTES`]); `off` never. Sender and receiver both take the
/// route from the size, so set it alike on every rank.
pub const ZC_CE_MIN_ENV: &str = "DEVCOMM_ZC_CE_MIN";

/// Environment variable: `0` sends zero-copy messages between the low-latency size and the
/// copy-engine size by SM blocks straight into the receiver's buffer; otherwise (the default)
/// they take the staged path of [`default_config`] into it, measured faster there. Set it
/// alike on every rank.
pub const ZC_STAGED_ENV: &str = "DEVCOMM_ZC_STAGED";

/// How a message into a registered destination travels ([`zero_copy_route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZcRoute {
    /// The ordinary send/recv path ([`default_config`] or the tuning table) into the
    /// registered destination: low-latency lines up to `ll_max_bytes`, staged chunks above.
    /// The two sides' ranges are not compared.
    Staged,
    /// This many SM blocks of the sender write straight into the receiver's buffer after the
    /// receiver posted a matching descriptor.
    Blocks(u32),
    /// One `cuMemcpyAsync` of the sender straight into the receiver's buffer, paced by a
    /// one-warp kernel after the receiver posted a matching descriptor.
    CopyEngine,
}

/// The smallest zero-copy message the copy engine moves ([`ZC_CE_MIN_ENV`]).
pub fn zero_copy_ce_min() -> u64 {
    static MIN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        parse_ce_min(std::env::var(ZC_CE_MIN_ENV).ok().as_deref()).unwrap_or(ZC_CE_MIN_BYTES)
    })
}

/// The route of a zero-copy message of `bytes`, the same on both sides (it depends on the
/// size and the environment only): low-latency up to `ll_max_bytes`, the copy engine from
/// [`zero_copy_ce_min`], staged (or SM blocks, [`ZC_STAGED_ENV`] = `0`) between.
pub fn zero_copy_route(bytes: u64, limits: &P2PLimits) -> ZcRoute {
    static STAGED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let staged =
        *STAGED.get_or_init(|| std::env::var(ZC_STAGED_ENV).map_or(true, |v| v.trim() != "0"));
    if bytes <= limits.ll_max_bytes {
        ZcRoute::Staged
    } else if bytes >= zero_copy_ce_min() {
        ZcRoute::CopyEngine
    } else if staged {
        ZcRoute::Staged
    } else {
        ZcRoute::Blocks(zero_copy_blocks(bytes, limits))
    }
}

/// [`ZC_CE_MIN_ENV`]'s value: `off` is `u64::MAX`; anything unreadable is the default.
fn parse_ce_min(v: Option<&str>) -> Option<u64> {
    match v.map(str::trim)? {
        "off" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// Candidate configurations for a message of `bytes`, in a fixed order (every rank iterates
/// the same list): what `devcomm bench --sweep` tries.
pub fn sweep_configs(bytes: u64, limits: &P2PLimits) -> Vec<P2PConfig> {
    let mut out = Vec::new();
    if bytes <= limits.ll_max_bytes {
        for blocks in [1u32, 2, 4, 8, 16, 32] {
            if blocks <= limits.max_blocks && u64::from(blocks) * 256 <= bytes.max(256) * 4 {
                out.push(P2PConfig {
                    protocol: Protocol::LowLatency,
                    blocks,
                    threads: 256,
                    chunk_bytes: 0,
                });
            }
        }
    }
    if bytes >= 16 << 10 && bytes <= limits.ll128_max_bytes {
        for threads in [256u32, MAX_ROLE_THREADS] {
            for blocks in [8u32, 16, 32] {
                if blocks <= limits.max_blocks {
                    out.push(P2PConfig {
                        protocol: Protocol::LowLatency128,
                        blocks,
                        threads,
                        chunk_bytes: 0,
                    });
                }
            }
        }
    }
    if bytes >= 1 << 20 {
        for threads in [256u32, MAX_ROLE_THREADS] {
            for blocks in [8u32, 16, 32] {
                for chunk in [16384u64, 32768] {
                    if blocks <= limits.max_blocks && chunk <= limits.slot_bytes {
                        out.push(P2PConfig {
                            protocol: Protocol::Pull,
                            blocks,
                            threads,
                            chunk_bytes: chunk,
                        });
                    }
                }
            }
        }
    }
    if bytes >= 4 << 20 {
        for blocks in [8u32, 16, 32] {
            for chunk in [8u64 << 20, 16 << 20, 32 << 20] {
                if blocks <= limits.max_blocks && chunk <= limits.ce_slot_bytes() {
                    out.push(P2PConfig {
                        protocol: Protocol::CopyEngine,
                        blocks,
                        threads: MAX_ROLE_THREADS,
                        chunk_bytes: chunk,
                    });
                }
            }
        }
    }
    if bytes >= 4096 {
        for threads in [256u32, MAX_ROLE_THREADS] {
            for blocks in [4u32, 8, 16, 24, 32] {
                for chunk in [8192u64, 16384, 32768, 65536] {
                    let channels = u64::from(blocks) * u64::from(threads / 32);
                    if blocks <= limits.max_blocks
                        && chunk <= limits.slot_bytes
                        && bytes >= channels * 256
                    {
                        out.push(P2PConfig {
                            protocol: Protocol::Push,
                            blocks,
                            threads,
                            chunk_bytes: chunk,
                        });
                    }
                }
            }
        }
    }
    out
}

impl P2PConfig {
    /// The guard before launch: refuses what the window cannot hold.
    pub fn check(&self, op: &'static str, bytes: u64, limits: &P2PLimits) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidArgument { op, reason });
        if self.blocks == 0 || self.blocks > limits.max_blocks {
            return bad(format!(
                "{} blocks requested; the signal pad has slots for 1..={} blocks per peer",
                self.blocks, limits.max_blocks
            ));
        }
        if self.threads == 0 || self.threads % 32 != 0 || self.threads > 512 {
            return bad(format!(
                "{} threads per role; use a multiple of 32 up to 512",
                self.threads
            ));
        }
        match self.protocol {
            Protocol::LowLatency if bytes > limits.ll_max_bytes => Err(Error::CapacityExceeded {
                op,
                peer: usize::MAX,
                bytes,
                capacity: limits.ll_max_bytes,
            }),
            Protocol::LowLatency128 if bytes > limits.ll128_max_bytes => {
                Err(Error::CapacityExceeded {
                    op,
                    peer: usize::MAX,
                    bytes,
                    capacity: limits.ll128_max_bytes,
                })
            }
            p if p.is_staged() && (self.chunk_bytes == 0 || self.chunk_bytes % 16 != 0) => {
                bad(format!(
                    "chunk of {} bytes; use a positive multiple of 16",
                    self.chunk_bytes
                ))
            }
            Protocol::CopyEngine
                if self.chunk_bytes < CE_MIN_CHUNK || self.chunk_bytes % 256 != 0 =>
            {
                bad(format!(
                    "copy-engine chunk of {} bytes; use a multiple of 256 of at least {}",
                    self.chunk_bytes, CE_MIN_CHUNK
                ))
            }
            Protocol::CopyEngine if self.chunk_bytes > limits.ce_slot_bytes() => {
                Err(Error::CapacityExceeded {
                    op,
                    peer: usize::MAX,
                    bytes: self.chunk_bytes,
                    capacity: limits.ce_slot_bytes(),
                })
            }
            Protocol::CopyEngine if self.threads != 256 && self.threads != MAX_ROLE_THREADS => {
                bad(format!(
                    "{} threads per receiver block; the copy-engine receiver has 256 or 512",
                    self.threads
                ))
            }
            p if p.is_staged() && self.chunk_bytes > limits.slot_bytes => {
                Err(Error::CapacityExceeded {
                    op,
                    peer: usize::MAX,
                    bytes: self.chunk_bytes,
                    capacity: limits.slot_bytes,
                })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_the_guard_at_every_size() {
        let limits = P2PLimits::default();
        for shift in 0..=31 {
            for bytes in [(1u64 << shift) - 1, 1 << shift, (1 << shift) + 1] {
                let c = default_config(bytes, &limits);
                c.check("test", bytes, &limits).unwrap();
            }
        }
    }

    #[test]
    fn small_messages_use_low_latency_and_large_ones_bulk() {
        let limits = P2PLimits::default();
        assert_eq!(default_config(8, &limits).protocol, Protocol::LowLatency);
        assert_eq!(default_config(8, &limits).blocks, 1);
        assert!(default_config(64 << 20, &limits).protocol.is_staged());
        // From CE_DEFAULT_MIN the copy-engine layout (negotiated per launch), unless turned off.
        let large = default_config(CE_DEFAULT_MIN, &limits).protocol;
        if ce_enabled() {
            assert_eq!(large, Protocol::CopyEngine);
            assert!(default_config(CE_DEFAULT_MIN - 1, &limits)
                .protocol
                .is_staged());
        } else {
            assert!(large.is_staged());
        }
        // The protocol only moves forward as the size grows: LL, then LL128, then staged.
        let rank = |p: Protocol| match p {
            Protocol::LowLatency => 0,
            Protocol::LowLatency128 => 1,
            _ => 2,
        };
        let mut last = 0;
        for b in (1u64..=(64 << 20)).step_by(4099) {
            let r = rank(default_config(b, &limits).protocol);
            assert!(r >= last, "{b} bytes goes back to an earlier protocol");
            last = r;
        }
        assert_eq!(last, 2);
        if ll128_enabled() {
            let c = default_config(1 << 20, &limits);
            assert_eq!(c.protocol, Protocol::LowLatency128);
            assert!(c.blocks >= 1 && c.blocks <= limits.max_blocks);
        }
    }

    #[test]
    fn window_fits_the_smallest_gpu() {
        let limits = P2PLimits::default();
        // An H200 (132 SMs) keeps the default; so does a half share of one (66).
        assert_eq!(fit_to_sms(limits, false, 132).unwrap(), limits);
        assert_eq!(fit_to_sms(limits, false, 66).unwrap().max_blocks, 32);
        assert_eq!(resident_blocks(32), 66);
        // A quarter share (33 SMs): the default shrinks to 15 blocks, 32 resident at most.
        let quarter = fit_to_sms(limits, false, 33).unwrap();
        assert_eq!(quarter.max_blocks, 15);
        assert_eq!(
            P2PLimits {
                max_blocks: 15,
                ..limits
            },
            quarter
        );
        assert!(resident_blocks(quarter.max_blocks) <= 33);
        // Every default configuration then fits the smaller window.
        for shift in 0..=30 {
            let c = default_config(1u64 << shift, &quarter);
            c.check("send", 1u64 << shift, &quarter).unwrap();
        }
        // Asked for explicitly, too many blocks are refused with the numbers to use.
        let err = fit_to_sms(limits, true, 33).unwrap_err().to_string();
        assert!(
            err.contains("66 SMs") && err.contains("at most 15"),
            "{err}"
        );
        assert!(fit_to_sms(
            P2PLimits {
                max_blocks: 15,
                ..limits
            },
            true,
            33
        )
        .is_ok());
        // Fewer than 4 SMs cannot hold two roles and a pacing block.
        assert!(fit_to_sms(limits, false, 3).is_err());
        assert_eq!(max_blocks_for_sms(4), Some(1));
        assert_eq!(max_blocks_for_sms(5), Some(1));
        assert_eq!(max_blocks_for_sms(6), Some(2));
    }

    #[test]
    fn guard_refuses_what_the_window_cannot_hold() {
        let limits = P2PLimits::default();
        let mut c = default_config(1 << 30, &limits);
        c.blocks = limits.max_blocks + 1;
        assert!(c
            .check("send", 1 << 30, &limits)
            .unwrap_err()
            .to_string()
            .contains("blocks"));
        let mut c = staged_config(1 << 30, &limits);
        c.chunk_bytes = limits.slot_bytes * 2;
        assert!(matches!(
            c.check("send", 1 << 30, &limits),
            Err(Error::CapacityExceeded { .. })
        ));
        let mut c = default_config(8, &limits);
        c.protocol = Protocol::LowLatency;
        assert!(matches!(
            c.check("send", limits.ll_max_bytes + 1, &limits),
            Err(Error::CapacityExceeded { .. })
        ));
        c.protocol = Protocol::LowLatency128;
        c.check("send", limits.ll128_max_bytes, &limits).unwrap();
        assert!(matches!(
            c.check("send", limits.ll128_max_bytes + 1, &limits),
            Err(Error::CapacityExceeded { .. })
        ));
    }

    #[test]
    fn region_layout_holds_staging_and_both_parities() {
        let l = P2PLimits::default();
        assert_eq!(l.max_channels(), 512);
        assert_eq!(l.ll_offset(), 512 * 4 * (32 << 10));
        assert!(l.region_bytes() >= l.ll_offset() + 4 * l.ll_max_bytes);
        // LL128 lines follow the LL lines, 128-byte aligned, and fill the region (the kernel
        // derives their size from region_bytes): the largest message of 16-byte units fits
        // with a line of rounding per block.
        let ll128_offset = l.ll_offset() + 2 * l.ll_parity_bytes();
        assert_eq!(ll128_offset % 128, 0);
        assert_eq!(
            (l.region_bytes() - ll128_offset) / 2,
            l.ll128_parity_bytes()
        );
        let lines = l.ll128_max_bytes.div_ceil(LL128_MIN_PAYLOAD) + u64::from(l.max_blocks);
        assert!(l.ll128_parity_bytes() >= 128 * lines);
        assert_eq!(l.count_slot0(4), 4 * (2 * 512 + 32));
        assert_eq!(l.zc_slot0(4), 4 * (2 * 512 + 32) + 16);
        assert_eq!(l.mode_slot0(4), 4 * (2 * 512 + 32) + 16 + 4 * (4 + 32));
        assert_eq!(l.ce_slot0(4), l.mode_slot0(4) + 4 * 512 * 4);
        assert_eq!(l.signal_slots(4), l.ce_slot0(4) + 4 * CE_WORDS);
        // Copy-engine slots of 32 MiB: the even ones overlay the push staging (64 MiB), the
        // odd ones the outbox (as large).
        assert_eq!(l.ce_slot_bytes(), 32 << 20);
        for i in 0..CE_SLOTS as usize {
            assert!(l.ce_slot_offset(i) + l.ce_slot_bytes() <= l.ll_offset());
            assert_eq!(ce_pulled(i), i % 2 == 1);
        }
        assert_eq!(l.outbox_offset(4, 0), 4 * l.region_bytes());
        assert_eq!(
            l.outbox_offset(4, 3),
            4 * l.region_bytes() + 3 * l.ll_offset()
        );
        // Regions per sender, then outboxes per receiver of the same staging size.
        assert_eq!(l.window_bytes(4), 4 * l.region_bytes() + 4 * l.ll_offset());
    }

    #[test]
    fn copy_engine_configs_pass_or_fail_the_guard_as_documented() {
        let l = P2PLimits::default();
        for bytes in [1u64, 4 << 20, 64 << 20, 1 << 30, (1 << 30) + 7] {
            ce_config(bytes, &l).check("test", bytes, &l).unwrap();
            for c in sweep_configs(bytes, &l) {
                c.check("test", bytes, &l).unwrap();
            }
        }
        let ok = ce_config(1 << 30, &l);
        let with = |chunk_bytes: u64, threads: u32| P2PConfig {
            chunk_bytes,
            threads,
            ..ok
        };
        assert!(with(l.ce_slot_bytes() + 256, 512)
            .check("t", 1 << 30, &l)
            .is_err());
        assert!(with(CE_MIN_CHUNK - 256, 512)
            .check("t", 1 << 30, &l)
            .is_err());
        assert!(with(CE_MIN_CHUNK + 16, 512)
            .check("t", 1 << 30, &l)
            .is_err());
        assert!(with(CE_MIN_CHUNK, 384).check("t", 1 << 30, &l).is_err());
        with(CE_MIN_CHUNK, 256).check("t", 1 << 30, &l).unwrap();
        // Copy-engine chunks of half a slot at every size the defaults use it.
        assert_eq!(ce_config(1 << 30, &l).chunk_bytes, l.ce_slot_bytes() / 2);
    }

    #[test]
    fn bulk_pulls_one_way_from_the_threshold_and_pushes_both_ways() {
        if std::env::var(PULL_ENV).is_ok() {
            return; // forced by the user then
        }
        assert!(!auto_pull(PULL_MIN_BYTES - 1, false));
        assert!(auto_pull(PULL_MIN_BYTES, false));
        assert!(auto_pull(1 << 30, false));
        assert!(!auto_pull(1 << 30, true));
    }

    #[test]
    fn zero_copy_blocks_grow_with_the_size_within_the_signal_slots() {
        let limits = P2PLimits::default();
        if std::env::var(ZC_BLOCKS_ENV).is_ok() {
            return; // the cap is the user's then
        }
        assert_eq!(zero_copy_blocks(0, &limits), 1);
        assert_eq!(zero_copy_blocks(64 << 10, &limits), 1);
        assert_eq!(zero_copy_blocks((64 << 10) + 1, &limits), 2);
        assert_eq!(zero_copy_blocks(1 << 20, &limits), 16);
        assert_eq!(zero_copy_blocks(1 << 30, &limits), 16);
        let small = P2PLimits {
            max_blocks: 4,
            ..limits
        };
        assert_eq!(zero_copy_blocks(1 << 30, &small), 4);
    }

    #[test]
    fn zero_copy_route_by_size() {
        assert_eq!(parse_ce_min(Some(" off")), Some(u64::MAX));
        assert_eq!(parse_ce_min(Some("1048576")), Some(1 << 20));
        assert_eq!(parse_ce_min(Some("lots")), None);
        assert_eq!(parse_ce_min(None), None);
        if std::env::var(ZC_CE_MIN_ENV).is_ok() || std::env::var(ZC_STAGED_ENV).is_ok() {
            return; // the routes are the user's then
        }
        let limits = P2PLimits::default();
        let route = |b| zero_copy_route(b, &limits);
        assert_eq!(route(0), ZcRoute::Staged);
        assert_eq!(route(limits.ll_max_bytes), ZcRoute::Staged);
        assert_eq!(route(limits.ll_max_bytes + 1), ZcRoute::Staged);
        assert_eq!(route(ZC_CE_MIN_BYTES - 1), ZcRoute::Staged);
        assert_eq!(route(ZC_CE_MIN_BYTES), ZcRoute::CopyEngine);
        assert_eq!(route(1 << 30), ZcRoute::CopyEngine);
    }

    #[test]
    fn every_sweep_candidate_passes_the_guard() {
        let limits = P2PLimits::default();
        for shift in 0..=30 {
            let bytes = 1u64 << shift;
            let all = sweep_configs(bytes, &limits);
            assert!(!all.is_empty(), "no candidate at {bytes}");
            for c in all {
                c.check("sweep", bytes, &limits).unwrap();
            }
        }
    }
}
