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
    /// Staged, pipelined chunks with TAIL/HEAD signals (large messages).
    Bulk,
}

/// The knobs of one direction of a send/recv.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct P2PConfig {
    /// Protocol.
    pub protocol: Protocol,
    /// Thread blocks (one SM each) per direction.
    pub blocks: u32,
    /// Threads per block for this role (a multiple of 32; 256 or 512).
    pub threads: u32,
    /// Bulk bytes per pipeline step.
    pub chunk_bytes: u64,
}

/// Sizes of the p2p window, fixed when the communicator is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2PLimits {
    /// Signal slots per (peer, kind): the most blocks a direction may use.
    pub max_blocks: u32,
    /// Staging slots per block.
    pub depth: u32,
    /// Bytes per staging slot: the largest chunk.
    pub slot_bytes: u64,
    /// Largest low-latency message.
    pub ll_max_bytes: u64,
}

impl Default for P2PLimits {
    fn default() -> Self {
        Self {
            max_blocks: 32,
            depth: 4,
            slot_bytes: 256 << 10,
            ll_max_bytes: 256 << 10,
        }
    }
}

impl P2PLimits {
    /// Bytes of the low-latency lines of one parity: 16 bytes per 8 payload bytes, plus one
    /// line of rounding per block.
    pub fn ll_parity_bytes(&self) -> u64 {
        2 * self.ll_max_bytes + 16 * u64::from(self.max_blocks)
    }

    /// Offset of the low-latency lines inside one sender's region.
    pub fn ll_offset(&self) -> u64 {
        u64::from(self.max_blocks) * u64::from(self.depth) * self.slot_bytes
    }

    /// One sender's region in a receiver's window.
    pub fn region_bytes(&self) -> u64 {
        self.ll_offset() + 2 * self.ll_parity_bytes()
    }

    /// User signal slots of the p2p window: TAIL, HEAD and LLHEAD per (peer, block).
    pub fn signal_slots(&self, world_size: usize) -> usize {
        3 * world_size * self.max_blocks as usize
    }
}

/// The default configuration for a message of `bytes` (measured on H200 NVLink; see
/// docs/PERFORMANCE.md).
pub fn default_config(bytes: u64, limits: &P2PLimits) -> P2PConfig {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    let ll_switch = (64 * KIB).min(limits.ll_max_bytes);
    let clamp = |b: u32| b.clamp(1, limits.max_blocks);
    if bytes <= ll_switch {
        // About 2 KiB of payload per block keeps each thread to a few lines.
        let blocks = clamp(bytes.div_ceil(2 * KIB) as u32);
        return P2PConfig {
            protocol: Protocol::LowLatency,
            blocks,
            threads: 256,
            chunk_bytes: 0,
        };
    }
    let (blocks, chunk) = if bytes <= MIB {
        (16, 16 * KIB)
    } else if bytes <= 8 * MIB {
        (16, 64 * KIB)
    } else {
        (16, 256 * KIB)
    };
    P2PConfig {
        protocol: Protocol::Bulk,
        blocks: clamp(blocks),
        threads: 512,
        chunk_bytes: chunk.min(limits.slot_bytes),
    }
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
            Protocol::Bulk if self.chunk_bytes == 0 || self.chunk_bytes % 16 != 0 => bad(format!(
                "chunk of {} bytes; use a positive multiple of 16",
                self.chunk_bytes
            )),
            Protocol::Bulk if self.chunk_bytes > limits.slot_bytes => {
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
        assert_eq!(
            default_config(64 << 10, &limits).protocol,
            Protocol::LowLatency
        );
        assert_eq!(
            default_config((64 << 10) + 1, &limits).protocol,
            Protocol::Bulk
        );
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
        let mut c = default_config(1 << 30, &limits);
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
    }

    #[test]
    fn region_layout_holds_staging_and_both_parities() {
        let l = P2PLimits::default();
        assert_eq!(l.ll_offset(), 32 * 4 * (256 << 10));
        assert!(l.region_bytes() >= l.ll_offset() + 4 * l.ll_max_bytes);
        assert_eq!(l.signal_slots(4), 3 * 4 * 32);
    }
}
