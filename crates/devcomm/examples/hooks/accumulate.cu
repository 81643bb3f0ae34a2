// An accumulate epilogue for a reduce-scatter (gradient accumulation): every row of this rank's
// reduced shard is added to what the output held before the call, `out += reduce_scatter(in)`.
struct Accumulate {
  using T = float;
  static __device__ void epilogue(const devcomm::red::RowCtx& c, float* row) {
    const float* before = static_cast<const float*>(c.dest);
    for (unsigned long long j = c.lane; j < c.cols; j += 32) row[j] += before[j];
  }
};
