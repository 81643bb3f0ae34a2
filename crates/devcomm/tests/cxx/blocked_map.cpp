// The blocked wire order of devcomm/hooks.cuh, compiled as plain host C++ (tests/blocked.rs).
//
// For every shape below and every position p of it: blocked_cursor(p) is an element inside
// the chunk that no other position maps to (so the map is a bijection onto the chunk), it is
// the element the forward formula of the order (written out again here) puts at p,
// blocked_position maps it back to p, the cursor's block fields agree with it, and stepping a
// cursor with next() from position 0 visits the same cursors. Shapes too large to walk are
// sampled, through the 64-bit path. Finally, for f32 matrices of whole blocks, the 32 lanes of a
// warp (32 consecutive tiles) touch whole 32-byte sectors: 16 per 16-byte load of a row-major
// input, 4 per element store into its transpose.
#include <cstdio>
#include <set>
#include <vector>

#include "devcomm/hooks.cuh"

using devcomm::BlockedCursor;


static dc_u64 min8(dc_u64 a) { return a < 8 ? a : 8; }

// The forward formula, independent of the header: block row bi occupies
// [bi * 8 * cols, bi * 8 * cols + h * cols); block bj of it starts at bi * 8 * cols + h * 8 * bj;
// element (i, j) of the block lies at start + i * w + j.
static dc_u64 forward(dc_u64 r, dc_u64 c, dc_u64 rows, dc_u64 cols) {
  const dc_u64 bi = r / 8, bj = c / 8, i = r % 8, j = c % 8;
  const dc_u64 h = min8(rows - 8 * bi), w = min8(cols - 8 * bj);
  return bi * 8 * cols + h * 8 * bj + i * w + j;
}

static bool same(const BlockedCursor& a, const BlockedCursor& b) {
  return a.row == b.row && a.col == b.col && a.rows == b.rows && a.cols == b.cols &&
         a.i == b.i && a.j == b.j && a.h == b.h && a.w == b.w;
}

// The cursor at p is (row, col) with its block fields consistent.
static void check_cursor(const BlockedCursor& k, dc_u64 p, dc_u64 rows, dc_u64 cols) {
  CHECK(k.row < rows && k.col < cols, "%llux%llu p=%llu -> (%llu, %llu) outside",
        (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)p,
        (unsigned long long)k.row, (unsigned long long)k.col);
  CHECK(k.rows == rows && k.cols == cols, "shape");
  CHECK(k.i == k.row % 8 && k.j == k.col % 8, "%llux%llu p=%llu: i=%u j=%u",
        (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)p, k.i, k.j);
  CHECK(k.h == min8(rows - (k.row - k.i)) && k.w == min8(cols - (k.col - k.j)),
        "%llux%llu p=%llu: h=%u w=%u", (unsigned long long)rows, (unsigned long long)cols,
        (unsigned long long)p, k.h, k.w);
  CHECK(forward(k.row, k.col, rows, cols) == p, "%llux%llu p=%llu: forward gives %llu",
        (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)p,
        (unsigned long long)forward(k.row, k.col, rows, cols));
  CHECK(devcomm::blocked_position(k.row, k.col, rows, cols) == p, "%llux%llu p=%llu: inverse",
        (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)p);
}

// Every position of a rows x cols chunk.
static void walk(dc_u64 rows, dc_u64 cols) {
  const dc_u64 n = rows * cols;
  std::vector<unsigned char> seen(n, 0);
  BlockedCursor step = devcomm::blocked_cursor(0, rows, cols);
  for (dc_u64 p = 0; p < n; ++p) {
    const BlockedCursor k = devcomm::blocked_cursor(p, rows, cols);
    check_cursor(k, p, rows, cols);
    if (k.row < rows && k.col < cols) {
      CHECK(!seen[k.row * cols + k.col], "%llux%llu: (%llu, %llu) twice",
            (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)k.row,
            (unsigned long long)k.col);
      seen[k.row * cols + k.col] = 1;
    }
    // The 64-bit path gives the same answer as the 32-bit one used here.
    CHECK(same(k, devcomm::detail::blocked_cursor_in<dc_u64>(p, rows, cols)), "64-bit p=%llu",
          (unsigned long long)p);
    CHECK(same(k, step), "%llux%llu: next() reached p=%llu as (%llu, %llu), not (%llu, %llu)",
          (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)p,
          (unsigned long long)step.row, (unsigned long long)step.col,
          (unsigned long long)k.row, (unsigned long long)k.col);
    step.next();
  }
  // n positions, n distinct elements inside the chunk: a bijection.
  for (dc_u64 e = 0; e < n; ++e) {
    CHECK(seen[e], "element %llu never reached", (unsigned long long)e);
  }
}

