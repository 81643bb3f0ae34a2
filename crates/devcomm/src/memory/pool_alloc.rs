//! The memory pool's sub-allocator: pure bookkeeping of byte ranges inside the pool's
//! segments (no CUDA, no communication), so that allocation and free stay local and cheap.
//!
//! First fit over the segments in creation order and, inside a segment, in address order;
//! every allocation is a whole number of [`POOL_ALIGN`] bytes at an offset that is a multiple
//! of it (segments are too), and a free merges the range with free neighbours, so a freed
//! pool returns to one free range per segment. First fit in a fixed order keeps the offsets
//! of two ranks that allocate and free the same sizes in the same order equal, which is what
//! makes their slices symmetric.

use std::collections::BTreeMap;

/// Alignment and granule of every allocation, in bytes (the widest vector access of the
/// kernels, and what PyTorch's caching allocator assumes of its segments).
pub(crate) const POOL_ALIGN: u64 = 256;

/// Where an allocation lies: its segment, its byte offset there and its (rounded) size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub segment: usize,
    pub offset: u64,
    pub bytes: u64,
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllocError {
    /// No free range of any segment holds `rounded` bytes (`requested` rounded up).
    Exhausted { requested: u64, rounded: u64 },
}

/// Why a free was refused (nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FreeError {
    /// There is no segment `segment`.
    NoSegment { segment: usize },
    /// No allocation starts at `offset` of `segment` (freed already, never allocated, or
    /// inside an allocation).
    NotAllocated { segment: usize, offset: u64 },
}

/// The free and used ranges of one segment, by offset.
#[derive(Debug)]
struct Ranges {
    capacity: u64,
    free: BTreeMap<u64, u64>,
    used: BTreeMap<u64, u64>,
}

/// The sub-allocator of a pool of segments.
#[derive(Debug, Default)]
pub(crate) struct SubAllocator {
    segments: Vec<Ranges>,
}

/// Totals of a memory pool, for messages and statistics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Each segment's size, in creation order.
    pub segments: Vec<u64>,
    /// Free bytes over all segments.
    pub free: u64,
    /// The largest free range of any segment (the largest allocation that would succeed).
    pub largest_free: u64,
    /// Live allocations.
    pub allocations: usize,
}

/// `bytes` rounded up to [`POOL_ALIGN`] (at least one granule, so that every allocation has
/// an address of its own); `None` on overflow.
pub(crate) fn rounded(bytes: u64) -> Option<u64> {
    bytes.max(1).checked_next_multiple_of(POOL_ALIGN)
}

impl SubAllocator {
    /// Adds a segment of `capacity` bytes (a positive multiple of [`POOL_ALIGN`]), all free;
    /// returns its index.
    pub(crate) fn add_segment(&mut self, capacity: u64) -> usize {
        assert!(
            capacity > 0 && capacity % POOL_ALIGN == 0,
            "pool segments are positive multiples of {POOL_ALIGN} bytes, not {capacity}"
        );
        self.segments.push(Ranges {
            capacity,
            free: BTreeMap::from([(0, capacity)]),
            used: BTreeMap::new(),
        });
        self.segments.len() - 1
    }

    /// Takes `bytes` (rounded up to [`POOL_ALIGN`]) from the first free range that holds them.
    pub(crate) fn alloc(&mut self, bytes: u64) -> Result<Placement, AllocError> {
        let exhausted = |rounded| AllocError::Exhausted {
            requested: bytes,
            rounded,
        };
        let need = rounded(bytes).ok_or(exhausted(u64::MAX))?;
        for (segment, s) in self.segments.iter_mut().enumerate() {
            let Some((&offset, &len)) = s.free.iter().find(|(_, &len)| len >= need) else {
                continue;
            };
            s.free.remove(&offset);
            if len > need {
                s.free.insert(offset + need, len - need);
            }
            s.used.insert(offset, need);
            return Ok(Placement {
                segment,
                offset,
                bytes: need,
            });
        }
        Err(exhausted(need))
    }

