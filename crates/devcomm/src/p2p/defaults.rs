//! The size policy: the default configuration of a message by its size ([`default_config`]),
//! the staged and copy-engine defaults, bulk pull or push, and the route of a zero-copy
//! message. The configuration's switches it honours come in as [`Switches`].

use super::protocol::{P2PConfig, Protocol, CE_MIN_CHUNK};
use super::switches::Switches;
use super::window::{P2PLimits, MAX_ROLE_THREADS};

/// The smallest message the defaults send by the copy engine (when it is on): one way, the
/// copy engine was ahead of SM pull from 256 MiB and behind at 64 MiB (docs/PERFORMANCE.md,
/// v15).
pub const CE_DEFAULT_MIN: u64 = 256 << 20;

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

/// The default configuration for a message of `bytes` (measured on H200 NVLink; see
/// docs/PERFORMANCE.md).
/// `sw.ll128` and `sw.ce` keep LL128 and the copy engine out of them.
pub fn default_config(bytes: u64, limits: &P2PLimits, sw: &Switches) -> P2PConfig {
    let (ll128, ce) = (sw.ll128, sw.ce);
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
    if ll128 && bytes <= LL128_DEFAULT_MAX.min(limits.ll128_max_bytes) {
        return P2PConfig {
            protocol: Protocol::LowLatency128,
            blocks: clamp(bytes.div_ceil(LL128_BYTES_PER_BLOCK)),
            threads: MAX_ROLE_THREADS,
            chunk_bytes: 0,
        };
    }
    if ce && bytes >= CE_DEFAULT_MIN && limits.ce_slot_bytes() >= CE_MIN_CHUNK {
        return ce_config(bytes, limits);
    }
    staged_config(bytes, limits)
}

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

/// One-way bulk messages from this size on are pulled by default (measured: pull is ahead
/// from 1 MiB on 32 blocks; docs/PERFORMANCE.md, v7).
pub const PULL_MIN_BYTES: u64 = 1 << 20;

/// Whether the sender of a [`Protocol::Bulk`] message of `bytes` stages it for the receiver
/// to pull. `receives_from_peer`: the same launch also receives from that peer, so the link
/// carries data both ways, where pushing is faster (pulling both ways, or pushing one way and
/// pulling the other, measured slower: docs/PERFORMANCE.md, v7).
/// `forced`: the configuration's choice (`DEVCOMM_P2P_PULL`), if any.
pub fn pull_by_default(bytes: u64, receives_from_peer: bool, forced: Option<bool>) -> bool {
    forced.unwrap_or(bytes >= PULL_MIN_BYTES && !receives_from_peer)
}

/// Blocks (of 512 threads) that push a zero-copy message of `bytes` straight into the peer's
/// registered buffer. Sender and receiver both take it from the size. SM push reaches its
/// plateau with 8 blocks at 1 GiB and 181 GB/s at 1 MiB (BASELINES.md); a block per 64 KiB
/// keeps small messages on few SMs. `sw.zc_blocks` caps it (`DEVCOMM_ZC_BLOCKS`).
pub fn zero_copy_blocks(bytes: u64, limits: &P2PLimits, sw: &Switches) -> u32 {
    let cap = sw.zc_blocks;
    let blocks = bytes.div_ceil(64 << 10).clamp(1, cap.max(1));
    (blocks as u32).min(limits.max_blocks)
}

/// Zero-copy messages from this size on are moved by the sender's copy engine
/// (docs/PROTOCOL.md, "Zero-copy by copy engine"). Measured on 2 H200s (docs/PERFORMANCE.md,
/// v10): ahead of SM blocks from 64 MiB one way (205 against 216 us) and both ways (equal at
/// 64 MiB, 780 against 816 us at 256 MiB); a fixed ~21 us per call puts it behind below.
pub const ZC_CE_MIN_BYTES: u64 = 64 << 20;

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

/// The route of a zero-copy message of `bytes`, the same on both sides (it depends on the
/// size and the must-agree switches only): low-latency up to `ll_max_bytes`, the copy engine
/// from `sw.zc_ce_min`, staged (or SM blocks, `sw.zc_staged` off) between.
pub fn zero_copy_route(bytes: u64, limits: &P2PLimits, sw: &Switches) -> ZcRoute {
    if bytes <= limits.ll_max_bytes {
        ZcRoute::Staged
    } else if bytes >= sw.zc_ce_min {
        ZcRoute::CopyEngine
    } else if sw.zc_staged {
        ZcRoute::Staged
    } else {
        ZcRoute::Blocks(zero_copy_blocks(bytes, limits, sw))
    }
}
