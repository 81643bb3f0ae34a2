//! The planners' tests (`plan`), and the shape helper the zero-copy planner's tests share.

use super::*;

/// The shape of an unhooked call (the planners' tests).
pub(in crate::reduce) fn shape(c: Collective, count: u64, es: u64, world: usize) -> Shape {
    Shape {
        collective: c,
        count,
        elem_bytes: es,
        world,
        row_len: None,
    }
}

/// The defaults on 2 ranks with rounds of 32 MiB (the planner's rules below are stated for
/// them; the default round on 2 ranks is 64 MiB: `chunk_max_bytes`).
const L: ReduceLimits = ReduceLimits {
    chunk_bytes: 32 << 20,
    ..ReduceLimits::for_world(2)
};

fn lw(world: usize) -> ReduceLimits {
    ReduceLimits {
        chunk_bytes: 32 << 20,
        ..ReduceLimits::for_world(world)
    }
}

#[test]
fn rounds_are_64_mib_on_two_ranks_and_32_on_more() {
    assert_eq!(chunk_max_bytes(2), 64 << 20);
    for world in [1usize, 3, 4, 8] {
        assert_eq!(chunk_max_bytes(world), 32 << 20);
    }
    // A 1 GiB all-reduce on 2 ranks: pushed rounds of half the chunk, 32 MiB.
    let p = plan(
        &shape(Collective::AllReduce, 1 << 29, 2, 2),
        &ReduceLimits::for_world(2),
    )
    .unwrap();
    assert_eq!(p.rounds, 32);
}

#[test]
fn one_shot_up_to_its_limit_then_two_shot() {
    for world in [2usize, 3, 4, 8] {
        let max = one_shot_max_bytes(world);
        let l = lw(world);
        for c in [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
        ] {
            let at = plan(&shape(c, max / 4, 4, world), &l).unwrap();
            // Unhooked all-reduces on 3-4 ranks take the two-shot on lines from 256 KiB.
            if c == Collective::AllReduce && world > 2 && max > LINE_TWO_SHOT_FROM_BYTES {
                assert_eq!(at.algorithm, Algorithm::LineTwoShot, "{c:?} {world}");
                let from = LINE_TWO_SHOT_FROM_BYTES / 4;
                let below = plan(&shape(c, from, 4, world), &l).unwrap();
                assert_eq!(below.algorithm, Algorithm::OneShot, "{c:?} {world}");
                let above = plan(&shape(c, from + 1, 4, world), &l).unwrap();
                assert_eq!(above.algorithm, Algorithm::LineTwoShot, "{c:?} {world}");
            } else {
                assert_eq!(at.algorithm, Algorithm::OneShot, "{c:?} {world}");
                assert_eq!(at.shard, max / 4);
            }
            let above = plan(&shape(c, max / 4 + 1, 4, world), &l).unwrap();
            let next = match c {
                Collective::AllReduce if world > 2 => Algorithm::LineTwoShot,
                _ => Algorithm::TwoShot,
            };
            assert_eq!(above.algorithm, next, "{c:?} {world}");
        }
    }
    // Bytes decide, not elements.
    assert_eq!(
        plan(&shape(Collective::AllReduce, 1 << 20, 1, 2), &L)
            .unwrap()
            .algorithm,
        Algorithm::OneShot
    );
    assert_eq!(
        plan(&shape(Collective::AllReduce, (1 << 20) / 8 + 1, 8, 2), &L)
            .unwrap()
            .algorithm,
        Algorithm::TwoShot
    );
}

