// Residual add + RMSNorm, fused after an all-reduce (examples/all_reduce_rmsnorm.rs).
// For every row x of the reduced matrix: h = x + residual,
// y = h * (1 / sqrt(sum(h^2) / cols + eps)) * weight, written in place of x: what every rank
// receives.
//
// A row runs on kRowThreads threads (4 warps), so that a row's loads are spread over more
// threads than one warp's. Each lane loads kBatch of its columns (c.lanes apart) of every array
// before it stores any, instead of one after another (a store to `row` may alias the next load,
// so the compiler keeps a plain loop's loads in order). Lane l still sums the squares of its
// columns l, l + lanes, ... in column order with fma, and row_sum adds the lanes in its fixed
// order; every operation is explicitly rounded (no contraction, no fast rsqrt), so the host
// reference (reference_row in all_reduce_rmsnorm.rs) reproduces every bit.
struct RmsNormArgs {
  const float* residual;  // rows x cols, the same on every rank
  const float* weight;    // cols
  float eps;
};

struct RmsNorm {
  using T = float;
  static constexpr unsigned kRowThreads = 128;  // threads a row (reduce.cuh, "Epilogue hooks")
  static constexpr unsigned kBatch = 16;        // loads of each array a lane has in flight

  static __device__ void epilogue(const devcomm::red::RowCtx& c, float* row) {
    const RmsNormArgs& a = *static_cast<const RmsNormArgs*>(c.user);
    const float* res = a.residual + c.row * c.cols;
    const unsigned long long lanes = c.lanes;
    float ss = 0.0f;
    for (unsigned long long base = c.lane; base < c.cols; base += lanes * kBatch) {
      float h[kBatch];
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        h[k] = j < c.cols ? __fadd_rn(row[j], res[j]) : 0.0f;
      }
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        if (j < c.cols) {
          row[j] = h[k];
          ss = __fmaf_rn(h[k], h[k], ss);
        }
      }
    }
    // Every thread of the row's group calls row_sum once.
    const float mean = __fdiv_rn(devcomm::red::row_sum(c, ss), (float)c.cols);
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.eps)));
    // Each lane reads back only its own columns: no synchronisation between the passes.
    for (unsigned long long base = c.lane; base < c.cols; base += lanes * kBatch) {
      float y[kBatch];
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        y[k] = j < c.cols ? __fmul_rn(__fmul_rn(row[j], scale), a.weight[j]) : 0.0f;
      }
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + lanes * k;
        if (j < c.cols) row[j] = y[k];
      }
    }
  }
};
