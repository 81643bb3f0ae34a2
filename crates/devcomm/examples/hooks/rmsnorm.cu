// Residual add + RMSNorm, fused after an all-reduce (examples/all_reduce_rmsnorm.rs).
// For every row x of the reduced matrix: h = x + residual,
// y = h / sqrt(mean(h^2) + eps) * weight, written in place of x: what every rank receives.
struct RmsNormArgs {
  const float* residual;  // rows x cols, the same on every rank
  const float* weight;    // cols
  float eps;
};

struct RmsNorm {
  using T = float;
  static __device__ void epilogue(const devcomm::red::RowCtx& c, float* row) {
    const RmsNormArgs& a = *static_cast<const RmsNormArgs*>(c.user);
    const float* res = a.residual + c.row * c.cols;
    float ss = 0.0f;
    for (unsigned long long j = c.lane; j < c.cols; j += 32) {
      row[j] += res[j];
      ss += row[j] * row[j];
    }
    const float scale = rsqrtf(devcomm::red::warp_sum(ss) / (float)c.cols + a.eps);
    for (unsigned long long j = c.lane; j < c.cols; j += 32) row[j] = row[j] * scale * a.weight[j];
  }
};
