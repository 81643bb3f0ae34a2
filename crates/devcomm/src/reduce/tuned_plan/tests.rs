//! The tuned plans' tests: a choice is taken exactly where its kernel can serve the call,
//! the default plan's own choice gives the default plan back, and whatever the blocks, the
//! block pieces of a tuned plan cover every element once (each element is then reduced in
//! rank order by the one block that owns it, as in every plan: the results do not change).

use super::*;
use crate::reduce::plan::tests::shape;
use crate::reduce::plan::{block_piece, lines_of, ReduceLimits, WIDE_MAX_BLOCKS};

const COLLECTIVES: [Collective; 3] = [
    Collective::AllReduce,
    Collective::ReduceScatter,
    Collective::AllGather,
];

fn lw(world: usize) -> ReduceLimits {
    ReduceLimits::for_world(world)
}

fn choice(algorithm: TunedAlgorithm, blocks: u32) -> Choice {
    Choice {
        algorithm,
        blocks,
        pushed: false,
    }
}

fn pooled(input: bool, output: bool, in_place: bool) -> Placement {
    Placement {
        input_pooled: input,
        output_pooled: output,
        in_place,
    }
}

/// Sizes in bytes from 8 B to 1 GiB, powers of two and odd ones between.
fn sizes() -> Vec<u64> {
    let mut v = Vec::new();
    let mut b = 8u64;
    while b <= 1 << 30 {
        v.push(b);
        v.push(b + b / 2 + 8);
        b *= 4;
    }
    v
}

#[test]
fn the_default_choice_gives_the_default_plan() {
    for world in [2usize, 3, 4, 8] {
        let l = lw(world);
        for c in COLLECTIVES {
            for es in [1u64, 2, 4, 8] {
                for bytes in sizes() {
                    let s = shape(c, (bytes / es).max(1), es, world);
                    let d = plan(&s, &l).unwrap();
                    let ch = Choice::of(&d).unwrap();
                    assert_eq!(plan_tuned(&s, None, &l, &ch), Some(d), "{s:?}");
                    for at in [
                        pooled(true, true, false),
                        pooled(true, false, false),
                        pooled(false, true, false),
                        pooled(true, true, true),
                    ] {
                        let Some(z) = zero_copy_plan(&s, &at, &l) else {
                            continue;
                        };
                        let ch = Choice::of(&z).unwrap();
                        assert_eq!(plan_tuned(&s, Some(&at), &l, &ch), Some(z), "{s:?} {at:?}");
                    }
                }
            }
        }
    }
    // Hooked calls too: the one-shot on rows, the staged two-shot, the zero-copy paths.
    let l = lw(4);
    for (count, row) in [(18 * 7168u64, 7168u64), (64 * 7168, 7168), (4096, 512)] {
        for c in [Collective::AllReduce, Collective::ReduceScatter] {
            let s = Shape {
                row_len: Some(row),
                ..shape(c, count, 2, 4)
            };
            let d = plan(&s, &l).unwrap();
            assert_eq!(plan_tuned(&s, None, &l, &Choice::of(&d).unwrap()), Some(d));
        }
    }
}

