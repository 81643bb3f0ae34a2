//! The host's model of an epilogue hook's row group (`cuda/devcomm/reduce.cuh`, "Epilogue
//! hooks"; docs/COLLECTIVES.md): the widths a hook may declare (`kRowThreads`), which lane
//! holds which columns, and the fixed orders of `row_sum` and `row_max`, so that a host
//! reference of a hook reproduces its results bit for bit. Pure functions; the examples'
//! references, the self-test and the benchmark use them.
//!
//! A row of `cols` elements runs on `lanes` threads: lane `l` visits columns `l`, `l + lanes`,
//! `l + 2 lanes`, ... in that order ([`lane_folds`]). `row_sum` of the lanes' values adds
//! within each warp of 32 lanes by `warp_sum`'s xor butterfly (lane `l` adds lane `l ^ o`'s
//! value for `o` = 16, 8, 4, 2, 1), then the warps' sums in warp order, `((w0 + w1) + w2) +
//! ...` ([`row_sum`]); `row_max` likewise with `fmaxf` ([`row_max`]).

/// The row group widths a hook may declare as `kRowThreads`: from a warp to the reduction
/// kernels' block (`kThreads`).
pub const ROW_THREADS: [u32; 5] = [32, 64, 128, 256, 512];

/// The width of a hook that declares no `kRowThreads`: one warp.
pub const DEFAULT_ROW_THREADS: u32 = 32;

/// Lanes of a warp.
const WARP: usize = 32;

/// Each lane's fold of its columns: lane `l` of `lanes` starts from `init` and folds
/// `values[l]`, `values[l + lanes]`, ... in that order with `f(acc, value)`, as a hook's lane
/// walks its columns. For the sum of squares of a hook that does `ss = fma(h, h, ss)`:
/// `lane_folds(&h, lanes, 0.0, |acc, x| x.mul_add(x, acc))`.
pub fn lane_folds(
    values: &[f32],
    lanes: usize,
    init: f32,
    f: impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    assert!(
        ROW_THREADS.contains(&(lanes as u32)),
        "{lanes} lanes: a row group is one of {ROW_THREADS:?}"
    );
    let mut acc = vec![init; lanes];
    for (j, &v) in values.iter().enumerate() {
        acc[j % lanes] = f(acc[j % lanes], v);
    }
    acc
}

/// `row_sum` of the lanes' values (`lanes.len()` is the group's width, one of
/// [`ROW_THREADS`]): every thread of the group gets these bits.
pub fn row_sum(lanes: &[f32]) -> f32 {
    row_combine(lanes, |a, b| a + b)
}

/// `row_max` of the lanes' values: `fmaxf` (of a NaN and a number, the number) in `row_sum`'s
/// order.
pub fn row_max(lanes: &[f32]) -> f32 {
    row_combine(lanes, f32::max)
}

