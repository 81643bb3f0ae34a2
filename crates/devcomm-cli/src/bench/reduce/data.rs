//! The reduction benchmark's data: values that any rank can regenerate for any rank, chosen
//! so that every reduction order gives the same bits (small integers, exact in the element
//! type and in every partial sum), their host encoding, the poison, the host reference and the
//! comparison.

use devcomm::{DataType, ReduceOp};

use super::types::Coll;

/// How the element type is written on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    F32,
    F64,
    Bf16,
    F16,
    I32,
    I64,
    U8,
}

impl Codec {
    pub(crate) fn of(t: DataType) -> Result<Self, String> {
        Ok(match t {
            DataType::F32 => Self::F32,
            DataType::F64 => Self::F64,
            DataType::BF16 => Self::Bf16,
            DataType::F16 => Self::F16,
            DataType::I32 => Self::I32,
            DataType::I64 => Self::I64,
            DataType::U8 => Self::U8,
            // DataType is non-exhaustive: a type added later needs its encoding here.
            other => return Err(format!("the benchmark cannot write {other:?} values")),
        })
    }

    pub(crate) fn bytes(self) -> usize {
        match self {
            Self::F64 | Self::I64 => 8,
            Self::F32 | Self::I32 => 4,
            Self::Bf16 | Self::F16 => 2,
            Self::U8 => 1,
        }
    }

    /// Bits of precision p of a float type (rounding error at most 2^-p of the value).
    fn precision_bits(self) -> Option<i32> {
        match self {
            Self::Bf16 => Some(8),
            Self::F16 => Some(11),
            Self::F32 => Some(24),
            Self::F64 => Some(53),
            Self::I32 | Self::I64 | Self::U8 => None,
        }
    }

    /// Largest magnitude every value and partial result stays within: every integer up to it
    /// is exact (floats), and no sum wraps or reaches the poison (integers).
    pub(crate) fn exact_limit(self) -> i64 {
        match self.precision_bits() {
            Some(p) => 1 << p.min(40),
            None if self == Self::U8 => 200,
            None => 1 << 30,
        }
    }

    /// The byte devcomm's output is filled with before the checked call: NaN for floats, a
    /// value above [`Codec::exact_limit`] for integers, so an element left unwritten fails.
    /// NCCL's output gets `poison() ^ 1`, as far out, so two unwritten outputs differ.
    pub(crate) fn poison(self) -> u8 {
        match self {
            Self::I32 | Self::I64 => 0x7F,
            _ => 0xFF,
        }
    }

    /// Writes the integer `x` (within [`Codec::exact_limit`]) as one element.
    pub(crate) fn encode(self, x: i64, out: &mut [u8]) {
        match self {
            Self::F32 => out.copy_from_slice(&(x as f32).to_le_bytes()),
            Self::F64 => out.copy_from_slice(&(x as f64).to_le_bytes()),
            // Exact: |x| <= 256 has at most 8 significant bits, all in bf16's top half.
            Self::Bf16 => out.copy_from_slice(&(((x as f32).to_bits() >> 16) as u16).to_le_bytes()),
            Self::F16 => out.copy_from_slice(&f16_bits(x).to_le_bytes()),
            Self::I32 => out.copy_from_slice(&(x as i32).to_le_bytes()),
            Self::I64 => out.copy_from_slice(&x.to_le_bytes()),
            Self::U8 => out[0] = x as u8,
        }
    }

    /// One element's value.
    pub(crate) fn decode(self, b: &[u8]) -> f64 {
        let two = || u16::from_le_bytes([b[0], b[1]]);
        let four = || [b[0], b[1], b[2], b[3]];
        match self {
            Self::F32 => f64::from(f32::from_le_bytes(four())),
            Self::F64 => f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
            Self::Bf16 => f64::from(f32::from_bits(u32::from(two()) << 16)),
            Self::F16 => f16_value(two()),
            Self::I32 => f64::from(i32::from_le_bytes(four())),
            Self::I64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f64,
            Self::U8 => f64::from(b[0]),
        }
    }
}