#[test]
fn blocks_and_pushed_stay_within_what_the_kernels_take() {
    let l = lw(4);
    assert_eq!(most_blocks(&l, TunedAlgorithm::Staged), WIDE_MAX_BLOCKS);
    // Calls on lines: the 64 slots their kernels release.
    assert_eq!(most_blocks(&l, TunedAlgorithm::OneShot), LINE_MAX_BLOCKS);
    assert_eq!(
        most_blocks(&l, TunedAlgorithm::LineTwoShot),
        LINE_MAX_BLOCKS
    );
    // The SM cap and an explicit DEVCOMM_REDUCE_MAX_BLOCKS bound every limit already.
    let small_gpu = ReduceLimits {
        max_blocks: 16,
        staged_max_blocks: 16,
        wide_max_blocks: 16,
        ..l
    };
    assert_eq!(most_blocks(&small_gpu, TunedAlgorithm::Staged), 16);
    assert_eq!(most_blocks(&small_gpu, TunedAlgorithm::OneShot), 16);
    let s = shape(Collective::AllReduce, 1 << 20, 2, 4);
    let staged = |blocks| plan_tuned(&s, None, &l, &choice(TunedAlgorithm::Staged, blocks));
    assert_eq!(staged(0), None);
    assert_eq!(staged(1).map(|p| p.blocks), Some(1));
    assert_eq!(staged(64).map(|p| p.blocks), Some(64));
    assert_eq!(staged(128).map(|p| p.blocks), Some(128));
    assert_eq!(staged(129), None);
    // No line call beyond its 64 slots.
    let line = shape(Collective::AllReduce, 256 << 10, 2, 4);
    let one = |b| plan_tuned(&line, None, &l, &choice(TunedAlgorithm::OneShot, b));
    assert_eq!(one(64).map(|p| p.blocks), Some(64));
    assert_eq!(one(65), None);
    let capped = choice(TunedAlgorithm::Staged, 32);
    assert_eq!(plan_tuned(&s, None, &small_gpu, &capped), None);
    // 64 blocks for the line one-shot too (its default stops at 32).
    let small = shape(Collective::AllReduce, 128 << 10, 2, 4);
    let one = plan_tuned(&small, None, &l, &choice(TunedAlgorithm::OneShot, 64)).unwrap();
    assert_eq!((one.algorithm, one.blocks), (Algorithm::OneShot, 64));
    // Pushed results: the staged all-reduce only, any number of rounds.
    let pushed = Choice {
        pushed: true,
        ..choice(TunedAlgorithm::Staged, 8)
    };
    let p = plan_tuned(&s, None, &l, &pushed).unwrap();
    assert_eq!(
        (p.algorithm, p.rounds, p.pushed),
        (Algorithm::TwoShot, 1, true)
    );
    // A pushed round holds half a pulled one's elements (its result slots): 64 MiB on 4
    // ranks is 2 rounds by default (pulled) and 4 pushed, of half the chunk.
    let big = shape(Collective::AllReduce, 32 << 20, 2, 4);
    let pulled = plan_tuned(&big, None, &l, &choice(TunedAlgorithm::Staged, 8)).unwrap();
    let pushed_big = plan_tuned(&big, None, &l, &pushed).unwrap();
    assert_eq!((pulled.rounds, pulled.pushed), (2, false));
    assert_eq!((pushed_big.rounds, pushed_big.pushed), (4, true));
    assert_eq!(pushed_big.chunk * 2, pulled.chunk);
    let rs = shape(Collective::ReduceScatter, 1 << 20, 2, 4);
    assert_eq!(plan_tuned(&rs, None, &l, &pushed), None);
    let pushed_one_shot = Choice {
        pushed: true,
        ..choice(TunedAlgorithm::OneShot, 8)
    };
    assert_eq!(plan_tuned(&small, None, &l, &pushed_one_shot), None);
    // A staged default on 2 ranks pushes; its choice says so and gives it back.
    let d = plan(&shape(Collective::AllReduce, 8 << 20, 2, 2), &lw(2)).unwrap();
    assert!(d.pushed && Choice::of(&d).unwrap().pushed);
}

#[test]
fn the_one_shot_takes_payloads_within_the_window_lines() {
    for world in [2usize, 4, 8] {
        let l = lw(world);
        for c in COLLECTIVES {
            // The payload (bytes each rank sends each peer) is the count's bytes.
            let at_limit = shape(c, l.one_shot_bytes / 4, 4, world);
            let above = shape(c, l.one_shot_bytes / 4 + 1, 4, world);
            let one = choice(TunedAlgorithm::OneShot, 16);
            let p = plan_tuned(&at_limit, None, &l, &one).unwrap();
            assert_eq!(
                (p.algorithm, p.blocks, p.shard),
                (Algorithm::OneShot, 16, l.one_shot_bytes / 4)
            );
            assert_eq!(plan_tuned(&above, None, &l, &one), None, "{c:?} {world}");
            // A larger window (a table's) takes it further.
            let wide = ReduceLimits {
                one_shot_bytes: 2 * l.one_shot_bytes,
                ..l
            };
            let p = plan_tuned(&above, None, &wide, &one).unwrap();
            assert_eq!(p.algorithm, Algorithm::OneShot);
        }
    }
    // Pool buffers: the line one-shot serves them like any buffer.
    let l = lw(4);
    let s = shape(Collective::AllReduce, 128 << 10, 2, 4);
    let p = plan_tuned(
        &s,
        Some(&pooled(true, true, false)),
        &l,
        &choice(TunedAlgorithm::OneShot, 8),
    );
    assert_eq!(p.map(|p| p.algorithm), Some(Algorithm::OneShot));
}

