//! FP8 (OCP e4m3fn) on the host, bit for bit as the device does it (`cuda/devcomm/fp8.cuh` and
//! the FP8 wire of `cuda/kernels/moe.cu`): the encoder and decoder, and the quantisation of a
//! row in blocks with `f32` scales. Pure functions; the MoE reference and the tests use them.
//!
//! Quantising a block `x` (the elements a scale covers):
//!
//! - `amax` = the largest `|x|` over the block's finite elements (0 if none);
//! - `scale` = `amax / 448` (rounded once), or 1 when `amax` is 0 (a block of zeros);
//! - `inv` = `min(448 / amax, f32::MAX)` (rounded once; the `min` keeps a tiny `amax` finite),
//!   or 1 when `amax` is 0;
//! - each code = `e4m3(x * inv)` (the product rounded once, then to e4m3).
//!
//! Non-finite elements: NaN becomes the e4m3 NaN (0x7f), and dequantises to NaN; +-infinity
//! is left out of `amax` and saturates to +-448, so it dequantises to +-(448 x scale), about
//! the block's largest finite magnitude. Dequantising: `code as f32 x scale` (rounded once),
//! then rounded to the output type.

use super::elem::Elem;

/// The largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// f32 -> e4m3 (OCP e4m3fn: bias 7, no infinities, 0x7f / 0xff NaN): round to nearest, ties
/// to even; finite values past 448 and infinities saturate to +-448 (`.satfinite`); NaN ->
/// 0x7f. e4m3 codes grow with the magnitude across the subnormal/normal boundary, so the code
/// is the magnitude in units of its binade's step (2^(e-3), 2^-9 below 2^-6), rounded.
pub fn e4m3_from_f32(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    if a.is_nan() {
        return 0x7f;
    }
    // 464 lies halfway between 448 (even code 0x7e) and 480 (past the range): ties to 448.
    if a >= 464.0 {
        return sign | 0x7e;
    }
    let e = ((a.to_bits() >> 23) as i32 - 127).max(-6);
    // A power of two: the product is exact.
    let n = (a * f32::from_bits(((127 + 3 - e) as u32) << 23)).round_ties_even();
    sign | (((e + 6) << 3) + n as i32) as u8
}

/// e4m3 -> f32 (exact); 0x7f and 0xff are NaN.
pub fn e4m3_to_f32(c: u8) -> f32 {
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((c >> 3) & 0xf), f32::from(c & 7));
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    let v = if e == 0 {
        m * 2f32.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    sign * v
}

/// The scale of a block and the factor its elements are multiplied by before encoding.
pub fn block_scale(block: &[f32]) -> (f32, f32) {
    let amax = block
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f32, |m, v| m.max(v.abs()));
    if amax > 0.0 {
        (amax / E4M3_MAX, (E4M3_MAX / amax).min(f32::MAX))
    } else {
        (1.0, 1.0)
    }
}

/// `row` quantised in blocks of `block` elements (`row.len()` a multiple of it): the e4m3
/// codes and one scale per block, in order.
pub fn quantise_row<E: Elem>(row: &[E], block: usize) -> (Vec<u8>, Vec<f32>) {
    assert!(block > 0 && row.len() % block == 0, "rows of whole blocks");
    let mut codes = Vec::with_capacity(row.len());
    let mut scales = Vec::with_capacity(row.len() / block);
    for chunk in row.chunks(block) {
        let x: Vec<f32> = chunk.iter().map(|v| v.to_f32()).collect();
        let (scale, inv) = block_scale(&x);
        codes.extend(x.iter().map(|v| e4m3_from_f32(v * inv)));
        scales.push(scale);
    }
    (codes, scales)
}

/// The row of `codes` with one scale per `block` elements, dequantised: `code x scale` in
/// `f32`, rounded to `E`.
pub fn dequantise_row<E: Elem>(codes: &[u8], scales: &[f32], block: usize) -> Vec<E> {
    assert_eq!(codes.len(), scales.len() * block, "one scale per block");
    codes
        .iter()
        .enumerate()
        .map(|(i, &c)| E::from_f32(e4m3_to_f32(c) * scales[i / block]))
        .collect()
}

