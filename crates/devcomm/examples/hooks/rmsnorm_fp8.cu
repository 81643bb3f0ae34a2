// All-reduce + residual add + RMSNorm + FP8 (e4m3) quantisation, fused after a bf16 all-reduce
// (examples/all_reduce_rmsnorm_fp8.rs). For every row x of the reduced matrix:
//   h = bf16(x + residual)             written to residual (the new residual) and kept in f32
//   r = 1 / sqrt(sum(h^2) / cols + eps)
//   y = bf16(h * r * weight)           left in place of x: what the all-reduce output receives
//   amax = max |y|, scale = amax / 448 (a zero row: 1), q = e4m3(y * min(448 / amax, FLT_MAX))
// with scale at scales[row] and q at fp8[row * cols ..]. Every float operation is an explicitly
// rounded intrinsic (no contraction, no fast rsqrt) and the sum of squares has a fixed shape
// (lane l of the row's kRowThreads sums columns l, l + lanes, ... with fma, then row_sum's
// fixed order: each warp's butterfly, then the warps in order), so the host reference
// (reference_row in all_reduce_rmsnorm_fp8.rs, given the same lanes) reproduces every bit.
//
// The residual, fp8 and scales are written on the rank whose hook runs on the row: with the
// staged two-shot that is the rank that reduced the row (its shard of rows), on the one-shots
// (on lines or zero-copy) every rank. Rows a rank's hook did not see keep what these buffers held.
struct RmsNormFp8Args {
  devcomm::red::BF16* residual;     // rows x cols: read, then overwritten with h
  const devcomm::red::BF16* weight; // cols
  unsigned char* fp8;               // rows x cols e4m3 codes
  float* scales;                    // rows: amax / 448, 1 for a row of zeros
  float eps;
};

// f32 -> e4m3 (OCP e4m3fn): round to nearest even, |x| past 448 and infinities saturate to
// +-448, NaN -> 0x7f: devcomm's encoder (the hardware's cvt on sm_89+, the same rounding in
// software before), whose host model is devcomm::moe::fp8::e4m3_from_f32.
#include "devcomm/fp8.cuh"

struct RmsNormFp8 {
  using T = devcomm::red::BF16;
  // A row runs on kRowThreads threads (4 warps; reduce.cuh, "Epilogue hooks"). Each lane
  // loads kBatch of its columns (c.lanes apart) of every array it reads before it stores any,
  // so that its loads are in flight together (a store to `row` or `residual` may alias the
  // next load, so a plain loop's loads stay one after another). The lane still visits its
  // columns in order, so every result is the plain loop's.
  static constexpr unsigned kRowThreads = 128;
  static constexpr unsigned kBatch = 16;

  static __device__ void epilogue(const devcomm::red::RowCtx& c, T* row) {
    using devcomm::red::from_float;
    using devcomm::red::to_float;
    const RmsNormFp8Args& a = *static_cast<const RmsNormFp8Args*>(c.user);
    T* res = a.residual + c.row * c.cols;
    const unsigned long long lanes = c.lanes;
    // Each lane reads back only its own columns, so no synchronisation between the passes.
    float ss = 0.0f;
    for (unsigned long long base = c.lane; base < c.cols; base += lanes * kBatch) {
      T h[kBatch];
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        h[k] = j < c.cols ? from_float<T>(__fadd_rn(to_float(row[j]), to_float(res[j])))
                          : from_float<T>(0.0f);
      }
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        if (j < c.cols) {
          res[j] = h[k];
          row[j] = h[k];
          const float hf = to_float(h[k]);
          ss = __fmaf_rn(hf, hf, ss);
        }
      }
    }
    // Every thread of the row's group calls row_sum and row_max once each.
    const float mean = __fdiv_rn(devcomm::red::row_sum(c, ss), (float)c.cols);
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.eps)));
    float amax = 0.0f;
    for (unsigned long long base = c.lane; base < c.cols; base += lanes * kBatch) {
      T y[kBatch];
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        y[k] = j < c.cols
                   ? from_float<T>(__fmul_rn(__fmul_rn(to_float(row[j]), r), to_float(a.weight[j])))
                   : from_float<T>(0.0f);
      }
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        if (j < c.cols) {
          row[j] = y[k];
          amax = fmaxf(amax, fabsf(to_float(y[k])));
        }
      }
    }
    amax = devcomm::red::row_max(c, amax);
    // A row of zeros: scale 1 (never 0, so dequantising needs no special case), codes +-0.
    const float scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    // 448 / amax overflows for a bf16 subnormal amax; FLT_MAX keeps 0 * inv = 0.
    const float inv = amax > 0.0f ? fminf(__fdiv_rn(448.0f, amax), 3.40282347e38f) : 1.0f;
    unsigned char* q = a.fp8 + c.row * c.cols;
    for (unsigned long long base = c.lane; base < c.cols; base += lanes * kBatch) {
      unsigned char b[kBatch];
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        b[k] = j < c.cols ? devcomm::fp8::e4m3_from_f32(__fmul_rn(to_float(row[j]), inv)) : 0;
      }
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        if (j < c.cols) q[j] = b[k];
      }
    }
    if (c.lane == 0) a.scales[c.row] = scale;
  }
};