#[test]
fn the_line_two_shot_serves_unhooked_all_reduces_within_its_size() {
    let l = lw(4);
    let lines = choice(TunedAlgorithm::LineTwoShot, 32);
    // Small sizes too (the default takes it only above the one-shot).
    for bytes in [8u64, 4096, 256 << 10, l.line_two_shot_bytes] {
        let s = shape(Collective::AllReduce, bytes / 2, 2, 4);
        let p = plan_tuned(&s, None, &l, &lines).unwrap();
        assert_eq!(
            (p.algorithm, p.blocks, p.rounds),
            (Algorithm::LineTwoShot, 32, 1),
            "{bytes}"
        );
    }
    let above = shape(Collective::AllReduce, l.line_two_shot_bytes / 2 + 8, 2, 4);
    assert_eq!(plan_tuned(&above, None, &l, &lines), None);
    for c in [Collective::ReduceScatter, Collective::AllGather] {
        assert_eq!(plan_tuned(&shape(c, 1024, 2, 4), None, &l, &lines), None);
    }
    // 2 ranks hold no line two-shot by default: only a window that has it.
    let s = shape(Collective::AllReduce, 1024, 2, 2);
    assert_eq!(plan_tuned(&s, None, &lw(2), &lines), None);
    let wide = ReduceLimits {
        line_two_shot_bytes: 4 << 20,
        ..lw(2)
    };
    assert!(plan_tuned(&s, None, &wide, &lines).is_some());
    // Hooked: no kernel.
    let hooked = Shape {
        row_len: Some(64),
        ..shape(Collective::AllReduce, 64 * 64, 2, 4)
    };
    assert_eq!(plan_tuned(&hooked, None, &l, &lines), None);
}

#[test]
fn the_staged_two_shot_serves_every_size_in_the_default_rounds() {
    let l = lw(4);
    for c in COLLECTIVES {
        for bytes in sizes() {
            let s = shape(c, bytes / 2, 2, 4);
            let d = plan(
                &s,
                &ReduceLimits {
                    one_shot_bytes: 0,
                    line_two_shot_bytes: 0,
                    ..l
                },
            )
            .unwrap();
            // The choice in the default plan's form (pushed rounds hold half the elements).
            let staged = Choice {
                pushed: d.pushed,
                ..choice(TunedAlgorithm::Staged, 8)
            };
            let p = plan_tuned(&s, None, &l, &staged).unwrap();
            assert_eq!(
                (
                    p.algorithm,
                    p.shard,
                    p.chunk,
                    p.rounds,
                    p.unit,
                    p.blocks,
                    p.pushed
                ),
                (d.algorithm, d.shard, d.chunk, d.rounds, d.unit, 8, d.pushed),
                "{c:?} {bytes}"
            );
        }
    }
}

