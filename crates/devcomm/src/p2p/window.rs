//! Geometry of the p2p window ([`P2PLimits`]): staging regions, low-latency lines, copy-engine
//! slots and outboxes, signal-pad slots, and the fit of the block count to the GPU's SMs.

use crate::abi::CE_WORDS;
use crate::error::{Error, Result};

/// Payload bytes of an LL128 line for 16-byte units (120 for 8-byte units, as send/recv uses).
pub const LL128_MIN_PAYLOAD: u64 = 112;

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
pub(super) fn resident_blocks(max_blocks: u32) -> u32 {
    2 * (max_blocks + 1)
}

/// The most blocks per direction whose launches stay resident on `sms` SMs: one block of
/// [`MAX_ROLE_THREADS`] threads per SM, since those kernels use more than 64 registers a thread
/// (the negotiated kernel 128), so [`resident_blocks`] of it must not exceed `sms`. `None` when
/// not even one block per direction fits.
pub(super) fn max_blocks_for_sms(sms: u32) -> Option<u32> {
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