/// IEEE half bits of an integer of magnitude at most 2048 (exact).
fn f16_bits(x: i64) -> u16 {
    if x == 0 {
        return 0;
    }
    let sign = if x < 0 { 0x8000u16 } else { 0 };
    let a = x.unsigned_abs();
    let e = 63 - a.leading_zeros() as u64; // a = 1.m x 2^e
    let mantissa = ((a << 10) >> e) & 0x3FF;
    sign | ((e as u16 + 15) << 10) | mantissa as u16
}

/// The value of IEEE half bits.
fn f16_value(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((h >> 10) & 0x1F);
    let m = f64::from(h & 0x3FF);
    match e {
        0 => sign * m * 2f64.powi(-24),
        31 if m == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
    }
}

/// How devcomm's result is compared with NCCL's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Check {
    /// Every bit: the values give the same result in every order.
    Bitwise,
    /// Each element within this distance: NCCL's average of a float type on a world size that
    /// is not a power of two multiplies by a rounded 1/n before it sums.
    Within(f64),
}

/// The values of a run: element `step x k`, `k` uniform in `[-k_max, k_max]` (`[0, k_max]`
/// for u8), with the check against NCCL they allow. Against the host reference the check is
/// always bitwise (devcomm sums in rank order in a type that holds every partial sum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Values {
    pub(crate) codec: Codec,
    pub(crate) step: i64,
    pub(crate) k_max: i64,
    pub(crate) check: Check,
}

impl Values {
    /// Values for `op` (none: all-gather) on `world` ranks: sums stay exact, an average's
    /// values are multiples of `world` so that the sum divides exactly.
    pub(crate) fn new(codec: Codec, op: Option<ReduceOp>, world: usize) -> Result<Self, String> {
        let n = world.max(1) as i64;
        let limit = codec.exact_limit();
        let (step, k_max, check) = match op {
            None | Some(ReduceOp::Max) | Some(ReduceOp::Min) => (1, limit, Check::Bitwise),
            Some(ReduceOp::Sum) => (1, limit / n, Check::Bitwise),
            Some(ReduceOp::Avg) => match codec.precision_bits() {
                Some(p) if !world.is_power_of_two() => {
                    // NCCL's pre-multiplied terms and partial sums each round by at most
                    // 2^-p of n x k_max: a distance of 2 n^2 k_max 2^-p, kept under 1/4 so
                    // that a wrong integer still fails.
                    let k = ((1i64 << p.min(40)) / (8 * n * n)).clamp(1, limit / (n * n));
                    let tol = (2 * n * n * k) as f64 * 2f64.powi(-p);
                    (n, k, Check::Within(tol))
                }
                _ => (n, limit / (n * n), Check::Bitwise),
            },
        };
        if k_max < 1 {
            return Err(format!(
                "{world} ranks are too many for exact {codec:?} data (sums up to {limit})"
            ));
        }
        Ok(Self {
            codec,
            step,
            k_max,
            check,
        })
    }

    /// Element `i` of `rank`'s input in the run tagged `tag` (of `seed`).
    #[cfg(test)]
    pub(crate) fn value(&self, seed: u64, tag: u64, rank: usize, i: usize) -> i64 {
        self.value_in(stream(seed, tag, rank), i)
    }