#[test]
fn two_shot_while_one_round_fits_then_pipelined() {
    // All-reduce on 2 ranks (pushed: result slots beside the staging slots): a round holds
    // 2 shards of 8 MiB.
    let fits = plan(&shape(Collective::AllReduce, (16 << 20) / 4, 4, 2), &L).unwrap();
    assert_eq!((fits.algorithm, fits.rounds), (Algorithm::TwoShot, 1));
    let more = plan(&shape(Collective::AllReduce, (16 << 20) / 4 + 8, 4, 2), &L).unwrap();
    assert_eq!((more.algorithm, more.rounds), (Algorithm::Pipelined, 2));
    // Reduce-scatter: the shard is the output.
    let rs = plan(&shape(Collective::ReduceScatter, (16 << 20) / 4, 4, 2), &L).unwrap();
    assert_eq!(
        (rs.algorithm, rs.shard, rs.rounds),
        (Algorithm::TwoShot, 4 << 20, 1)
    );
    let rs = plan(
        &shape(Collective::ReduceScatter, (16 << 20) / 4 + 1, 4, 2),
        &L,
    )
    .unwrap();
    assert_eq!(rs.algorithm, Algorithm::Pipelined);
    // 1 GiB all-reduce on 3 ranks: bounded rounds, at most 128 blocks (32 rounds).
    let big = plan(&shape(Collective::AllReduce, 1 << 28, 4, 3), &L).unwrap();
    assert_eq!(big.algorithm, Algorithm::Pipelined);
    assert!(big.chunk * 3 * 4 <= L.chunk_bytes);
    assert!(big.rounds * big.chunk >= big.shard);
    assert_eq!(big.blocks, WIDE_MAX_BLOCKS);
    // 3 rounds: the staged two-shot's 64.
    let three = plan(&shape(Collective::AllReduce, 2 * (8 << 20), 4, 3), &L).unwrap();
    assert_eq!((three.rounds, three.blocks), (3, STAGED_MAX_BLOCKS));
}

#[test]
fn all_reduces_push_their_results_on_two_ranks_and_from_eight_rounds() {
    let l4 = ReduceLimits {
        line_two_shot_bytes: 0,
        ..lw(4)
    };
    let pushed = |c: Collective, bytes: u64, world: usize, l: &ReduceLimits| {
        let p = plan(&shape(c, bytes / 2, 2, world), l).unwrap();
        (p.rounds, p.pushed)
    };
    // 4 ranks, rounds of 32 MiB: 128 MiB is 4 rounds (pulled), 256 MiB 8, which pushed take
    // 16 rounds of 16 MiB (a result slot beside each staging slot).
    assert_eq!(pushed(Collective::AllReduce, 4 << 20, 4, &l4), (1, false));
    assert_eq!(pushed(Collective::AllReduce, 128 << 20, 4, &l4), (4, false));
    assert_eq!(pushed(Collective::AllReduce, 256 << 20, 4, &l4), (16, true));
    assert_eq!(pushed(Collective::AllReduce, 1 << 30, 4, &l4), (64, true));
    // 2 ranks: every staged all-reduce, one round or many.
    assert_eq!(pushed(Collective::AllReduce, 4 << 20, 2, &L), (1, true));
    assert_eq!(pushed(Collective::AllReduce, 1 << 30, 2, &L), (64, true));
    // A hooked row that fits a pulled round's slot but not a pushed one's keeps the pulled
    // rounds (1 MiB halves on 2 ranks: a pulled slot holds 262,144 bf16, a pushed 131,072).
    let small = ReduceLimits {
        chunk_bytes: 1 << 20,
        ..L
    };
    let long_rows = Shape {
        row_len: Some(200_000),
        ..shape(Collective::AllReduce, 800_000, 2, 2)
    };
    let p = plan(&long_rows, &small).unwrap();
    assert_eq!(
        (p.algorithm, p.rounds, p.pushed),
        (Algorithm::Pipelined, 2, false)
    );
    // Reduce-scatter and all-gather gather nothing the reducers could push.
    for c in [Collective::ReduceScatter, Collective::AllGather] {
        assert!(!pushed(c, 1 << 30, 2, &L).1, "{c:?}");
        assert!(!pushed(c, 256 << 20, 4, &l4).1, "{c:?}");
    }
    // Line and one-shot calls never.
    assert!(!pushed(Collective::AllReduce, 4096, 2, &L).1);
}

