//! Host side of the reduction self-test: data every rank can regenerate from a seed, and the
//! reference reduction in rank order with the library's rules (docs/COLLECTIVES.md,
//! "Reductions": f32 accumulation for 16-bit floats, wrapping integer sums, avg = sum / n in
//! the accumulation type, max/min keep the first NaN and the earlier rank between equals).

use devcomm::{ReduceOp, Reducible};
use half::{bf16, f16};

/// An element type of the self-test: how to make data and reduce it on the host.
pub(super) trait HostNum: Reducible + PartialEq + std::fmt::Debug + Send + Sync {
    type Acc: Copy;
    /// A value from 64 random bits (a range whose sums stay finite).
    fn gen(h: u64) -> Self;
    fn acc(self) -> Self::Acc;
    fn combine(op: ReduceOp, acc: Self::Acc, x: Self::Acc) -> Self::Acc;
    fn finish(op: ReduceOp, acc: Self::Acc, n: usize) -> Self;
    /// The element's bits (for bitwise comparison and hashing).
    fn bits(self) -> u64;
    /// A poison value whose bits are unlikely as a result.
    fn poison() -> Self;
}

fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0 // [-1, 1)
}

fn float_combine<A: PartialOrd + Copy + std::ops::Add<Output = A>>(
    op: ReduceOp,
    acc: A,
    x: A,
    nan: impl Fn(A) -> bool,
) -> A {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc + x,
        _ if nan(acc) => acc,
        _ if nan(x) => x,
        ReduceOp::Max => {
            if x > acc {
                x
            } else {
                acc
            }
        }
        ReduceOp::Min => {
            if x < acc {
                x
            } else {
                acc
            }
        }
    }
}

macro_rules! float_num {
    ($t:ty, $acc:ty, $gen:expr, $to:expr, $from:expr, $bits:expr, $poison:expr) => {
        impl HostNum for $t {
            type Acc = $acc;
            fn gen(h: u64) -> Self {
                $gen(unit(h))
            }
            fn acc(self) -> $acc {
                $to(self)
            }
            fn combine(op: ReduceOp, acc: $acc, x: $acc) -> $acc {
                float_combine(op, acc, x, |v: $acc| v.is_nan())
            }
            fn finish(op: ReduceOp, acc: $acc, n: usize) -> Self {
                let a = if op == ReduceOp::Avg {
                    acc / n as $acc
                } else {
                    acc
                };
                $from(a)
            }
            fn bits(self) -> u64 {
                $bits(self)
            }
            fn poison() -> Self {
                $poison
            }
        }
    };
}

float_num!(
    f32,
    f32,
    |u: f64| (u * 100.0) as f32,
    |x: f32| x,
    |a: f32| a,
    |x: f32| u64::from(x.to_bits()),
    f32::from_bits(0x7fc0_dead)
);
float_num!(
    f64,
    f64,
    |u: f64| u * 1e6,
    |x: f64| x,
    |a: f64| a,
    |x: f64| x.to_bits(),
    f64::from_bits(0x7ff8_0000_dead_beef)
);
float_num!(
    f16,
    f32,
    |u: f64| f16::from_f64(u * 8.0),
    |x: f16| x.to_f32(),
    f16::from_f32,
    |x: f16| u64::from(x.to_bits()),
    f16::from_bits(0x7e5a)
);
float_num!(
    bf16,
    f32,
    |u: f64| bf16::from_f64(u * 8.0),
    |x: bf16| x.to_f32(),
    bf16::from_f32,
    |x: bf16| u64::from(x.to_bits()),
    bf16::from_bits(0x7fda)
);

