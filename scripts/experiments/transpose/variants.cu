// Variants of the transpose hooks for timing (README.md). Rows of c.cols floats.
namespace tx {
__device__ __forceinline__ devcomm::Tile<float> read_t(const devcomm::Ctx& c) {
  return devcomm::gather_blocked<float>(c, [&](dc_u64 r, dc_u64 k) { return r * c.cols + k; });
}
__device__ __forceinline__ void write_t(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
  devcomm::scatter_blocked<float>(c, t, [&](dc_u64 r, dc_u64 k) { return k * c.rows + r; });
}
__device__ __forceinline__ void write_rowmajor(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
  devcomm::scatter_blocked<float>(c, t, [&](dc_u64 r, dc_u64 k) { return r * c.cols + k; });
}
}  // namespace tx

// The transpose on the wire to peers; the own chunk copied plainly.
struct TPeers {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
    return c.peer == c.rank ? devcomm::load_tile<float>(c) : tx::read_t(c);
  }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    if (c.peer == c.rank) devcomm::store_tile<float>(c, t); else tx::write_t(c, t);
  }
};

// The transpose on the own chunk only.
struct TSelf {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
    return c.peer != c.rank ? devcomm::load_tile<float>(c) : tx::read_t(c);
  }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    if (c.peer != c.rank) devcomm::store_tile<float>(c, t); else tx::write_t(c, t);
  }
};

// The blocked gather in produce, a plain store in consume.
struct ReadBlocked {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) { return tx::read_t(c); }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    devcomm::store_tile<float>(c, t);
  }
};

// A plain load in produce, the transposing scatter in consume.
struct WriteBlocked {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
    return devcomm::load_tile<float>(c);
  }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    tx::write_t(c, t);
  }
};

// The blocked order on both sides with row-major indices: the cursor arithmetic and 16-byte
// accesses, no scattered stores.
struct BlockedVec {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) { return tx::read_t(c); }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    tx::write_rowmajor(c, t);
  }
};

// The transpose as the example had it (until 2026-11-22): the wire in the blocked order of the input,
// produce reads 16-byte row pieces, consume scatters 4 element stores per tile.
struct TRecv {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) { return tx::read_t(c); }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    tx::write_t(c, t);
  }
};

// The transpose done by the sender: the wire in the blocked order of the transposed output
// (cols x rows), produce gathers 4 elements of an input column per tile, consume stores 16
// bytes of an output row.
namespace tx {
__device__ __forceinline__ devcomm::Ctx swapped(devcomm::Ctx c) {
  const dc_u64 r = c.rows;
  c.rows = c.cols;
  c.cols = r;
  return c;
}
}  // namespace tx
struct TSend {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
    return devcomm::gather_blocked<float>(tx::swapped(c),
                                          [&](dc_u64 r, dc_u64 k) { return k * c.cols + r; });
  }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    devcomm::scatter_blocked<float>(tx::swapped(c), t,
                                    [&](dc_u64 r, dc_u64 k) { return r * c.rows + k; });
  }
};