#[test]
fn blocks_grow_with_the_round_and_stay_bounded() {
    let p = |n: u64| plan(&shape(Collective::AllReduce, n, 4, 2), &L).unwrap();
    // 4 ranks, 600 KB (two-shot): a 600,064-byte round, one block per 16 KiB: 37.
    let staged = ReduceLimits {
        line_two_shot_bytes: 0,
        ..lw(4)
    };
    let mid = plan(&shape(Collective::AllReduce, 150_000, 4, 4), &staged).unwrap();
    assert_eq!((mid.algorithm, mid.blocks), (Algorithm::TwoShot, 37));
    // 300 KB with the one-shot off: a 300,032-byte round, 19 blocks.
    let small = ReduceLimits {
        one_shot_bytes: 0,
        ..staged
    };
    let mid = plan(&shape(Collective::AllReduce, 75_000, 4, 4), &small).unwrap();
    assert_eq!((mid.algorithm, mid.blocks), (Algorithm::TwoShot, 19));
    // 2 ranks, pushed rounds of 16 MiB.
    assert_eq!(p(1 << 20).blocks, 64); // 4 MiB: capped
    assert_eq!(p(8 << 20).blocks, 64); // 32 MiB: 2 rounds, 64 blocks
    assert_eq!(p(16 << 20).blocks, 128); // 64 MiB: 4 rounds, the long calls' 128 blocks
    assert_eq!(p(64 << 20).blocks, 128); // 256 MiB
                                         // Calls on lines: at least 32 blocks, one per 4 KiB of a sender's payload, at most 64.
    let one = plan(&shape(Collective::AllReduce, 1, 4, 2), &L).unwrap();
    assert_eq!(
        (one.algorithm, one.blocks),
        (Algorithm::OneShot, LINE_MIN_BLOCKS)
    );
    let full = plan(&shape(Collective::AllReduce, 32 << 10, 4, 2), &L).unwrap();
    assert_eq!(full.blocks, 32);
    let wide = plan(&shape(Collective::AllReduce, 50 << 10, 4, 2), &L).unwrap();
    assert_eq!((wide.algorithm, wide.blocks), (Algorithm::OneShot, 50));
    let most = plan(&shape(Collective::AllReduce, 256 << 10, 4, 2), &L).unwrap();
    assert_eq!((most.algorithm, most.blocks), (Algorithm::OneShot, 64));
    // The two-shot on lines: every block it may have.
    let line = plan(&shape(Collective::AllReduce, 80 << 10, 4, 4), &lw(4)).unwrap();
    assert_eq!((line.algorithm, line.blocks), (Algorithm::LineTwoShot, 64));
    let narrow = ReduceLimits {
        staged_max_blocks: 8,
        wide_max_blocks: 8,
        ..L
    };
    let pl = plan(&shape(Collective::AllReduce, 64 << 20, 4, 2), &narrow).unwrap();
    assert_eq!(pl.blocks, 8);
}

#[test]
fn shards_are_aligned_and_cover_the_buffer() {
    for world in 1..=8usize {
        for n in [1u64, 7, 4097, 100_003, 3 << 20] {
            for es in [1u64, 2, 4, 8] {
                let pl = plan(&shape(Collective::AllReduce, n, es, world), &L).unwrap();
                if pl.algorithm == Algorithm::OneShot {
                    continue;
                }
                assert_eq!(pl.shard * es % 16, 0);
                assert!(pl.shard * world as u64 >= n);
                assert!(pl.shard * (world as u64) < n + world as u64 * pl.unit);
                assert_eq!(pl.chunk % pl.unit, 0);
                let slots = world as u64 * if pl.pushed { 2 } else { 1 };
                assert!(pl.chunk * slots * es <= L.chunk_bytes);
            }
        }
    }
}

