//! The zero-copy and window plans of the reductions (docs/COLLECTIVES.md, "Algorithms and
//! when each is chosen"): pure functions of the call's shape, where its buffers lie and the
//! window sizes, as the staged planner ([`super::plan`]) is; every rank computes the same plan.

use super::plan::{
    hooked_line_rows, Algorithm, Collective, Plan, ReduceLimits, Shape, MAX_BLOCKS, MAX_WORLD,
};

/// Where a call's buffers lie, as the zero-copy planner needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The input lies in the memory pool (at a place every rank's kernel reaches).
    pub input_pooled: bool,
    /// The output lies in the memory pool.
    pub output_pooled: bool,
    /// Input and output are the same buffer (in-place all-reduce).
    pub in_place: bool,
}

/// The zero-copy plan of a call whose buffers lie as `at` says, or `None` when the staged
/// paths serve it (a buffer outside the pool, an in-place one-shot, a hooked part larger than
/// the window's two-shot area that the hook runs in). The element order is the staged paths'
/// (rank order, the same accumulation), so switching between them changes no bit.
pub fn zero_copy_plan(s: &Shape, at: &Placement, limits: &ReduceLimits) -> Option<Plan> {
    let es = s.elem_bytes;
    if !matches!(es, 1 | 2 | 4 | 8) || s.count == 0 || s.world == 0 || s.world > MAX_WORLD {
        return None;
    }
    let w = s.world as u64;
    let vec = 16 / es;
    let bytes = s.count.checked_mul(es)?;
    // Small calls take the one-shot on lines, hooked ones too where their rows fit it.
    if bytes <= limits.zero_copy_min_bytes.min(limits.one_shot_bytes)
        && (s.row_len.is_none() || hooked_line_rows(s, limits).is_some())
    {
        return None;
    }
    let unit = match s.row_len {
        Some(0) => return None,
        Some(row) if s.count % row != 0 => return None,
        Some(row) => row,
        None => vec,
    };
    // (algorithm, elements of this rank's part)
    let (algorithm, part, shard) = match s.collective {
        Collective::AllReduce if at.input_pooled => {
            let one_shot = bytes <= limits.zero_copy_one_shot_bytes && !at.in_place;
            if one_shot {
                (Algorithm::ZeroCopyOneShot, s.count, s.count)
            } else if at.output_pooled {
                let shard = s.count.div_ceil(unit).div_ceil(w) * unit;
                (Algorithm::ZeroCopyTwoShot, shard, shard)
            } else {
                return None;
            }
        }
        Collective::ReduceScatter if at.input_pooled => {
            (Algorithm::ZeroCopyTwoShot, s.count, s.count)
        }
        Collective::AllGather if at.output_pooled && s.row_len.is_none() => {
            (Algorithm::ZeroCopyTwoShot, s.count, s.count)
        }
        _ => return None,
    };
    // A hooked call's rows go through half the window's two-shot area.
    if s.row_len.is_some() && part.checked_mul(es)? > limits.chunk_bytes {
        return None;
    }
    Some(Plan {
        algorithm,
        blocks: (part * es)
            .div_ceil(limits.block_bytes.max(1))
            .clamp(1, limits.max_blocks.clamp(1, MAX_BLOCKS) as u64) as u32,
        shard,
        chunk: 0,
        rounds: 1,
        unit,
        pushed: false,
    })
}

