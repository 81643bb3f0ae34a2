// Residual add + RMSNorm, fused after an all-reduce (examples/all_reduce_rmsnorm.rs).
// For every row x of the reduced matrix: h = x + residual; residual = h;
// y = h / sqrt(mean(h^2) + eps) * weight, written in place of x (what every rank receives).
struct RmsNormArgs {
  float* residual;       // rows x cols, updated in place (the next layer's residual)
  const float* weight;   // cols
  float eps;
};

struct RmsNorm {
  using T = float;
  static __device__ void epilogue(const devcomm::red::RowCtx& c, float* row) {
    const RmsNormArgs& a = *static_cast<const RmsNormArgs*>(c.user);
    float* res = a.residual + c.row * c.cols;
    float ss = 0.0f;
    for (unsigned long long j = c.lane; j < c.cols; j += 32) {
      const float h = row[j] + res[j];
      res[j] = h;
      ss += h * h;
    }
    const float scale = rsqrtf(devcomm::red::warp_sum(ss) / (float)c.cols + a.eps);
    for (unsigned long long j = c.lane; j < c.cols; j += 32) row[j] = res[j] * scale * a.weight[j];
  }
};