#[test]
fn hooked_plans_hold_whole_rows() {
    // Above the one-shot: the two-shot, shards of whole rows.
    let mut s = shape(Collective::AllReduce, 4096 * 70, 4, 3);
    s.row_len = Some(4096);
    let pl = plan(&s, &L).unwrap();
    assert_eq!(pl.algorithm, Algorithm::TwoShot);
    assert_eq!((pl.unit, pl.shard), (4096, 24 * 4096));
    assert_eq!(pl.chunk % 4096, 0);
    s.row_len = Some(1000);
    assert!(plan(&s, &L).unwrap_err().contains("does not divide"));
    s.row_len = Some(4 << 20);
    s.count = 4 << 20;
    assert!(plan(&s, &L).unwrap_err().contains("does not fit"));
    // Reduce-scatter: the output is whole rows.
    let mut rs = shape(Collective::ReduceScatter, 4096, 4, 2);
    rs.row_len = Some(64);
    rs.count = 1 << 20;
    let pl = plan(&rs, &L).unwrap();
    assert_eq!(
        (pl.algorithm, pl.unit, pl.shard),
        (Algorithm::TwoShot, 64, 1 << 20)
    );
    rs.row_len = Some(100);
    assert!(plan(&rs, &L).unwrap_err().contains("does not divide"));
    let mut ag = shape(Collective::AllGather, 4096, 4, 2);
    ag.row_len = Some(64);
    assert!(plan(&ag, &L).is_err());
}

#[test]
fn hooked_one_shot_takes_rows_that_fit_its_lines() {
    let l = lw(4);
    let hooked = |coll, count, es, row| Shape {
        row_len: Some(row),
        ..shape(coll, count, es, 4)
    };
    // 18 rows of 7168 bf16 (252 KiB; 120 lines a row): one block a row.
    let p = plan(&hooked(Collective::AllReduce, 18 * 7168, 2, 7168), &l).unwrap();
    assert_eq!(
        (p.algorithm, p.unit, p.shard, p.blocks),
        (Algorithm::OneShot, 7168, 18 * 7168, 18)
    );
    // 36 rows (504 KiB): 36 x 120 lines fit a sender's area; a block a row (64 at most).
    let p = plan(&hooked(Collective::AllReduce, 36 * 7168, 2, 7168), &l).unwrap();
    assert_eq!((p.algorithm, p.blocks), (Algorithm::OneShot, 36));
    assert!(36 * lines_of(7168 * 2) * LINE_BYTES <= ll_sender_bytes(4, &l));
    // Reduce-scatter: the output's rows.
    let p = plan(&hooked(Collective::ReduceScatter, 3 * 1000, 4, 1000), &l).unwrap();
    assert_eq!(
        (p.algorithm, p.unit, p.blocks),
        (Algorithm::OneShot, 1000, 3)
    );
    // Rows of 8 bytes take a line each (15x the payload's lines): the two-shot.
    let tiny = hooked(Collective::AllReduce, 60_000, 2, 4);
    assert!(60_000 * 2 <= l.one_shot_bytes);
    assert_eq!(hooked_line_rows(&tiny, &l), None);
    assert_eq!(plan(&tiny, &l).unwrap().algorithm, Algorithm::TwoShot);
    // A row length that does not divide the buffer, and all-gather, are refused as before.
    let bad = hooked(Collective::AllReduce, 1001, 2, 10);
    assert_eq!(hooked_line_rows(&bad, &l), None);
    assert!(plan(&bad, &l).unwrap_err().contains("does not divide"));
    assert!(plan(&hooked(Collective::AllGather, 64, 2, 16), &l).is_err());
    // Past the payload limit: the two-shot.
    let p = plan(&hooked(Collective::AllReduce, 40 * 7168, 2, 7168), &l).unwrap();
    assert_eq!(p.algorithm, Algorithm::TwoShot);
}

#[test]
fn bad_shapes_are_refused() {
    assert!(plan(&shape(Collective::AllReduce, 0, 4, 2), &L).is_err());
    assert!(plan(&shape(Collective::AllReduce, 10, 3, 2), &L).is_err());
    assert!(plan(&shape(Collective::AllReduce, 10, 4, 0), &L).is_err());
    assert!(plan(&shape(Collective::AllReduce, 10, 4, 33), &L).is_err());
    assert!(plan(&shape(Collective::AllReduce, u64::MAX, 8, 2), &L).is_err());
}