#[test]
fn the_zero_copy_paths_need_their_buffers_in_the_pool() {
    let l = lw(4);
    let zc1 = choice(TunedAlgorithm::ZeroCopyOneShot, 16);
    let zc2 = choice(TunedAlgorithm::ZeroCopyTwoShot, 16);
    let ar = shape(Collective::AllReduce, 4 << 20, 2, 4);
    let alg = |s: &Shape, at: Option<Placement>, c: &Choice| {
        plan_tuned(s, at.as_ref(), &l, c).map(|p| (p.algorithm, p.blocks))
    };
    // Not in the pool (or the zero-copy paths off): never.
    assert_eq!(alg(&ar, None, &zc1), None);
    assert_eq!(alg(&ar, None, &zc2), None);
    // The one-shot at any size (the default stops at 256 KiB on 4 ranks), out of place.
    assert_eq!(
        alg(&ar, Some(pooled(true, false, false)), &zc1),
        Some((Algorithm::ZeroCopyOneShot, 16))
    );
    assert_eq!(
        alg(
            &shape(Collective::AllReduce, 4, 2, 4),
            Some(pooled(true, true, false)),
            &zc1
        ),
        Some((Algorithm::ZeroCopyOneShot, 16))
    );
    assert_eq!(alg(&ar, Some(pooled(true, true, true)), &zc1), None);
    assert_eq!(alg(&ar, Some(pooled(false, true, false)), &zc1), None);
    // The two-shot: all-reduce with both buffers (in place too), reduce-scatter with the
    // input, all-gather with the output.
    assert_eq!(
        alg(&ar, Some(pooled(true, true, true)), &zc2),
        Some((Algorithm::ZeroCopyTwoShot, 16))
    );
    assert_eq!(alg(&ar, Some(pooled(true, false, false)), &zc2), None);
    let rs = shape(Collective::ReduceScatter, 1 << 20, 2, 4);
    assert!(alg(&rs, Some(pooled(true, false, false)), &zc2).is_some());
    assert_eq!(alg(&rs, Some(pooled(false, true, false)), &zc2), None);
    assert_eq!(alg(&rs, Some(pooled(true, true, false)), &zc1), None);
    let ag = shape(Collective::AllGather, 1 << 20, 2, 4);
    assert!(alg(&ag, Some(pooled(false, true, false)), &zc2).is_some());
    assert_eq!(alg(&ag, Some(pooled(true, false, false)), &zc2), None);
    // Small sizes too (the default gives them the line one-shot).
    let small = shape(Collective::ReduceScatter, 8, 2, 4);
    assert!(alg(&small, Some(pooled(true, true, false)), &zc2).is_some());
}

#[test]
fn hooked_calls_take_a_choice_only_for_whole_rows() {
    let l = lw(4);
    let hooked = |c, count, row| Shape {
        row_len: Some(row),
        ..shape(c, count, 2, 4)
    };
    // 18 rows of 7168 bf16 fit the one-shot's lines: no more blocks than rows.
    let s = hooked(Collective::AllReduce, 18 * 7168, 7168);
    let p = plan_tuned(&s, None, &l, &choice(TunedAlgorithm::OneShot, 64)).unwrap();
    assert_eq!(
        (p.algorithm, p.blocks, p.unit),
        (Algorithm::OneShot, 18, 7168)
    );
    // Rows of one element take a line each: 65,536 lines do not fit a sender's area.
    let tiny_rows = hooked(Collective::AllReduce, 65_536, 1);
    assert_eq!(
        plan_tuned(&tiny_rows, None, &l, &choice(TunedAlgorithm::OneShot, 8)),
        None
    );
    // The staged two-shot by whole rows; a row length that does not divide: none.
    let p = plan_tuned(&tiny_rows, None, &l, &choice(TunedAlgorithm::Staged, 8)).unwrap();
    assert_eq!((p.algorithm, p.unit), (Algorithm::TwoShot, 1));
    let s = hooked(Collective::AllReduce, 4096 * 70, 4096);
    let p = plan_tuned(&s, None, &l, &choice(TunedAlgorithm::Staged, 3)).unwrap();
    assert_eq!((p.unit, p.shard % 4096, p.blocks), (4096, 0, 3));
    let bad = hooked(Collective::AllReduce, 4096 * 70, 1000);
    for a in TunedAlgorithm::ALL {
        let at = pooled(true, true, false);
        assert_eq!(
            plan_tuned(&bad, Some(&at), &l, &choice(a, 8)),
            None,
            "{a:?}"
        );
    }
    // The zero-copy paths: rows within the window's two-shot area.
    let s = hooked(Collective::AllReduce, 64 * 7168, 7168);
    let at = pooled(true, true, false);
    let p = plan_tuned(
        &s,
        Some(&at),
        &l,
        &choice(TunedAlgorithm::ZeroCopyOneShot, 8),
    )
    .unwrap();
    assert_eq!((p.algorithm, p.unit), (Algorithm::ZeroCopyOneShot, 7168));
    let huge = hooked(Collective::AllReduce, 4 * l.chunk_bytes, 512);
    assert_eq!(
        plan_tuned(
            &huge,
            Some(&at),
            &l,
            &choice(TunedAlgorithm::ZeroCopyOneShot, 8)
        ),
        None
    );
    // The all-gather takes no hook.
    let ag = hooked(Collective::AllGather, 1024, 16);
    for a in TunedAlgorithm::ALL {
        let at = pooled(true, true, false);
        assert_eq!(plan_tuned(&ag, Some(&at), &l, &choice(a, 8)), None, "{a:?}");
    }
}