    /// Returns the allocation starting at `offset` of `segment` to the free ranges, merged
    /// with free neighbours; returns its size. Anything else is refused, nothing changed.
    pub(crate) fn free(&mut self, segment: usize, offset: u64) -> Result<u64, FreeError> {
        let s = self
            .segments
            .get_mut(segment)
            .ok_or(FreeError::NoSegment { segment })?;
        let len = s
            .used
            .remove(&offset)
            .ok_or(FreeError::NotAllocated { segment, offset })?;
        let (mut start, mut end) = (offset, offset + len);
        if let Some((&prev, &prev_len)) = s.free.range(..start).next_back() {
            if prev + prev_len == start {
                s.free.remove(&prev);
                start = prev;
            }
        }
        if let Some(next_len) = s.free.remove(&end) {
            end += next_len;
        }
        s.free.insert(start, end - start);
        Ok(len)
    }

    /// The allocation starting at `offset` of `segment`: its size, or `None`.
    pub(crate) fn allocated(&self, segment: usize, offset: u64) -> Option<u64> {
        self.segments.get(segment)?.used.get(&offset).copied()
    }

    /// Sizes, free bytes and live allocations of the pool.
    pub(crate) fn usage(&self) -> PoolUsage {
        let free_runs = || self.segments.iter().flat_map(|s| s.free.values().copied());
        PoolUsage {
            segments: self.segments.iter().map(|s| s.capacity).collect(),
            free: free_runs().sum(),
            largest_free: free_runs().max().unwrap_or(0),
            allocations: self.segments.iter().map(|s| s.used.len()).sum(),
        }
    }
}

/// The segment holding all of `[ptr, ptr+bytes)` among segments given as `(base, size)`, and
/// the offset of `ptr` in it. A range that straddles two segments (even adjacent ones) or
/// overflows lies in none: the zero-copy calls address one segment's registration.
pub(crate) fn locate(segments: &[(u64, u64)], ptr: u64, bytes: u64) -> Option<(usize, u64)> {
    let end = ptr.checked_add(bytes)?;
    segments.iter().enumerate().find_map(|(i, &(base, size))| {
        let limit = base.checked_add(size)?;
        (ptr >= base && ptr < limit && end <= limit).then(|| (i, ptr - base))
    })
}

