//! The protocols of send/recv, the knobs of one direction ([`P2PConfig`]) and the guard
//! before launch ([`P2PConfig::check`]).

#[allow(unused_imports)]
use super::window::{P2PLimits, MAX_ROLE_THREADS};
use crate::error::{Error, Result};

/// The smallest copy-engine chunk the guard accepts: below it the copy engine's per-copy cost
/// dominates.
pub const CE_MIN_CHUNK: u64 = 64 << 10;

/// How a message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Protocol {
    /// 16-byte lines of 8 payload bytes plus flags: one store moves and signals (small messages).
    LowLatency,
    /// 128-byte lines of 120 payload bytes and a flag word, written by eight lanes of a warp in
    /// one instruction (mid-size messages: a sixteenth of the wire overhead of
    /// [`Protocol::LowLatency`], and no fence or signal per chunk as in the staged protocols).
    /// Relies on NVLink delivering a warp's aligned 128-byte store whole, as NCCL's LL128 does;
    /// `DEVCOMM_P2P_LL128=0` keeps it out of the defaults.
    LowLatency128,
    /// Staged, pipelined chunks with TAIL/HEAD signals (large messages); the sender picks
    /// where the chunks are staged ([`pull_by_default`](super::defaults::pull_by_default)): pulled for a one-way message, pushed
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