/// Each warp's butterfly, then the warps' values in warp order, with `op`.
fn row_combine(lanes: &[f32], op: impl Fn(f32, f32) -> f32) -> f32 {
    assert!(
        ROW_THREADS.contains(&(lanes.len() as u32)),
        "{} lanes: a row group is one of {ROW_THREADS:?}",
        lanes.len()
    );
    let warp = |w: &[f32]| -> f32 {
        let mut v: [f32; WARP] = w.try_into().expect("a warp is 32 lanes");
        for o in [16, 8, 4, 2, 1] {
            let before = v;
            for (l, x) in v.iter_mut().enumerate() {
                *x = op(before[l], before[l ^ o]);
            }
        }
        // Every lane holds the same bits (the operation commutes); the kernel's lane 0 writes.
        v[0]
    };
    let mut warps = lanes.chunks(WARP).map(warp);
    let first = warps.next().expect("at least one warp");
    warps.fold(first, &op)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(i: usize) -> f32 {
        let h = (i as u64 ^ 0x5eed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    /// The sum of squares as one warp did it before row groups: lanes[j % 32] with fma, then
    /// warp_sum's butterfly, written out as the examples' references had it.
    fn one_warp_sum_of_squares(h: &[f32]) -> f32 {
        let mut lanes = [0f32; 32];
        for (j, v) in h.iter().enumerate() {
            lanes[j % 32] = v.mul_add(*v, lanes[j % 32]);
        }
        for o in [16, 8, 4, 2, 1] {
            let before = lanes;
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = before[l] + before[l ^ o];
            }
        }
        lanes[0]
    }

    fn sum_of_squares(h: &[f32], lanes: usize) -> f32 {
        row_sum(&lane_folds(h, lanes, 0.0, |acc, x| x.mul_add(x, acc)))
    }

    #[test]
    fn thirty_two_lanes_are_the_one_warp_reference() {
        for cols in [1, 7, 31, 32, 33, 1000, 4096, 7168] {
            let h: Vec<f32> = (0..cols).map(|i| sample(i * 3 + cols)).collect();
            assert_eq!(
                sum_of_squares(&h, 32).to_bits(),
                one_warp_sum_of_squares(&h).to_bits(),
                "{cols} columns"
            );
        }
    }

    #[test]
    fn wider_groups_differ_only_by_order() {
        // The same sum to within the rounding of a few thousand additions, and on some row the
        // bits differ (the order is not the warp's): the reference must be given the width.
        let h: Vec<f32> = (0..4096).map(sample).collect();
        let exact: f64 = h.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let mut differ = false;
        for lanes in ROW_THREADS {
            let s = sum_of_squares(&h, lanes as usize);
            assert!(
                (f64::from(s) - exact).abs() <= exact * 1e-5,
                "{lanes} lanes: {s} against {exact}"
            );
            differ |= s.to_bits() != sum_of_squares(&h, 32).to_bits();
        }
        assert!(differ, "every width gave the warp's bits on this row");
    }

    #[test]
    fn lanes_fold_their_columns_in_order() {
        // Lane l of 64 holds columns l, l + 64, ...: with "acc * 10 + value" the digits show
        // the order.
        let v: Vec<f32> = (0..192).map(|j| (j / 64) as f32 + 1.0).collect();
        let folds = lane_folds(&v, 64, 0.0, |acc, x| acc * 10.0 + x);
        assert!(folds.iter().all(|&x| x == 123.0), "{folds:?}");
        // Fewer columns than lanes: the lanes past them keep `init`.
        let folds = lane_folds(&[5.0; 3], 128, -1.0, |_, x| x);
        assert_eq!(&folds[..4], &[5.0, 5.0, 5.0, -1.0]);
    }

    #[test]
    fn warps_combine_in_warp_order() {
        // Warp 0 sums to 1e8, warp 1 to -1e8, warp 2 to 1 (warp 3 to 0): ((1e8 + -1e8) + 1)
        // = 1, where an order that adds 1 to 1e8 first would lose it.
        let mut lanes = vec![0f32; 128];
        lanes[0] = 1e8;
        lanes[32] = -1e8;
        lanes[64] = 1.0;
        assert_eq!(row_sum(&lanes), 1.0);
        lanes.swap(32, 64);
        assert_eq!(row_sum(&lanes), 0.0, "(1e8 + 1) - 1e8 in f32");
    }

    #[test]
    fn row_max_takes_the_largest_and_skips_nan() {
        let mut lanes: Vec<f32> = (0..256).map(|i| sample(i).abs()).collect();
        lanes[200] = 7.0;
        lanes[3] = f32::NAN;
        assert_eq!(row_max(&lanes), 7.0);
        assert_eq!(row_max(&[0.0; 32]), 0.0);
    }

    #[test]
    #[should_panic(expected = "a row group is one of")]
    fn a_width_that_is_no_row_group_is_refused() {
        row_sum(&[1.0; 48]);
    }
}