    /// Element `i` of the input whose [`stream`] is `stream`.
    fn value_in(&self, stream: u64, i: usize) -> i64 {
        let h = mix(stream.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        let k = if self.codec == Codec::U8 {
            (h % (self.k_max as u64 + 1)) as i64
        } else {
            (h % (2 * self.k_max as u64 + 1)) as i64 - self.k_max
        };
        self.step * k
    }

    /// `rank`'s input of `elems` elements, encoded (on a few threads: a 1 GiB input is half a
    /// billion elements).
    pub(crate) fn input(&self, seed: u64, tag: u64, rank: usize, elems: usize) -> Vec<u8> {
        const THREADS: usize = 4;
        let w = self.codec.bytes();
        let stream = stream(seed, tag, rank);
        let mut out = vec![0u8; elems * w];
        let per_thread = elems.div_ceil(THREADS).max(1 << 16);
        std::thread::scope(|scope| {
            for (t, part) in out.chunks_mut(per_thread * w).enumerate() {
                scope.spawn(move || {
                    for (j, e) in part.chunks_exact_mut(w).enumerate() {
                        self.codec
                            .encode(self.value_in(stream, t * per_thread + j), e);
                    }
                });
            }
        });
        out
    }
}

/// The start of one rank's values in one run.
fn stream(seed: u64, tag: u64, rank: usize) -> u64 {
    mix(seed ^ mix(tag ^ ((rank as u64) << 48)))
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One run's inputs as the host reference sees them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) values: Values,
    pub(crate) seed: u64,
    pub(crate) tag: u64,
    pub(crate) world: usize,
}

/// This rank's expected output of `coll` with `op` (ignored by all-gather) over every rank's
/// input in rank order, encoded; `count` is the call's count argument (the all-reduce buffer,
/// the reduce-scatter shard, the all-gather input).
pub(crate) fn expected(run: &Run, coll: Coll, op: ReduceOp, rank: usize, count: usize) -> Vec<u8> {
    let (v, w) = (&run.values, run.values.codec.bytes());
    let streams: Vec<u64> = (0..run.world)
        .map(|r| stream(run.seed, run.tag, r))
        .collect();
    let at = |r: usize, i: usize| v.value_in(streams[r], i);
    let reduce = |i: usize| -> i64 {
        let mut acc = at(0, i);
        for r in 1..run.world {
            let x = at(r, i);
            acc = match op {
                ReduceOp::Max => acc.max(x),
                ReduceOp::Min => acc.min(x),
                ReduceOp::Sum | ReduceOp::Avg => acc + x,
            };
        }
        if op == ReduceOp::Avg {
            acc / run.world as i64
        } else {
            acc
        }
    };
    let (_, elems) = coll.in_out(count, run.world);
    let mut out = vec![0u8; elems * w];
    for (j, e) in out.chunks_exact_mut(w).enumerate() {
        let x = match coll {
            Coll::AllReduce => reduce(j),
            Coll::ReduceScatter => reduce(rank * count + j),
            Coll::AllGather => at(j / count, j % count),
        };
        v.codec.encode(x, e);
    }
    out
}

/// The first element where `got` differs from `want` under `check`: (index, got, want).
pub(crate) fn first_mismatch(
    codec: Codec,
    check: Check,
    got: &[u8],
    want: &[u8],
) -> Option<(usize, f64, f64)> {
    if check == Check::Bitwise && got == want {
        return None;
    }
    let w = codec.bytes();
    if got.len() != want.len() {
        let n = got.len().min(want.len()) / w;
        return Some((n, f64::NAN, f64::NAN));
    }
    got.chunks_exact(w)
        .zip(want.chunks_exact(w))
        .position(|(g, e)| match check {
            Check::Bitwise => g != e,
            // A NaN distance (an unwritten, poisoned element) is a mismatch too.
            Check::Within(tol) => {
                let d = (codec.decode(g) - codec.decode(e)).abs();
                d.is_nan() || d > tol
            }
        })
        .map(|i| {
            let at = i * w..(i + 1) * w;
            (i, codec.decode(&got[at.clone()]), codec.decode(&want[at]))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Codec; 7] = [
        Codec::F32,
        Codec::F64,
        Codec::Bf16,
        Codec::F16,
        Codec::I32,
        Codec::I64,
        Codec::U8,
    ];

    fn enc(c: Codec, x: i64) -> Vec<u8> {
        let mut b = vec![0u8; c.bytes()];
        c.encode(x, &mut b);
        b
    }

    #[test]
    fn half_types_encode_exactly() {
        assert_eq!(enc(Codec::Bf16, 1), 0x3F80u16.to_le_bytes());
        assert_eq!(enc(Codec::Bf16, -256), 0xC380u16.to_le_bytes());
        assert_eq!(enc(Codec::F16, 1), 0x3C00u16.to_le_bytes());
        assert_eq!(enc(Codec::F16, -2), 0xC000u16.to_le_bytes());
        assert_eq!(enc(Codec::F16, 3), 0x4200u16.to_le_bytes());
        assert_eq!(enc(Codec::F16, 2048), 0x6800u16.to_le_bytes());
        assert_eq!(f16_value(0x0001), 2f64.powi(-24));
        assert!(f16_value(0x7C01).is_nan());
        assert_eq!(f16_value(0xFC00), f64::NEG_INFINITY);
    }

    #[test]
    fn every_value_up_to_the_limit_round_trips() {
        for c in ALL {
            let limit = c.exact_limit();
            let low = if c == Codec::U8 { 0 } else { -limit };
            let step = (limit / 512).max(1);
            let mut x = low;
            while x <= limit {
                assert_eq!(c.decode(&enc(c, x)), x as f64, "{c:?} {x}");
                x += step;
            }
            assert_eq!(c.decode(&enc(c, limit)), limit as f64, "{c:?}");
        }
    }

    #[test]
    fn poison_is_no_value() {
        for c in ALL {
            for p in [c.poison(), c.poison() ^ 1] {
                let v = c.decode(&vec![p; c.bytes()]);
                assert!(
                    v.is_nan() || v.abs() > c.exact_limit() as f64,
                    "{c:?} {p:#x}"
                );
            }
        }
    }

    #[test]
    fn sums_stay_exact_and_averages_divide() {
        for c in ALL {
            for world in 2..=8 {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
                    let v = Values::new(c, Some(op), world).unwrap();
                    assert!(v.k_max >= 1);
                    // Every value, and every partial sum of a sum or average, within the limit.
                    let terms = match op {
                        ReduceOp::Sum | ReduceOp::Avg => world as i64,
                        ReduceOp::Max | ReduceOp::Min => 1,
                    };
                    assert!(terms * v.step * v.k_max <= c.exact_limit(), "{c:?} {op:?}");
                    if op == ReduceOp::Avg {
                        assert_eq!(v.step, world as i64);
                    }
                    let bitwise = op != ReduceOp::Avg
                        || world.is_power_of_two()
                        || matches!(c, Codec::I32 | Codec::I64 | Codec::U8);
                    match v.check {
                        Check::Bitwise => assert!(bitwise, "{c:?} {op:?} {world}"),
                        Check::Within(t) => {
                            assert!(!bitwise && t > 0.0 && t < 0.5, "{c:?} {world} {t}")
                        }
                    }
                }
            }
        }
        let bf16_avg_3 = Values::new(Codec::Bf16, Some(ReduceOp::Avg), 3).unwrap();
        assert_eq!((bf16_avg_3.k_max, bf16_avg_3.step), (3, 3));
        assert!(Values::new(Codec::Bf16, Some(ReduceOp::Sum), 300).is_err());
    }

    #[test]
    fn values_are_fresh_per_rank_and_tag_and_in_range() {
        let v = Values::new(Codec::Bf16, Some(ReduceOp::Sum), 8).unwrap();
        let a: Vec<i64> = (0..256).map(|i| v.value(7, 1, 0, i)).collect();
        let b: Vec<i64> = (0..256).map(|i| v.value(7, 1, 1, i)).collect();
        let c: Vec<i64> = (0..256).map(|i| v.value(7, 2, 0, i)).collect();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, (0..256).map(|i| v.value(7, 1, 0, i)).collect::<Vec<_>>());
        assert!(a.iter().all(|x| x.abs() <= 32));
        assert!(a.iter().any(|&x| x < -16) && a.iter().any(|&x| x > 16));
        let u = Values::new(Codec::U8, Some(ReduceOp::Avg), 4).unwrap();
        assert!((0..1000)
            .all(|i| (0..=48).contains(&u.value(1, 1, 3, i)) && u.value(1, 1, 3, i) % 4 == 0));
        // Across the threads' parts of a large input, element i is still value i.
        let big = v.input(7, 1, 1, 300_001);
        for i in [0, 65_535, 65_536, 75_000, 75_001, 150_000, 300_000] {
            assert_eq!(
                big[2 * i..2 * i + 2],
                enc(Codec::Bf16, v.value(7, 1, 1, i)),
                "{i}"
            );
        }
        assert_eq!(v.input(7, 1, 1, 3), {
            let mut e = Vec::new();
            for &x in &b[..3] {
                e.extend(enc(Codec::Bf16, x));
            }
            e
        });
    }