#[test]
fn block_pieces_partition_in_units() {
    for m in [0u64, 1, 15, 16, 17, 1000, 65_536] {
        for blocks in 1..=33u32 {
            for unit in [1u64, 4, 16, 96] {
                let mut next = 0;
                for b in 0..blocks {
                    let (lo, hi) = block_piece(m, blocks, unit, b);
                    assert_eq!(lo, next.min(m));
                    assert!(lo <= hi && hi <= m);
                    assert!(lo % unit == 0 || lo == m);
                    next = hi;
                }
                assert_eq!(next, m);
            }
        }
    }
}

#[test]
fn line_two_shot_between_the_one_shot_and_its_limit() {
    let l = lw(4);
    let ar = |n: u64| plan(&shape(Collective::AllReduce, n, 2, 4), &l).unwrap();
    let at = ar(l.line_two_shot_bytes / 2);
    // 4 MiB of bf16 on 4 ranks: shards of 524,288 elements (1 MiB, 64 blocks).
    assert_eq!(
        (at.algorithm, at.shard, at.blocks),
        (Algorithm::LineTwoShot, 524_288, 64)
    );
    assert_eq!(
        ar(l.line_two_shot_bytes / 2 + 1).algorithm,
        Algorithm::TwoShot
    );
    // Odd counts: shards of whole 16 bytes, the last one short.
    let odd = ar((l.one_shot_bytes / 2) + 1001);
    assert_eq!(odd.algorithm, Algorithm::LineTwoShot);
    assert_eq!(odd.shard % 8, 0);
    assert!(odd.shard * 4 >= (l.one_shot_bytes / 2) + 1001);
    // Reduce-scatter, all-gather and hooked calls never take it.
    let rs = plan(&shape(Collective::ReduceScatter, 200_000, 4, 4), &l).unwrap();
    assert_eq!(rs.algorithm, Algorithm::TwoShot);
    let hooked = Shape {
        row_len: Some(1000),
        ..shape(Collective::AllReduce, 200_000, 4, 4)
    };
    assert_eq!(plan(&hooked, &l).unwrap().algorithm, Algorithm::TwoShot);
    // The window holds both of its areas for the largest shard.
    assert!(2 * lines_of(l.line_two_shot_bytes / 4 + 16) * LINE_BYTES <= ll_sender_bytes(4, &l));
    // 2 ranks: never.
    let two = plan(&shape(Collective::AllReduce, 300_000, 4, 2), &lw(2)).unwrap();
    assert_eq!(two.algorithm, Algorithm::TwoShot);
}

#[test]
fn window_holds_both_areas() {
    // 1 MiB in lines of 120 bytes: 8739 lines of 128 bytes.
    assert_eq!(ll_sender_bytes(2, &L), 8739 * 128);
    assert_eq!(window_bytes(2, &L), 2 * 2 * 8739 * 128 + (64 << 20));
    // 8 ranks: the two-shot on lines' two shards of 4 MiB / 8 (+ 16 bytes) take more than
    // the one-shot's 32 KiB: 2 x 4370 lines.
    assert_eq!(window_bytes(8, &lw(8)), 8 * 2 * 8740 * 128 + (64 << 20));
    let no_lines = ReduceLimits {
        line_two_shot_bytes: 0,
        ..lw(8)
    };
    // 32 KiB: 4096 words, 274 lines.
    assert_eq!(window_bytes(8, &no_lines), 8 * 2 * 274 * 128 + (64 << 20));
    // One-shot off: no lines.
    let off = ReduceLimits {
        one_shot_bytes: 0,
        ..L
    };
    assert_eq!(window_bytes(4, &off), 64 << 20);
    let p = plan(&shape(Collective::AllReduce, 1, 4, 4), &off).unwrap();
    assert_eq!(p.algorithm, Algorithm::TwoShot);
}