#[test]
fn calls_that_no_plan_serves_take_no_choice() {
    let l = lw(4);
    for a in TunedAlgorithm::ALL {
        let at = pooled(true, true, false);
        for s in [
            shape(Collective::AllReduce, 0, 2, 4),
            shape(Collective::AllReduce, 16, 3, 4),
            shape(Collective::AllReduce, 16, 2, 0),
            shape(Collective::AllReduce, 16, 2, 33),
        ] {
            assert_eq!(
                plan_tuned(&s, Some(&at), &l, &choice(a, 8)),
                None,
                "{a:?} {s:?}"
            );
        }
    }
}

/// The elements of the whole buffer (all-reduce buffer, reduce-scatter input, all-gather
/// output) each block of `p` owns, as the kernels cut them (`reduce.cu`): every element must
/// be owned exactly once.
fn owners(s: &Shape, p: &Plan) -> Vec<u32> {
    let w = s.world as u64;
    let total = match s.collective {
        Collective::AllReduce => s.count,
        _ => s.count * w,
    };
    let mut owned = vec![0u32; total as usize];
    let shard_len = |q: u64| {
        let first = q * p.shard;
        total.saturating_sub(first).min(p.shard)
    };
    match p.algorithm {
        Algorithm::OneShot => {
            // Block b owns lines [l0, l1) of every sender's payload (`shard` elements; line
            // i holds its bytes 120 i .. 120 i + 119, and no element straddles two lines);
            // hooked, whole rows.
            let es = s.elem_bytes;
            let regions = if s.collective == Collective::AllReduce {
                1
            } else {
                w
            };
            for q in 0..regions {
                for b in 0..p.blocks {
                    let (lo, hi) = match s.row_len {
                        None => {
                            let (l0, l1) = block_piece(lines_of(p.shard * es), p.blocks, 1, b);
                            ((l0 * 120 / es).min(p.shard), (l1 * 120 / es).min(p.shard))
                        }
                        Some(row) => {
                            let (r0, r1) = block_piece(p.shard / row, p.blocks, 1, b);
                            (r0 * row, r1 * row)
                        }
                    };
                    for i in lo..hi {
                        owned[(q * p.shard + i) as usize] += 1;
                    }
                }
            }
        }
        Algorithm::LineTwoShot => {
            let es = s.elem_bytes;
            let span = lines_of(p.shard * es);
            for q in 0..w {
                for b in 0..p.blocks {
                    let (l0, l1) = block_piece(span, p.blocks, 1, b);
                    let len = shard_len(q);
                    let (lo, hi) = ((l0 * 120 / es).min(len), (l1 * 120 / es).min(len));
                    for i in lo..hi {
                        owned[(q * p.shard + i) as usize] += 1;
                    }
                }
            }
        }
        Algorithm::TwoShot | Algorithm::Pipelined => {
            for k in 0..p.rounds {
                let m = (p.shard - k * p.chunk).min(p.chunk);
                for b in 0..p.blocks {
                    let (lo, hi) =
                        block_piece(if p.pushed { p.chunk } else { m }, p.blocks, p.unit, b);
                    for q in 0..w {
                        let (len, at) = (shard_len(q), k * p.chunk);
                        let (from, to) = ((at + lo).min(len), (at + hi).min(len));
                        for i in from..to {
                            owned[(q * p.shard + i) as usize] += 1;
                        }
                    }
                }
            }
        }
        Algorithm::ZeroCopyOneShot | Algorithm::ZeroCopyTwoShot => {
            // Each rank's part: the whole buffer (one-shot), else shard q of it.
            let one_shot = p.algorithm == Algorithm::ZeroCopyOneShot;
            for q in 0..if one_shot { 1 } else { w } {
                let (at, len) = match (one_shot, s.collective) {
                    (true, _) => (0, total),
                    (false, Collective::AllReduce) => (q * p.shard, shard_len(q)),
                    (false, _) => (q * s.count, s.count),
                };
                for b in 0..p.blocks {
                    let (lo, hi) = block_piece(len, p.blocks, p.unit, b);
                    for i in lo..hi {
                        owned[(at + i) as usize] += 1;
                    }
                }
            }
        }
        Algorithm::Network => unreachable!("not a tuned plan"),
    }
    owned
}

