// An accumulate epilogue for a reduce-scatter (gradient accumulation): every row of this rank's
// reduced shard is added to what the output held before the call, `out += reduce_scatter(in)`.
// It declares no kRowThreads, so a warp runs a row; striding by c.lanes keeps it right at any
// width.
struct Accumulate {
  using T = float;
  static __device__ void epilogue(const devcomm::red::RowCtx& c, float* row) {
    const float* before = static_cast<const float*>(c.dest);
    for (unsigned long long j = c.lane; j < c.cols; j += c.lanes) row[j] += before[j];
  }
};