macro_rules! int_num {
    ($t:ty) => {
        impl HostNum for $t {
            type Acc = $t;
            fn gen(h: u64) -> Self {
                h as $t
            }
            fn acc(self) -> $t {
                self
            }
            fn combine(op: ReduceOp, acc: $t, x: $t) -> $t {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc.wrapping_add(x),
                    ReduceOp::Max => acc.max(x),
                    ReduceOp::Min => acc.min(x),
                }
            }
            fn finish(op: ReduceOp, acc: $t, n: usize) -> Self {
                if op == ReduceOp::Avg {
                    acc.wrapping_div(n as $t)
                } else {
                    acc
                }
            }
            fn bits(self) -> u64 {
                self as u64
            }
            fn poison() -> Self {
                0x5a as $t
            }
        }
    };
}

int_num!(i32);
int_num!(i64);
int_num!(u8);

/// 64 random bits for (seed, tag, rank, index): every rank can regenerate any rank's data.
pub(super) fn mix(seed: u64, tag: u64, rank: usize, i: usize) -> u64 {
    let mut z = seed ^ tag.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ ((rank as u64) << 48) ^ i as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Rank `rank`'s `len` input elements of case `tag`.
pub(super) fn data<N: HostNum>(seed: u64, tag: u64, rank: usize, len: usize) -> Vec<N> {
    (0..len).map(|i| N::gen(mix(seed, tag, rank, i))).collect()
}

/// The reduction of `inputs` (one per rank, rank order) over `[from, from + len)`.
pub(super) fn reduce<N: HostNum>(
    inputs: &[Vec<N>],
    op: ReduceOp,
    from: usize,
    len: usize,
) -> Vec<N> {
    (from..from + len)
        .map(|i| {
            let mut acc = inputs[0][i].acc();
            for x in &inputs[1..] {
                acc = N::combine(op, acc, x[i].acc());
            }
            N::finish(op, acc, inputs.len())
        })
        .collect()
}

/// FNV-1a over the elements' bits.
pub(super) fn hash<N: HostNum>(v: &[N]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ x.bits()).wrapping_mul(0x100_0000_01b3)
    })
}

/// The first index where `got` and `want` differ in bits, with both values.
pub(super) fn first_diff<N: HostNum>(got: &[N], want: &[N]) -> Option<(usize, N, N)> {
    if got.len() != want.len() {
        return Some((got.len().min(want.len()), N::poison(), N::poison()));
    }
    got.iter()
        .zip(want)
        .position(|(a, b)| a.bits() != b.bits())
        .map(|i| (i, got[i], want[i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_keeps_rank_order_and_the_documented_rules() {
        // f32 sums in rank order: (1e8 + 1) - 1e8 = 0 in f32, not 1.
        let v = vec![vec![1e8f32], vec![1.0], vec![-1e8]];
        assert_eq!(reduce(&v, ReduceOp::Sum, 0, 1), vec![0.0]);
        // 16-bit floats accumulate in f32 and round once.
        let h = vec![
            vec![f16::from_f32(2048.0)],
            vec![f16::from_f32(1.0)],
            vec![f16::from_f32(1.0)],
        ];
        assert_eq!(reduce(&h, ReduceOp::Sum, 0, 1)[0].to_f32(), 2050.0);
        // Integer sums wrap; avg divides the wrapped sum, truncating.
        let i = vec![vec![i32::MAX], vec![1], vec![-7]];
        assert_eq!(reduce(&i, ReduceOp::Sum, 0, 1), vec![i32::MAX - 6]);
        assert_eq!(reduce(&[vec![7i32], vec![0]], ReduceOp::Avg, 0, 1), vec![3]);
        assert_eq!(
            reduce(&[vec![-7i32], vec![0]], ReduceOp::Avg, 0, 1),
            vec![-3]
        );
        assert_eq!(
            reduce(&[vec![200u8], vec![100]], ReduceOp::Avg, 0, 1),
            vec![22]
        );
        // Max: the first NaN wins; between -0 and 0 the earlier rank's.
        let m = vec![vec![-0.0f32, 1.0], vec![0.0, f32::NAN]];
        let r = reduce(&m, ReduceOp::Max, 0, 2);
        assert_eq!(r[0].to_bits(), (-0.0f32).to_bits());
        assert!(r[1].is_nan());
    }
}