#[test]
fn pieces_cover_every_element_once_whatever_the_blocks() {
    let l = ReduceLimits {
        chunk_bytes: 64 << 10, // small rounds: several of them at small sizes
        ..lw(4)
    };
    let at = pooled(true, true, false);
    for world in [2usize, 3, 4] {
        for c in COLLECTIVES {
            for es in [1u64, 2, 4, 8] {
                for count in [1u64, 5, 61, 1000, 4099, 70_001] {
                    let s = shape(c, count, es, world);
                    for a in TunedAlgorithm::ALL {
                        for blocks in [1u32, 3, 8, 17, 64] {
                            for pushed in [false, true] {
                                let ch = Choice {
                                    algorithm: a,
                                    blocks,
                                    pushed,
                                };
                                let Some(p) = plan_tuned(&s, Some(&at), &l, &ch) else {
                                    continue;
                                };
                                let owned = owners(&s, &p);
                                assert!(owned.iter().all(|&n| n == 1), "{s:?} {ch}: {:?}", p);
                            }
                        }
                    }
                }
            }
        }
    }
    // Hooked: whole rows.
    for blocks in [1u32, 5, 64] {
        let s = Shape {
            row_len: Some(96),
            ..shape(Collective::AllReduce, 96 * 37, 2, 4)
        };
        for a in [
            TunedAlgorithm::OneShot,
            TunedAlgorithm::Staged,
            TunedAlgorithm::ZeroCopyOneShot,
        ] {
            let p = plan_tuned(&s, Some(&at), &l, &choice(a, blocks)).unwrap();
            assert!(owners(&s, &p).iter().all(|&n| n == 1), "{a:?} {blocks}");
        }
    }
}

/// The kernels of the calls on lines wait on and release LINE_MAX_BLOCKS slots a rank, the
/// others MAX_BLOCKS: no plan, default or tuned, may launch more blocks than its kernel's slots,
/// whatever the size, world, hook rows, limits or choice.
#[test]
fn no_plan_takes_more_blocks_than_its_kernel_has_slots() {
    use crate::reduce::plan::{Algorithm, LINE_MAX_BLOCKS, MAX_BLOCKS};
    let line = |a: Algorithm| matches!(a, Algorithm::OneShot | Algorithm::LineTwoShot);
    for world in [2usize, 3, 4, 8] {
        for (one_shot_blocks, staged, wide) in [(64, 64, 128), (16, 16, 16), (64, 66, 128)] {
            let l = ReduceLimits {
                one_shot_blocks,
                staged_max_blocks: staged,
                wide_max_blocks: wide,
                ..lw(world)
            };
            for c in [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::AllGather,
            ] {
                for bytes in (1..=31)
                    .map(|k| 1u64 << k)
                    .chain([3, 1001, 300_007, 5 << 20])
                {
                    for row in [None, Some(1000u64), Some(4096)] {
                        let count = match row {
                            Some(r) => bytes.div_ceil(2).div_ceil(r).max(1) * r,
                            None => bytes.div_ceil(2),
                        };
                        let s = Shape {
                            row_len: row.filter(|_| c != Collective::AllGather),
                            ..shape(c, count, 2, world)
                        };
                        let mut plans: Vec<Plan> = plan(&s, &l).into_iter().collect();
                        for a in TunedAlgorithm::ALL {
                            for b in [1u32, 32, 64, 65, 128, 129] {
                                plans.extend(plan_tuned(&s, None, &l, &choice(a, b)));
                            }
                        }
                        for p in plans {
                            let most = if line(p.algorithm) {
                                LINE_MAX_BLOCKS
                            } else {
                                MAX_BLOCKS
                            };
                            assert!(
                                (1..=most).contains(&p.blocks),
                                "{c:?} {bytes} B, rows {row:?}, {world} ranks: {:?} on {} blocks",
                                p.algorithm,
                                p.blocks
                            );
                        }
                    }
                }
            }
        }
    }
}