// Positions of a shape too large to walk: both ends, every block-row boundary nearby, and a
// spread of others.
static void sample(dc_u64 rows, dc_u64 cols) {
  const dc_u64 n = rows * cols;
  std::vector<dc_u64> ps;
  for (dc_u64 p = 0; p < 5000 && p < n; ++p) ps.push_back(p);
  for (dc_u64 p = n > 5000 ? n - 5000 : 0; p < n; ++p) ps.push_back(p);
  for (dc_u64 k = 1; k < 4000; ++k) ps.push_back(n / 4000 * k + k * 7919 % 997);
  for (dc_u64 b = 1; b < 5; ++b) {
    const dc_u64 edge = b * 8 * cols;
    for (dc_u64 p = edge > 100 ? edge - 100 : 0; p < edge + 100 && p < n; ++p) ps.push_back(p);
  }
  for (dc_u64 p : ps) {
    if (p >= n) continue;
    const BlockedCursor k = devcomm::blocked_cursor(p, rows, cols);
    check_cursor(k, p, rows, cols);
    if (p + 1 < n) {
      BlockedCursor s = k;
      s.next();
      CHECK(same(s, devcomm::blocked_cursor(p + 1, rows, cols)), "%llux%llu next() after p=%llu",
            (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)p);
    }
  }
}

// f32, 32 consecutive tiles per warp starting at a multiple of 32: sectors of one warp-wide
// 16-byte load (gather) and of each of the 4 element stores (scatter into the transpose).
static void sectors(dc_u64 rows, dc_u64 cols) {
  const dc_u64 tiles = rows * cols / 4;
  for (dc_u64 w0 = 0; w0 < tiles; w0 += 32) {
    std::set<dc_u64> load, store[4];
    for (dc_u64 t = w0; t < w0 + 32; ++t) {
      BlockedCursor k = devcomm::blocked_cursor(4 * t, rows, cols);
      CHECK(k.j % 4 == 0 && k.w == 8, "tile %llu not 4 elements of one block row",
            (unsigned long long)t);
      load.insert((k.row * cols + k.col) * 4 / 32);
      for (int e = 0; e < 4; ++e) {
        store[e].insert(((k.col + e) * rows + k.row) * 4 / 32);
      }
    }
    CHECK(load.size() == 16, "%llux%llu warp %llu: the load touches %zu sectors",
          (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)(w0 / 32),
          load.size());
    for (int e = 0; e < 4; ++e) {
      CHECK(store[e].size() == 4, "%llux%llu warp %llu: store %d touches %zu sectors",
            (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)(w0 / 32), e,
            store[e].size());
    }
  }
}

int main() {
  const dc_u64 shapes[][2] = {
      {1, 1},  {1, 9},   {9, 1},   {7, 13},  {8, 8},     {16, 24},   {300, 129}, {2048, 2048},
      {33, 1000}, {1000, 33}, {8, 1}, {1, 8}, {2, 3},  {17, 17},  {64, 7},    {5, 64},
      {9, 9},  {15, 16},  {16, 15}, {8, 100}, {100, 8},  {1, 4097}, {4097, 1},  {63, 65}};
  for (const auto& s : shapes) walk(s[0], s[1]);
  // The 64-bit path: rows * cols >= 2^32, or only the chunk rounded up to whole blocks.
  const dc_u64 big[][2] = {{70000, 70001}, {1, (1ull << 31) + 1}, {(1ull << 31) + 1, 1},
                           {3, 1ull << 31},  {65537, 65536},      {9, 600000001}};
  for (const auto& s : big) sample(s[0], s[1]);
  sectors(8, 8 * 32);
  sectors(64, 64);
  sectors(2048, 2048);
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
