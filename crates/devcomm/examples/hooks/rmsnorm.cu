// Residual add + RMSNorm, fused after an all-reduce (examples/all_reduce_rmsnorm.rs).
// For every row x of the reduced matrix: h = x + residual,
// y = h / sqrt(mean(h^2) + eps) * weight, written in place of x: what every rank receives.
//
// One warp runs a row, so its time is the round trips of its loads: each lane loads kBatch
// elements (32 apart) of every array before it stores any, instead of one after another (a
// store to `row` may alias the next load, so the compiler keeps a plain loop's loads in
// order). A lane still sums its squares in column order, so the result is the plain loop's.
struct RmsNormArgs {
  const float* residual;  // rows x cols, the same on every rank
  const float* weight;    // cols
  float eps;
};

struct RmsNorm {
  using T = float;
  static constexpr unsigned kBatch = 16;  // loads of each array a lane has in flight

  static __device__ void epilogue(const devcomm::red::RowCtx& c, float* row) {
    const RmsNormArgs& a = *static_cast<const RmsNormArgs*>(c.user);
    const float* res = a.residual + c.row * c.cols;
    float ss = 0.0f;
    for (unsigned long long base = c.lane; base < c.cols; base += 32 * kBatch) {
      float h[kBatch];
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + 32ull * k;
        h[k] = j < c.cols ? row[j] + res[j] : 0.0f;
      }
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + 32ull * k;
        if (j < c.cols) {
          row[j] = h[k];
          ss += h[k] * h[k];
        }
      }
    }
    const float scale = rsqrtf(devcomm::red::warp_sum(ss) / (float)c.cols + a.eps);
    for (unsigned long long base = c.lane; base < c.cols; base += 32 * kBatch) {
      float y[kBatch];
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + 32ull * k;
        y[k] = j < c.cols ? row[j] * scale * a.weight[j] : 0.0f;
      }
#pragma unroll
      for (unsigned k = 0; k < kBatch; ++k) {
        const unsigned long long j = base + 32ull * k;
        if (j < c.cols) row[j] = y[k];
      }
    }
  }
};
