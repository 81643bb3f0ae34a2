// The second half of the host simulation of blocked_hooks.cpp (after the example's hooks).

// failures and CHECK: cxx/check.hpp, at the front of the program.

// Element values: distinct for 4-byte and larger types, exact in f32.
template <class T>
static T value(dc_u64 i) {
  T v;
  std::memset(&v, 0, sizeof v);
  if constexpr (sizeof(T) == 4) {
    const float f = (float)(i % 16000000 + 1);
    std::memcpy(&v, &f, 4);
  } else {
    dc_u64 h = (i + 1) * 0x9E3779B97F4A7C15ull;
    std::memcpy(&v, &h, sizeof(T) < 8 ? sizeof(T) : 8);
    if (sizeof(T) > 8) std::memcpy(reinterpret_cast<char*>(&v) + 8, &i, 8);
  }
  return v;
}

template <class T>
static bool equal(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

struct Shape {
  dc_u64 rows, cols;
};

// Moves `world` chunks of rows x cols elements, packed after `lead` elements of padding, from
// `in` through H's produce and consume into `out` (chunk p at the same place in both).
template <class H>
static void move_chunks(const typename H::In* in, typename H::Out* out, Shape s, int world,
                        dc_u64 lead) {
  using W = typename H::Wire;
  constexpr dc_u64 kE = Tile<W>::kElems;
  const dc_u64 n = s.rows * s.cols, tiles = (n + kE - 1) / kE;
  for (int p = 0; p < world; ++p) {
    const dc_u64 e0 = lead + (dc_u64)p * n;
    std::vector<Tile<W>> wire(tiles);
    for (int side = 0; side < 2; ++side) {
      for (dc_u64 k = 0; k < tiles; ++k) {
        Ctx c{};
        c.in = side == 0 ? in : nullptr;
        c.out = side == 0 ? nullptr : out;
        c.pos = k * kE;
        c.index = e0 + c.pos;
        c.rows = s.rows;
        c.cols = s.cols;
        c.peer = p;
        c.world_size = world;
        const dc_u64 rem = n - c.pos;
        c.valid = rem >= kE ? (dc_u32)((1ull << kE) - 1) : (dc_u32)((1ull << rem) - 1);
        if (side == 0) {
          wire[k] = H::produce(c);
        } else {
          H::consume(c, wire[k]);
        }
      }
    }
  }
}

// The example: each chunk lands transposed, nothing else is written; with want_loads >= 0, the
// hooks made that many 16-byte accesses.
static void transpose_example(Shape s, int world, dc_u64 lead, long want_loads) {
  const dc_u64 n = s.rows * s.cols, total = lead + world * n + 8;
  std::vector<float> in(total), out(total);
  for (dc_u64 i = 0; i < total; ++i) in[i] = value<float>(i);
  const float sentinel = -1.0f;
  for (auto& x : out) x = sentinel;
  vector_ops = 0;
  move_chunks<Transpose>(in.data(), out.data(), s, world, lead);
  for (int p = 0; p < world; ++p) {
    const dc_u64 e0 = lead + p * n;
    for (dc_u64 r = 0; r < s.rows; ++r)
      for (dc_u64 c = 0; c < s.cols; ++c)
        CHECK(equal(out[e0 + c * s.rows + r], in[e0 + r * s.cols + c]),
              "%llux%llu peer %d: (%llu, %llu) landed wrong", (unsigned long long)s.rows,
              (unsigned long long)s.cols, p, (unsigned long long)r, (unsigned long long)c);
  }
  for (dc_u64 i = 0; i < lead; ++i) CHECK(equal(out[i], sentinel), "written before the chunks");
  for (dc_u64 i = lead + world * n; i < total; ++i)
    CHECK(equal(out[i], sentinel), "written after the chunks");
  if (want_loads >= 0) {
    // produce: one 16-byte load per tile; consume: element stores (a transposed tile is not
    // contiguous in the output). move_chunks copies tiles as structs of T, not through uint4.
    CHECK(vector_ops == want_loads, "%llux%llu: %ld 16-byte accesses, want %ld",
          (unsigned long long)s.rows, (unsigned long long)s.cols, vector_ops, want_loads);
  }
}

// Hooks over T that record every element they touch. OUT_T: consume writes the transpose
// (index col * rows + row), else the identity (row * cols + col).
static std::vector<int> reads, writes;  // per element of the buffers

template <class T, bool OUT_T>
struct Probe {
  using In = T;
  using Out = T;
  using Wire = T;
  static Tile<T> produce(const Ctx& c) {
    const dc_u64 e0 = c.index - c.pos;
    return devcomm::gather_blocked<T>(c, [&](dc_u64 r, dc_u64 k) {
      CHECK(r < c.rows && k < c.cols, "gather (%llu, %llu) outside", (unsigned long long)r,
            (unsigned long long)k);
      ++reads[e0 + r * c.cols + k];
      return r * c.cols + k;
    });
  }
  static void consume(const Ctx& c, const Tile<T>& t) {
    const dc_u64 e0 = c.index - c.pos;
    devcomm::scatter_blocked<T>(c, t, [&](dc_u64 r, dc_u64 k) {
      CHECK(r < c.rows && k < c.cols, "scatter (%llu, %llu) outside", (unsigned long long)r,
            (unsigned long long)k);
      const dc_u64 i = OUT_T ? k * c.rows + r : r * c.cols + k;
      ++writes[e0 + i];
      return i;
    });
  }
};

// The index functions are called more than once per element on the fast path (the contiguity
// check), so the probe's counts are calls: every element of the chunks is asked for, nothing
// outside them is. The values are checked exactly.
template <class T, bool OUT_T>
static void probe(Shape s, int world, dc_u64 lead) {
  const dc_u64 n = s.rows * s.cols, total = lead + world * n + 16;
  std::vector<T> in(total), out(total);
  for (dc_u64 i = 0; i < total; ++i) in[i] = value<T>(i);
  T sentinel;
  std::memset(&sentinel, 0xA5, sizeof sentinel);
  for (auto& x : out) x = sentinel;
  reads.assign(total, 0);
  writes.assign(total, 0);
  move_chunks<Probe<T, OUT_T>>(in.data(), out.data(), s, world, lead);
  for (int p = 0; p < world; ++p) {
    const dc_u64 e0 = lead + p * n;
    for (dc_u64 r = 0; r < s.rows; ++r)
      for (dc_u64 c = 0; c < s.cols; ++c) {
        const dc_u64 o = e0 + (OUT_T ? c * s.rows + r : r * s.cols + c);
        CHECK(equal(out[o], in[e0 + r * s.cols + c]),
              "T=%zu out_t=%d %llux%llu lead %llu: (%llu, %llu) landed wrong", sizeof(T),
              (int)OUT_T, (unsigned long long)s.rows, (unsigned long long)s.cols,
              (unsigned long long)lead, (unsigned long long)r, (unsigned long long)c);
      }
  }
  for (dc_u64 i = 0; i < total; ++i) {
    const bool inside = i >= lead && i < lead + world * n;
    CHECK(inside ? reads[i] > 0 && writes[i] > 0 : reads[i] == 0 && writes[i] == 0,
          "T=%zu %llux%llu: element %llu read %d, written %d times", sizeof(T),
          (unsigned long long)s.rows, (unsigned long long)s.cols, (unsigned long long)i,
          reads[i], writes[i]);
    if (!inside) {
      CHECK(equal(out[i], sentinel), "element %llu outside written", (unsigned long long)i);
    }
  }
}

struct alignas(16) Sixteen {
  dc_u64 a, b;
};

template <class T>
static void probe_all(const std::vector<Shape>& shapes) {
  constexpr dc_u64 kE = 16 / sizeof(T);
  for (const Shape& s : shapes) {
    for (dc_u64 lead : {kE, (dc_u64)1, kE + 3}) {  // aligned chunks and misaligned ones
      probe<T, true>(s, 3, lead);
      probe<T, false>(s, 3, lead);
    }
  }
}

int main() {
  const std::vector<Shape> shapes = {{1, 1},  {1, 9},   {9, 1},  {7, 13},  {8, 8},  {16, 24},
                                     {300, 129}, {33, 100}, {17, 64}, {64, 17}, {2, 3}, {24, 8}};
  // The example on the shapes of its GPU check (300 x 129) and of the benchmark (2048 x 2048).
  transpose_example({300, 129}, 4, 0, -1);
  transpose_example({300, 129}, 3, 1, -1);  // chunks not 16-byte aligned
  for (const Shape& s : shapes) transpose_example(s, 3, 4, -1);
  transpose_example({2048, 2048}, 2, 0, 2 * 2048 * 2048 / 4);
  transpose_example({64, 96}, 3, 4, 3 * 64 * 96 / 4);
  transpose_example({61, 96}, 3, 4, 3 * 61 * 96 / 4);  // partial block rows: still row tiles
  // The helpers for every element size, into the transpose and the identity.
  probe_all<unsigned char>(shapes);
  probe_all<unsigned short>(shapes);
  probe_all<float>(shapes);
  probe_all<dc_u64>(shapes);
  probe_all<Sixteen>(shapes);
  // Identity both ways with whole aligned tiles: one 16-byte load and one store per tile for
  // every element size but 1 byte (whose tiles span two rows of a block: loads per element).
  vector_ops = 0;
  probe<float, false>({64, 96}, 2, 4);
  CHECK(vector_ops == 2 * 2 * 64 * 96 / 4, "f32 identity: %ld 16-byte accesses", vector_ops);
  vector_ops = 0;
  probe<unsigned short, false>({64, 96}, 2, 8);
  CHECK(vector_ops == 2 * 2 * 64 * 96 / 8, "u16 identity: %ld 16-byte accesses", vector_ops);
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