/// The first of `segments` (as `(base, size)`) that shares a byte with `[start, end)`: where
/// memory adopted into a pool would overlap a segment it has.
pub(crate) fn overlapping(segments: &[(u64, u64)], start: u64, end: u64) -> Option<usize> {
    segments.iter().position(|&(base, size)| {
        let limit = base.saturating_add(size);
        size > 0 && start < limit && base < end
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn pool(sizes: &[u64]) -> SubAllocator {
        let mut a = SubAllocator::default();
        for &s in sizes {
            a.add_segment(s);
        }
        a
    }

    #[test]
    fn sizes_round_up_to_the_alignment() {
        assert_eq!(rounded(0), Some(256));
        assert_eq!(rounded(1), Some(256));
        assert_eq!(rounded(256), Some(256));
        assert_eq!(rounded(257), Some(512));
        assert_eq!(rounded(u64::MAX), None);
    }

    #[test]
    fn allocations_are_aligned_disjoint_and_first_fit() {
        let mut a = pool(&[MIB]);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(1000).unwrap();
        let z = a.alloc(256).unwrap();
        assert_eq!((x.offset, x.bytes), (0, 256));
        assert_eq!((y.offset, y.bytes), (256, 1024));
        assert_eq!((z.offset, z.bytes), (1280, 256));
        for p in [x, y, z] {
            assert_eq!(p.segment, 0);
            assert_eq!(p.offset % POOL_ALIGN, 0);
        }
        assert_eq!(a.allocated(0, 256), Some(1024));
        assert_eq!(a.allocated(0, 300), None);
        let u = a.usage();
        assert_eq!((u.free, u.allocations), (MIB - 1536, 3));
    }

    #[test]
    fn freed_ranges_are_reused_and_coalesce() {
        let mut a = pool(&[4096]);
        let p: Vec<Placement> = (0..4).map(|_| a.alloc(1024).unwrap()).collect();
        assert!(a.alloc(1).is_err(), "full");
        // Free the middle two: they merge into one 2 KiB hole that a 2 KiB request fits.
        assert_eq!(a.free(0, p[1].offset), Ok(1024));
        assert_eq!(a.free(0, p[2].offset), Ok(1024));
        assert_eq!(a.usage().largest_free, 2048);
        let big = a.alloc(2048).unwrap();
        assert_eq!(big.offset, 1024);
        // Free everything in a scrambled order: one free range of the whole segment again.
        for off in [big.offset, p[3].offset, p[0].offset] {
            a.free(0, off).unwrap();
        }
        let u = a.usage();
        assert_eq!((u.free, u.largest_free, u.allocations), (4096, 4096, 0));
        assert_eq!(a.segments[0].free.len(), 1);
    }

    #[test]
    fn fragmentation_refuses_what_no_single_hole_holds() {
        let mut a = pool(&[4096]);
        let p: Vec<Placement> = (0..4).map(|_| a.alloc(1024).unwrap()).collect();
        a.free(0, p[0].offset).unwrap();
        a.free(0, p[2].offset).unwrap();
        let u = a.usage();
        assert_eq!((u.free, u.largest_free), (2048, 1024));
        assert_eq!(
            a.alloc(2048),
            Err(AllocError::Exhausted {
                requested: 2048,
                rounded: 2048
            })
        );
        // The failed request changed nothing: both holes are still there, in address order.
        assert_eq!(a.alloc(1000).unwrap().offset, 0);
        assert_eq!(a.alloc(1000).unwrap().offset, 2048);
    }

    #[test]
    fn later_segments_take_what_earlier_ones_cannot() {
        let mut a = pool(&[1024, 4096]);
        let x = a.alloc(2048).unwrap();
        assert_eq!((x.segment, x.offset), (1, 0));
        let y = a.alloc(512).unwrap();
        assert_eq!(
            (y.segment, y.offset),
            (0, 0),
            "first fit starts at segment 0"
        );
        let err = a.alloc(8192).unwrap_err();
        assert_eq!(
            err,
            AllocError::Exhausted {
                requested: 8192,
                rounded: 8192
            }
        );
        assert_eq!(a.usage().segments, vec![1024, 4096]);
        assert_eq!(
            a.alloc(u64::MAX),
            Err(AllocError::Exhausted {
                requested: u64::MAX,
                rounded: u64::MAX
            })
        );
    }

    #[test]
    fn an_empty_pool_is_exhausted() {
        let mut a = SubAllocator::default();
        assert!(matches!(a.alloc(1), Err(AllocError::Exhausted { .. })));
        assert_eq!(a.usage(), PoolUsage::default());
    }

    #[test]
    fn double_and_foreign_frees_are_refused_and_change_nothing() {
        let mut a = pool(&[4096]);
        let x = a.alloc(512).unwrap();
        let y = a.alloc(512).unwrap();
        a.free(0, x.offset).unwrap();
        let before = a.usage();
        assert_eq!(
            a.free(0, x.offset),
            Err(FreeError::NotAllocated {
                segment: 0,
                offset: 0
            })
        );
        // Inside an allocation, not its start.
        assert_eq!(
            a.free(0, y.offset + 256),
            Err(FreeError::NotAllocated {
                segment: 0,
                offset: y.offset + 256
            })
        );
        assert_eq!(a.free(3, 0), Err(FreeError::NoSegment { segment: 3 }));
        assert_eq!(a.usage(), before);
        assert_eq!(a.allocated(0, y.offset), Some(512));
    }

    #[test]
    fn same_order_same_offsets() {
        // Two ranks making the same calls get the same placements: slices are symmetric.
        let script = |a: &mut SubAllocator| {
            let mut out = Vec::new();
            let p = a.alloc(3000).unwrap();
            out.push(p);
            out.push(a.alloc(70_000).unwrap());
            a.free(p.segment, p.offset).unwrap();
            out.push(a.alloc(100).unwrap());
            out.push(a.alloc(5000).unwrap());
            out
        };
        let (mut r0, mut r1) = (pool(&[MIB, 2 * MIB]), pool(&[MIB, 2 * MIB]));
        assert_eq!(script(&mut r0), script(&mut r1));
    }

    #[test]
    fn a_random_workload_keeps_the_books_straight() {
        // A deterministic pseudo-random mix of allocations and frees, checked against a model:
        // live allocations never overlap, and free + used always equals the capacity.
        let mut a = pool(&[64 * 1024, 32 * 1024]);
        let mut live: Vec<Placement> = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..5000 {
            if live.is_empty() || next() % 3 != 0 {
                if let Ok(p) = a.alloc(next() % 6000) {
                    live.push(p);
                }
            } else {
                let i = (next() % live.len() as u64) as usize;
                let p = live.swap_remove(i);
                assert_eq!(a.free(p.segment, p.offset), Ok(p.bytes));
            }
            let used: u64 = live.iter().map(|p| p.bytes).sum();
            assert_eq!(a.usage().free + used, 96 * 1024);
        }
        live.sort_by_key(|p| (p.segment, p.offset));
        for w in live.windows(2) {
            if w[0].segment == w[1].segment {
                assert!(w[0].offset + w[0].bytes <= w[1].offset, "{w:?}");
            }
        }
        for p in live.drain(..) {
            a.free(p.segment, p.offset).unwrap();
        }
        assert_eq!(a.usage().largest_free, 64 * 1024);
    }

    #[test]
    fn lookups_find_the_one_segment_holding_a_range() {
        let segs = [
            (0x10_0000, 0x1000),
            (0x10_1000, 0x1000),
            (0x50_0000, 0x2000),
        ];
        assert_eq!(locate(&segs, 0x10_0000, 0x1000), Some((0, 0)));
        assert_eq!(locate(&segs, 0x10_0f00, 0x100), Some((0, 0xf00)));
        assert_eq!(locate(&segs, 0x10_1000, 1), Some((1, 0)));
        assert_eq!(locate(&segs, 0x50_0100, 0), Some((2, 0x100)));
        // Straddling two adjacent segments, past the end, before the start, overflowing.
        assert_eq!(locate(&segs, 0x10_0f00, 0x200), None);
        assert_eq!(locate(&segs, 0x50_1f00, 0x101), None);
        assert_eq!(locate(&segs, 0xf_ffff, 2), None);
        assert_eq!(locate(&segs, 0x50_2000, 0), None);
        assert_eq!(locate(&segs, u64::MAX, 2), None);
        assert_eq!(locate(&[], 0x10_0000, 1), None);
    }

    #[test]
    fn overlaps_are_found_and_touching_ranges_are_not() {
        let segs = [(0x1000, 0x1000), (0, 0), (0x4000, 0x100)];
        assert_eq!(overlapping(&segs, 0x1fff, 0x3000), Some(0));
        assert_eq!(overlapping(&segs, 0x0, 0x1001), Some(0));
        assert_eq!(overlapping(&segs, 0x0, 0x1000), None);
        assert_eq!(overlapping(&segs, 0x2000, 0x4000), None);
        assert_eq!(overlapping(&segs, 0x3000, 0x5000), Some(2));
        assert_eq!(overlapping(&segs, 0x0, u64::MAX), Some(0));
        // A released segment, (0, 0), overlaps nothing.
        assert_eq!(overlapping(&[(0, 0)], 0, 0x10), None);
    }
}