/// The layout word of a zero-copy call (48 bits), which every rank announces and compares
/// before touching a peer's buffer: the algorithm, the collective and the pool places
/// `(segment, offset)` of the buffers peers reach. Ranks that allocated their pool buffers in
/// different orders announce different words and the call fails on every rank (a collision
/// of two different layouts is a 2^-48 chance: FNV-1a over the fields, folded to 48 bits).
pub fn layout_word(
    algorithm: Algorithm,
    collective: Collective,
    input: Option<(u64, u64)>,
    output: Option<(u64, u64)>,
) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |v: u64| {
        for byte in v.to_le_bytes() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(u64::from(algorithm.zero_copy_code()));
    eat(u64::from(collective.code()));
    for place in [input, output] {
        match place {
            Some((segment, offset)) => {
                eat(1);
                eat(segment);
                eat(offset);
            }
            None => eat(0),
        }
    }
    (h ^ (h >> 48)) & ((1 << 48) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::plan::tests::shape;

    fn lw(world: usize) -> ReduceLimits {
        ReduceLimits::for_world(world)
    }

    fn pooled(input: bool, output: bool, in_place: bool) -> Placement {
        Placement {
            input_pooled: input,
            output_pooled: output,
            in_place,
        }
    }

    #[test]
    fn zero_copy_takes_pool_buffers_only() {
        let l = ReduceLimits {
            zero_copy_min_bytes: 0,
            ..lw(4)
        };
        let small = shape(Collective::AllReduce, 1024, 2, 4);
        let zc = |s: &Shape, p| zero_copy_plan(s, &p, &l).map(|p| p.algorithm);
        // Up to zero_copy_min_bytes the line one-shot serves pool buffers too (2 ranks: the
        // zero-copy one-shot above it; on 4 it ends where the line one-shot's range does).
        let d = lw(2);
        let at_min = shape(Collective::AllReduce, d.zero_copy_min_bytes / 2, 2, 2);
        assert_eq!(
            zero_copy_plan(&at_min, &pooled(true, true, false), &d),
            None
        );
        let above = shape(Collective::AllReduce, d.zero_copy_min_bytes / 2 + 8, 2, 2);
        assert_eq!(
            zero_copy_plan(&above, &pooled(true, true, false), &d).map(|p| p.algorithm),
            Some(Algorithm::ZeroCopyOneShot)
        );
        assert_eq!(zc(&small, pooled(false, false, false)), None);
        assert_eq!(zc(&small, pooled(false, true, false)), None);
        assert_eq!(
            zc(&small, pooled(true, false, false)),
            Some(Algorithm::ZeroCopyOneShot)
        );
        assert_eq!(
            zc(&small, pooled(true, true, false)),
            Some(Algorithm::ZeroCopyOneShot)
        );
        // In place, every rank would overwrite what its peers still read: the two-shot, whose
        // shards are read and written by one rank each.
        assert_eq!(
            zc(&small, pooled(true, true, true)),
            Some(Algorithm::ZeroCopyTwoShot)
        );
        let big = shape(
            Collective::AllReduce,
            (l.zero_copy_one_shot_bytes / 2) + 1,
            2,
            4,
        );
        assert_eq!(
            zc(&big, pooled(true, true, false)),
            Some(Algorithm::ZeroCopyTwoShot)
        );
        assert_eq!(zc(&big, pooled(true, false, false)), None);
        let rs = shape(Collective::ReduceScatter, 1 << 20, 4, 4);
        assert_eq!(
            zc(&rs, pooled(true, false, false)),
            Some(Algorithm::ZeroCopyTwoShot)
        );
        assert_eq!(zc(&rs, pooled(false, true, false)), None);
        let ag = shape(Collective::AllGather, 1 << 20, 4, 4);
        assert_eq!(
            zc(&ag, pooled(false, true, false)),
            Some(Algorithm::ZeroCopyTwoShot)
        );
        assert_eq!(zc(&ag, pooled(true, false, false)), None);
    }

    #[test]
    fn zero_copy_parts_and_blocks() {
        let l = ReduceLimits {
            zero_copy_min_bytes: 0,
            ..lw(4)
        };
        // Two-shot all-reduce of 1000 f32: shards of whole 16-byte units, 4 x 252 >= 1000.
        let p = zero_copy_plan(
            &shape(Collective::AllReduce, 1000, 4, 4),
            &pooled(true, true, true),
            &l,
        )
        .unwrap();
        assert_eq!((p.shard, p.unit, p.rounds, p.blocks), (252, 4, 1, 1));
        // One block per block_bytes of this rank's part, up to max_blocks.
        let p = zero_copy_plan(
            &shape(Collective::ReduceScatter, 4 * l.block_bytes / 4, 4, 4),
            &pooled(true, false, false),
            &l,
        )
        .unwrap();
        assert_eq!(p.blocks, 4);
        let p = zero_copy_plan(
            &shape(Collective::AllGather, 1 << 30, 4, 4),
            &pooled(false, true, false),
            &l,
        )
        .unwrap();
        assert_eq!(p.blocks, l.max_blocks);
    }

    #[test]
    fn zero_copy_hooked_rows_fit_the_window() {
        let l = lw(2);
        let rows = |count: u64, row: u64| Shape {
            row_len: Some(row),
            ..shape(Collective::AllReduce, count, 2, 2)
        };
        // Up to the zero-copy minimum the one-shot on lines takes the rows that fit its
        // lines (every row a line of its own): 8 rows of 512 elements do, 65,536 rows of one
        // element (8 MiB of lines) do not.
        assert!(zero_copy_plan(&rows(4096, 512), &pooled(true, true, false), &l).is_none());
        let p = zero_copy_plan(&rows(65_536, 1), &pooled(true, true, false), &l).unwrap();
        assert_eq!((p.algorithm, p.unit), (Algorithm::ZeroCopyOneShot, 1));
        // 512 KiB: above the minimum.
        let big = 256 << 10;
        let p = zero_copy_plan(&rows(big, 512), &pooled(true, true, false), &l).unwrap();
        assert_eq!((p.algorithm, p.unit), (Algorithm::ZeroCopyOneShot, 512));
        let p = zero_copy_plan(&rows(big, 512), &pooled(true, true, true), &l).unwrap();
        assert_eq!(
            (p.algorithm, p.shard),
            (Algorithm::ZeroCopyTwoShot, big / 2)
        );
        // A row length that does not divide the buffer, and a part beyond the window's area.
        assert!(zero_copy_plan(&rows(4096, 500), &pooled(true, true, true), &l).is_none());
        let huge = l.chunk_bytes * 2; // elements of 2 bytes: 4 x the area in the whole buffer
        assert!(zero_copy_plan(&rows(huge * 2, 512), &pooled(true, true, true), &l).is_none());
        // All-gather takes no hook.
        let ag = Shape {
            row_len: Some(16),
            ..shape(Collective::AllGather, 1024, 2, 2)
        };
        assert!(zero_copy_plan(&ag, &pooled(false, true, false), &l).is_none());
    }

    #[test]
    fn layout_words_tell_places_apart() {
        let a = Algorithm::ZeroCopyTwoShot;
        let w = |i, o| layout_word(a, Collective::AllReduce, i, o);
        let base = w(Some((0, 256)), Some((0, 256)));
        assert!(base < 1 << 48);
        assert_eq!(base, w(Some((0, 256)), Some((0, 256))));
        for other in [
            w(Some((0, 512)), Some((0, 256))),
            w(Some((1, 256)), Some((0, 256))),
            w(Some((0, 256)), Some((0, 512))),
            w(Some((0, 256)), None),
            layout_word(
                Algorithm::ZeroCopyOneShot,
                Collective::AllReduce,
                Some((0, 256)),
                Some((0, 256)),
            ),
            layout_word(a, Collective::ReduceScatter, Some((0, 256)), Some((0, 256))),
        ] {
            assert_ne!(base, other);
        }
    }
}
