// Each peer's chunk is a rows x cols matrix; the receiver gets it transposed (cols x rows).
// The wire carries the chunk in 8 x 8 blocks (devcomm/hooks.cuh, "The blocked wire order"):
// produce reads 4 floats of one input row per tile, and consume's lanes together write whole
// 32-byte sectors of the transposed output.
struct Transpose {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
    return devcomm::gather_blocked<float>(c, [&](dc_u64 r, dc_u64 k) { return r * c.cols + k; });
  }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    devcomm::scatter_blocked<float>(c, t, [&](dc_u64 r, dc_u64 k) { return k * c.rows + r; });
  }
};
