// Each peer's chunk is a rows x cols matrix; the receiver gets it transposed (cols x rows).
// produce gathers in transposed order, so the wire and the receiver's writes stay contiguous.
struct Transpose {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
    const float* m = static_cast<const float*>(c.in) + (c.index - c.pos);  // this peer's chunk
    unsigned r = (unsigned)(c.pos % c.rows), col = (unsigned)(c.pos / c.rows);
    devcomm::Tile<float> t;
    for (int k = 0; k < 4; ++k, r = (r + 1 == c.rows) ? 0 : r + 1, col += (r == 0))
      t.v[k] = (c.valid >> k & 1) ? m[(unsigned long long)r * c.cols + col] : 0.0f;
    return t;
  }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    devcomm::store_tile<float>(c, t);
  }
};
