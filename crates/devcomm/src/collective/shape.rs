//! The collective kernel's grid: blocks per peer role and for the own chunk, fitted to the GPU,
//! the p2p window and small (LL) transfers. Pure functions, the same on every rank.

/// Threads per block of the collective kernel (16 warps: 16 bulk channels per block).
pub(crate) const THREADS: u32 = 512;

/// Most blocks per (peer, role). Each role of each peer gets at most this many; the kernel has
/// `(2 W - 1)` roles, which must all be resident at once.
pub(crate) const MAX_BLOCKS_PER_PEER: u32 = 32;

/// Wire bytes per (peer, direction) up to which the kernel moves LL lines, one block per
/// [`LL_BLOCK_BYTES`] (`kLlMax` and `THREADS x 16` in `collective.cuh`).
pub(crate) const LL_MAX_BYTES: u64 = 128 << 10;
/// Wire bytes one block moves as LL lines.
pub(crate) const LL_BLOCK_BYTES: u64 = THREADS as u64 * 16;

/// `shape` with no more blocks per peer than a transfer of `peer_wire` bytes (every peer's, in
/// each direction, equal on every rank) uses when it goes as LL lines: the kernel's plan gives
/// such a transfer one block per [`LL_BLOCK_BYTES`], so the other blocks of each peer role would
/// only start and exit. At 1 KiB per peer on 4 ranks the grid is then 7 blocks instead of
/// 127. Larger transfers (LL128, bulk) keep the shape. The plan takes the smaller of its own
/// count and the blocks per peer, so a lower value where the device constants differ stays
/// correct, as long as every rank computes the same shape.
pub(crate) fn fit_low_latency(shape: CollShape, peer_wire: Option<u64>) -> CollShape {
    match peer_wire {
        Some(w) if w <= LL_MAX_BYTES => CollShape {
            per_peer: shape.per_peer.min(w.div_ceil(LL_BLOCK_BYTES).max(1) as u32),
            ..shape
        },
        _ => shape,
    }
}

/// Blocks of the collective kernel: `per_peer` for each of the `2 (W - 1)` peer roles (a sender
/// and a receiver per peer) and `self_blocks` for the own chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollShape {
    /// Blocks of each peer role.
    pub per_peer: u32,
    /// Blocks of the own chunk's role.
    pub self_blocks: u32,
}

impl CollShape {
    /// The grid: every block, all of which must be resident at once.
    pub fn grid(&self, world: usize) -> u32 {
        2 * (world.max(1) as u32 - 1) * self.per_peer + self.self_blocks
    }
}

