//! The software e4m3 conversions of `cuda/devcomm/fp8.cuh` (what GPUs before sm_89 run, and
//! the same rounding as the hardware's `cvt.rn.satfinite.e4m3x2.f32`), compiled for the host
//! with stand-ins for the CUDA built-ins, against the host model `devcomm::moe::fp8` that the
//! MoE reference uses: every code decoded, and the encoder on every midpoint between codes
//! and its neighbours, the edges (saturation, infinities, NaN, subnormals) and 200,000 random
//! f32 patterns. Needs `c++` (or `$CXX`) on PATH.

#[allow(dead_code)] // run_ok, assert_layout: other tests'
#[path = "common/cxx.rs"]
mod cxx;

use cxx::{compile_cpp, scratch_dir};
use devcomm::moe::fp8::{e4m3_from_f32, e4m3_to_f32};
use std::process::Command;

/// Reads f32 bit patterns (little-endian u32) from argv[1]; writes one code per input, then
/// the 256 codes decoded (u32 bits), to argv[2].
const PROGRAM: &str = r#"
#define __CUDACC__ 1
#define __device__
#define __forceinline__ inline
#include <math.h>
#include <cstdio>
#include <cstring>
#include <vector>
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
#include "devcomm/fp8.cuh"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = std::fopen(argv[1], "rb");
  std::vector<unsigned> bits;
  unsigned b;
  while (std::fread(&b, 4, 1, in) == 1) bits.push_back(b);
  std::fclose(in);
  FILE* out = std::fopen(argv[2], "wb");
  for (unsigned x : bits) {
    const unsigned char c = devcomm::fp8::e4m3_from_f32(__uint_as_float(x));
    std::fwrite(&c, 1, 1, out);
  }
  for (unsigned c = 0; c < 256; ++c) {
    const unsigned v = __float_as_uint(devcomm::fp8::e4m3_to_f32((unsigned char)c));
    std::fwrite(&v, 4, 1, out);
  }
  std::fclose(out);
  return 0;
}
"#;

fn inputs() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        448.0,
        -448.0,
        449.0,
        463.99,
        464.0,
        464.01,
        480.0,
        1e30,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        2f32.powi(-6),
        2f32.powi(-9),
        2f32.powi(-10),
        2f32.powi(-11),
        3.0 * 2f32.powi(-11),
    ];
    for c in 0u8..0x7e {
        let (a, b) = (e4m3_to_f32(c), e4m3_to_f32(c + 1));
        let mid = (a + b) / 2.0;
        for x in [
            a,
            mid,
            f32::from_bits(mid.to_bits() - 1),
            f32::from_bits(mid.to_bits() + 1),
        ] {
            v.extend([x, -x]);
        }
    }
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..200_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // Exponents around e4m3's range (2^-12 .. 2^10) half of the time, any pattern else.
        let r = state as u32;
        let x = if state >> 63 == 0 {
            f32::from_bits((r & 0x807f_ffff) | ((115 + (r >> 23) % 22) << 23))
        } else {
            f32::from_bits(r)
        };
        v.push(x);
    }
    v
}

#[test]
fn the_device_software_e4m3_equals_the_host_model() {
    let dir = scratch_dir("fp8-host");
    let Some(binary) = compile_cpp(&dir, "fp8_host", PROGRAM, &["-O1", "-Wall", "-Werror"]) else {
        return;
    };
    let xs = inputs();
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
    std::fs::write(&input, bytes).unwrap();
    let run = Command::new(&binary)
        .arg(&input)
        .arg(&output)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let got = std::fs::read(&output).unwrap();
    assert_eq!(got.len(), xs.len() + 256 * 4);
    for (x, &code) in xs.iter().zip(&got) {
        assert_eq!(code, e4m3_from_f32(*x), "{x:e} ({:#010x})", x.to_bits());
    }
    for c in 0..256usize {
        let at = xs.len() + 4 * c;
        let bits = u32::from_le_bytes(got[at..at + 4].try_into().unwrap());
        let want = e4m3_to_f32(c as u8);
        let dev = f32::from_bits(bits);
        assert!(
            dev.to_bits() == want.to_bits() || (dev.is_nan() && want.is_nan()),
            "code {c:#04x}: {dev:e}, host {want:e}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
