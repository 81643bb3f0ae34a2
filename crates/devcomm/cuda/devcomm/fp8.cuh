// devcomm/fp8.cuh: FP8 (OCP e4m3fn: bias 7, no infinities, 0x7f / 0xff NaN) conversions that a
// host model reproduces bit for bit (`devcomm::moe::fp8` in Rust). Used by the MoE dispatch's
// FP8 wire (kernels/moe.cu) and by user hooks (examples/hooks/rmsnorm_fp8.cu).
//
//   e4m3_from_f32   f32 -> e4m3: round to nearest, ties to even; finite values past 448 and
//                   infinities saturate to +-448 (0x7e / 0xfe); NaN -> 0x7f
//   e4m3_to_f32     e4m3 -> f32, exact; 0x7f and 0xff -> NaN
//
// On sm_89 and later the encoder is the hardware's `cvt.rn.satfinite.e4m3x2.f32`; before, the
// same rounding in software. Needs no other header.
#pragma once

namespace devcomm {
namespace fp8 {

#if defined(__CUDACC__)

// f32 -> e4m3 code (see above).
__device__ __forceinline__ unsigned char e4m3_from_f32(float x) {
#if __CUDA_ARCH__ >= 890
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
  return (unsigned char)(pair & 0xff);
#else
  const unsigned sign = (__float_as_uint(x) >> 24) & 0x80u;
  const float a = fabsf(x);
  if (a != a) return 0x7f;
  if (a >= 464.0f) return (unsigned char)(sign | 0x7eu);  // 464 ties to 448, more saturates
  int e = (int)(__float_as_uint(a) >> 23) - 127;           // a's binade (a < 2^-6: subnormal step)
  if (e < -6) e = -6;
  // a in units of the e4m3 step 2^(e-3) (a power of two: exact), rounded to nearest even.
  const float n = rintf(__fmul_rn(a, __uint_as_float((unsigned)(127 + 3 - e) << 23)));
  return (unsigned char)(sign | (unsigned)(((e + 6) << 3) + (int)n));
#endif
}

// e4m3 code -> f32, exact: a normal code is its f32 with the exponent rebiased (7 -> 127), a
// subnormal one m x 2^-9.
__device__ __forceinline__ float e4m3_to_f32(unsigned char c) {
  const unsigned sign = (unsigned)(c & 0x80u) << 24;
  const unsigned e = (c >> 3) & 0xfu, m = c & 7u;
  if (e == 15 && m == 7) return __uint_as_float(0x7fc00000u | sign);
  if (e == 0) return __uint_as_float(sign | __float_as_uint(__fmul_rn((float)m, 1.0f / 512.0f)));
  return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

#endif  // __CUDACC__

}  // namespace fp8
}  // namespace devcomm
