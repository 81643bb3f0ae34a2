//! The candidate configurations that `devcomm bench --sweep` tries.

use super::protocol::{P2PConfig, Protocol};
use super::window::{P2PLimits, MAX_ROLE_THREADS};

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
