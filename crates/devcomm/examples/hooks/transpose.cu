// Each peer's chunk is a rows x cols matrix; the receiver stores it transposed (cols x rows).
struct Transpose {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
    return devcomm::load_tile<float>(c);
  }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    float* chunk = static_cast<float*>(c.out) + (c.index - c.pos);
    for (int k = 0; k < 4; ++k)
      if (c.valid >> k & 1) chunk[(c.pos + k) % c.cols * c.rows + (c.pos + k) / c.cols] = t.v[k];
  }
};