    #[test]
    fn the_host_reference_reduces_every_rank_in_order() {
        let world = 3;
        let values = Values::new(Codec::I32, Some(ReduceOp::Sum), world).unwrap();
        let run = Run {
            values,
            seed: 11,
            tag: 5,
            world,
        };
        let x = |r: usize, i: usize| values.value(11, 5, r, i);
        let dec = |b: Vec<u8>| -> Vec<i64> {
            b.chunks_exact(4)
                .map(|e| i64::from(i32::from_le_bytes([e[0], e[1], e[2], e[3]])))
                .collect()
        };
        let ar = dec(expected(&run, Coll::AllReduce, ReduceOp::Sum, 1, 4));
        assert_eq!(
            ar,
            (0..4)
                .map(|i| x(0, i) + x(1, i) + x(2, i))
                .collect::<Vec<_>>()
        );
        let rs = dec(expected(&run, Coll::ReduceScatter, ReduceOp::Max, 2, 2));
        assert_eq!(
            rs,
            (4..6)
                .map(|i| x(0, i).max(x(1, i)).max(x(2, i)))
                .collect::<Vec<_>>()
        );
        let ag = dec(expected(&run, Coll::AllGather, ReduceOp::Sum, 0, 2));
        assert_eq!(
            ag,
            vec![x(0, 0), x(0, 1), x(1, 0), x(1, 1), x(2, 0), x(2, 1)]
        );
        let avg = Run {
            values: Values::new(Codec::I32, Some(ReduceOp::Avg), world).unwrap(),
            ..run
        };
        let y = |r: usize, i: usize| avg.values.value(11, 5, r, i);
        let got = dec(expected(&avg, Coll::AllReduce, ReduceOp::Avg, 0, 2));
        assert_eq!(
            got,
            (0..2)
                .map(|i| (y(0, i) + y(1, i) + y(2, i)) / 3)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn mismatches_are_found_where_they_are() {
        let c = Codec::Bf16;
        let want: Vec<u8> = [1, 2, 3, 4].iter().flat_map(|&x| enc(c, x)).collect();
        assert_eq!(first_mismatch(c, Check::Bitwise, &want, &want), None);
        let mut got = want.clone();
        got[4..6].copy_from_slice(&enc(c, 5));
        assert_eq!(
            first_mismatch(c, Check::Bitwise, &got, &want),
            Some((2, 5.0, 3.0))
        );
        assert_eq!(first_mismatch(c, Check::Within(2.5), &got, &want), None);
        assert!(first_mismatch(c, Check::Within(1.5), &got, &want).is_some());
        let poisoned = vec![c.poison(); want.len()];
        let m = first_mismatch(c, Check::Within(1e9), &poisoned, &want).unwrap();
        assert_eq!(m.0, 0);
        assert!(m.1.is_nan());
        assert!(first_mismatch(c, Check::Bitwise, &want[..4], &want).is_some());
    }
}