/// The collective kernel's shape on GPUs of `sm_count` SMs (one block per SM), for `world`
/// ranks and a p2p window of `max_blocks` blocks per peer. Every role gets an even share,
/// `sm_count / (2 W - 1)` blocks (at most [`MAX_BLOCKS_PER_PEER`] and `max_blocks`), unless
/// the own chunk's input size is known (`self_bytes`, not with device counts) and
/// `self_block_bytes` is not 0: then the own chunk gets one block per `self_block_bytes` (at
/// least 1, at most the share), and when that is fewer than the share the peers split the SMs
/// it leaves. Every rank computes the same shape from the same arguments.
pub(crate) fn coll_shape(
    sm_count: u32,
    world: usize,
    max_blocks: u32,
    self_bytes: Option<u64>,
    self_block_bytes: u64,
) -> CollShape {
    let world = world.max(1) as u32;
    let cap = |b: u32| b.min(MAX_BLOCKS_PER_PEER).min(max_blocks).max(1);
    let even = cap(sm_count / (2 * world - 1));
    let self_blocks = match self_bytes {
        Some(bytes) if self_block_bytes > 0 && world > 1 => {
            (bytes.div_ceil(self_block_bytes).max(1)).min(even as u64) as u32
        }
        _ => even,
    };
    // The SMs a small own chunk leaves go to the peers; otherwise every role keeps the even
    // share (giving a large own chunk the few SMs left over measured no faster: PERFORMANCE c10).
    let per_peer = if self_blocks < even {
        cap(sm_count.saturating_sub(self_blocks) / (2 * (world - 1)))
    } else {
        even
    };
    CollShape {
        per_peer,
        self_blocks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Own-chunk bytes per block of the own chunk's role (the setting's default): the own chunk
    /// is a local copy, about 15 GB/s per SM on H200, while a peer's chunk moves at 3-6 GB/s per
    /// sending SM, so the own chunk needs fewer blocks than a peer.
    const SELF_BLOCK_BYTES: u64 = 128 << 10;

    #[test]
    fn low_latency_transfers_get_only_the_blocks_their_plan_uses() {
        let full = coll_shape(132, 4, 32, Some(1024), SELF_BLOCK_BYTES);
        // 1 KiB per peer: one block per peer role and one for the own chunk.
        let small = fit_low_latency(full, Some(1024));
        assert_eq!((small.per_peer, small.self_blocks), (1, 1));
        assert_eq!(small.grid(4), 7);
        // 64 KiB: 8 blocks of 8 KiB; the largest LL size: 16.
        assert_eq!(fit_low_latency(full, Some(64 << 10)).per_peer, 8);
        assert_eq!(fit_low_latency(full, Some(LL_MAX_BYTES)).per_peer, 16);
        // LL128 and bulk sizes, unknown sizes: the shape as it was.
        assert_eq!(fit_low_latency(full, Some(LL_MAX_BYTES + 16)), full);
        assert_eq!(fit_low_latency(full, None), full);
        // Never more than the shape had, never 0.
        let narrow = coll_shape(16, 8, 32, None, SELF_BLOCK_BYTES);
        assert_eq!(
            fit_low_latency(narrow, Some(64 << 10)).per_peer,
            narrow.per_peer
        );
        assert_eq!(fit_low_latency(full, Some(0)).per_peer, 1);
    }

    #[test]
    fn every_role_gets_an_even_share_without_a_known_own_chunk() {
        // 132 SMs, 4 ranks: 7 roles of 18 blocks (device counts, or the knob set to 0).
        let even = CollShape {
            per_peer: 18,
            self_blocks: 18,
        };
        assert_eq!(coll_shape(132, 4, 32, None, SELF_BLOCK_BYTES), even);
        assert_eq!(coll_shape(132, 4, 32, Some(1 << 20), 0), even);
        assert_eq!(even.grid(4), 126);
        // One rank: only the own chunk.
        let one = coll_shape(132, 1, 32, Some(1 << 20), SELF_BLOCK_BYTES);
        assert_eq!(one.grid(1), one.self_blocks);
    }

    #[test]
    fn a_small_own_chunk_leaves_its_blocks_to_the_peers() {
        let s = coll_shape(132, 4, 32, Some(1 << 20), SELF_BLOCK_BYTES);
        assert_eq!((s.self_blocks, s.per_peer, s.grid(4)), (8, 20, 128));
        // At least one block for an empty own chunk; at most the even share for a large one.
        let s = coll_shape(132, 4, 32, Some(0), SELF_BLOCK_BYTES);
        assert_eq!((s.self_blocks, s.per_peer), (1, 21));
        let s = coll_shape(132, 4, 32, Some(1 << 30), SELF_BLOCK_BYTES);
        assert_eq!((s.self_blocks, s.per_peer), (18, 18));
    }

    #[test]
    fn shapes_fit_the_gpu_and_the_window() {
        for sm in [1u32, 7, 16, 78, 132, 144] {
            for world in 1..=8usize {
                for max_blocks in [1u32, 4, 16, 32] {
                    for self_bytes in [None, Some(0), Some(1 << 16), Some(1 << 20), Some(1 << 28)] {
                        let s = coll_shape(sm, world, max_blocks, self_bytes, SELF_BLOCK_BYTES);
                        assert!(s.per_peer >= 1 && s.self_blocks >= 1);
                        assert!(s.per_peer <= max_blocks.min(MAX_BLOCKS_PER_PEER));
                        let roles = 2 * world as u32 - 1;
                        // Every block resident whenever one block per role fits.
                        if sm >= roles {
                            assert!(
                                s.grid(world) <= sm,
                                "{sm} {world} {max_blocks} {self_bytes:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