/// The most a dequantised element may differ from its original `x` in a block of scale
/// `scale` (rounded to a type with `mantissa_bits` explicit bits): half an e4m3 step, relative
/// (2^-4 of `|x|`) for normal codes and absolute (2^-10 x `scale`) for subnormal ones, plus
/// the final rounding (half an ulp of the result) and slack for the scale's own rounding.
pub fn quantisation_bound(x: f32, scale: f32, mantissa_bits: u32) -> f32 {
    let a = x.abs();
    let step = a / 16.0 + scale / 1024.0;
    let result = (a + step) * 2f32.powi(-(mantissa_bits as i32) - 1);
    step + result + a * 2f32.powi(-20)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn e4m3_known_values() {
        for (x, code) in [
            (0.0f32, 0x00u8),
            (-0.0, 0x80),
            (1.0, 0x38),
            (-1.0, 0xb8),
            (0.5, 0x30),
            (448.0, 0x7e),
            (-448.0, 0xfe),
            // Past the range: saturates (464 is the midpoint to 480 and ties to 448).
            (449.0, 0x7e),
            (464.0, 0x7e),
            (1e6, 0x7e),
            (-1e6, 0xfe),
            (f32::INFINITY, 0x7e),
            (f32::NEG_INFINITY, 0xfe),
            // The smallest normal 2^-6 and the subnormals m x 2^-9.
            (2f32.powi(-6), 0x08),
            (2f32.powi(-9), 0x01),
            (7.0 * 2f32.powi(-9), 0x07),
            // Half the smallest subnormal ties to 0 (even); a bit more rounds up.
            (2f32.powi(-10), 0x00),
            (1.01 * 2f32.powi(-10), 0x01),
            // 1.0625 = 1 + 1/16, halfway between 1 (0x38) and 1.125 (0x39): even, 1.
            (1.0625, 0x38),
            // 1.1875 halfway between 1.125 (0x39) and 1.25 (0x3a): even, 1.25.
            (1.1875, 0x3a),
            (240.0, 0x77),
            (-2.0, 0xc0),
            (-2f32.powi(-9), 0x81),
            // 1.5 x 2^-9: tie between 1 and 2, to even 2; 7.5 x 2^-9: between 7 and 8 (2^-6).
            (1.5 * 2f32.powi(-9), 0x02),
            (7.5 * 2f32.powi(-9), 0x08),
            (1.07, 0x39),
            (1e-30, 0x00),
            (f32::from_bits(1), 0x00), // an f32 subnormal
        ] {
            assert_eq!(e4m3_from_f32(x), code, "{x:e}");
        }
    }

    #[test]
    fn nan_is_0x7f_and_decodes_to_nan() {
        assert_eq!(e4m3_from_f32(f32::NAN), 0x7f);
        assert_eq!(e4m3_from_f32(-f32::NAN), 0x7f);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    }

    #[test]
    fn every_code_round_trips_and_midpoints_tie_to_even() {
        for c in 0u8..0x7f {
            let v = e4m3_to_f32(c);
            assert_eq!(e4m3_from_f32(v), c, "{v:e}");
            assert_eq!(e4m3_from_f32(-v), c | 0x80, "{v:e}");
            if c + 1 < 0x7f {
                let next = e4m3_to_f32(c + 1);
                let mid = (v + next) / 2.0;
                let even = if c % 2 == 0 { c } else { c + 1 };
                assert_eq!(e4m3_from_f32(mid), even, "midpoint {mid:e}");
                let below = f32::from_bits(mid.to_bits() - 1);
                let above = f32::from_bits(mid.to_bits() + 1);
                assert_eq!(e4m3_from_f32(below), c, "{below:e}");
                assert_eq!(e4m3_from_f32(above), c + 1, "{above:e}");
            }
        }
    }

    /// The nearest finite code by search over all of them (ties: the even code), saturating:
    /// an encoder written another way.
    fn nearest_code(x: f32) -> u8 {
        let a = f64::from(x.abs()).min(448.0);
        let mut best = 0u8;
        for c in 1..=0x7eu8 {
            let (d, b) = (
                (f64::from(e4m3_to_f32(c)) - a).abs(),
                (f64::from(e4m3_to_f32(best)) - a).abs(),
            );
            if d < b || (d == b && c % 2 == 0) {
                best = c;
            }
        }
        best | if x.is_sign_negative() { 0x80 } else { 0 }
    }

    #[test]
    fn the_encoder_agrees_with_a_search_for_the_nearest_code() {
        // Every 8191st f32 from 0 to past 512, both signs.
        for b in (0..0x4410_0000u32).step_by(8191) {
            let x = f32::from_bits(b);
            assert_eq!(e4m3_from_f32(x), nearest_code(x), "{x:e}");
            assert_eq!(e4m3_from_f32(-x), nearest_code(-x), "{:e}", -x);
        }
    }

    #[test]
    fn a_block_s_largest_element_maps_to_448_and_zeros_get_scale_1() {
        let row: Vec<bf16> = [0.5f32, -3.0, 1.5, 0.25]
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        let (codes, scales) = quantise_row(&row, 2);
        assert_eq!(scales, [3.0 / 448.0, 1.5 / 448.0]);
        // -3 is its block's amax: -448.
        assert_eq!(codes[1], 0xfe);
        let zeros = vec![bf16::from_f32(0.0); 4];
        assert_eq!(quantise_row(&zeros, 4), (vec![0; 4], vec![1.0]));
        // A row of one block: the same as its only block.
        let (whole, s) = quantise_row(&row, 4);
        assert_eq!(s, [3.0 / 448.0]);
        assert_eq!(whole[1], 0xfe);
    }

    #[test]
    fn infinities_saturate_and_nan_stays_nan() {
        let row = [1.0f32, f32::INFINITY, f32::NAN, -2.0];
        let (codes, scales) = quantise_row(&row, 4);
        assert_eq!(scales, [2.0 / 448.0]);
        assert_eq!((codes[1], codes[2], codes[3]), (0x7e, 0x7f, 0xfe));
        let back: Vec<f32> = dequantise_row(&codes, &scales, 4);
        // 448 x (2 / 448): the block's amax, up to the scale's rounding.
        assert_eq!(back[1], 448.0 * scales[0]);
        assert!((back[1] - 2.0).abs() < 1e-6);
        assert!(back[2].is_nan());
        assert!((back[0] - 1.0).abs() < 1e-6 && (back[3] + 2.0).abs() < 1e-6);
    }

    #[test]
    fn dequantised_rows_stay_within_the_quantisation_error() {
        // Magnitudes over eight binades per block, so that normal and subnormal codes occur.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let row: Vec<bf16> = (0..1024)
            .map(|_| {
                let r = next();
                let m = (r >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                bf16::from_f32(m * 2f32.powi((r % 8) as i32 - 4))
            })
            .collect();
        for block in [128, 1024] {
            let (codes, scales) = quantise_row(&row, block);
            let back: Vec<bf16> = dequantise_row(&codes, &scales, block);
            let mut exact = 0;
            for (i, (x, y)) in row.iter().zip(&back).enumerate() {
                let (x, y) = (x.to_f32(), y.to_f32());
                let bound = quantisation_bound(x, scales[i / block], 7);
                assert!((x - y).abs() <= bound, "{i}: {x} -> {y}, bound {bound}");
                exact += usize::from(x == y);
            }
            // Quantisation loses bits: most elements change (the check above is not vacuous).
            assert!(exact < row.len() / 2, "{exact} of {} unchanged", row.len());
        }
    }

    #[test]
    fn the_bound_is_tight_enough_to_catch_a_wrong_scale() {
        // Dequantising with a scale twice too large fails the bound.
        let row: Vec<f32> = (1..=128).map(|i| i as f32 / 64.0).collect();
        let (codes, scales) = quantise_row(&row, 128);
        let wrong: Vec<f32> = dequantise_row(&codes, &[scales[0] * 2.0], 128);
        let bad = row
            .iter()
            .zip(&wrong)
            .filter(|(x, y)| (*x - *y).abs() > quantisation_bound(**x, scales[0], 23))
            .count();
        assert!(bad > 100, "{bad}");
    }
}
