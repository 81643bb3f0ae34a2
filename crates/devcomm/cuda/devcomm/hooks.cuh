// devcomm/hooks.cuh: what a user hook sees (docs/COLLECTIVES.md).
//
// A collective moves each peer's chunk as 16-byte *tiles* of the hook's wire type. The sender
// calls `produce(ctx)` for every tile of the chunk it sends (it reads the input and returns the
// tile that crosses NVLink); the receiver calls `consume(ctx, tile)` for every tile it receives
// (it writes, or accumulates into, the output). The framework owns everything else: schedule,
// staging, signals, waits, peers' addresses. A hooks type is a struct:
//
//   struct MyHooks {
//     using In = float;     // element of the send buffer
//     using Out = float;    // element of the receive buffer
//     using Wire = float;   // element on the wire; a tile holds 16 / sizeof(Wire) of them
//     static __device__ devcomm::Tile<Wire> produce(const devcomm::Ctx& c);
//     static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<Wire>& t);
//   };
//
// Tile k of a chunk carries the chunk's *wire positions* [k * E, k * E + E), E = 16 /
// sizeof(Wire); at the chunk's end `valid` says which of them exist (always a prefix of the
// tile). Hooks must not touch elements outside `valid` (the framework writes nothing there
// either). Which element a wire position stands for is the hooks' choice: produce and consume
// only have to agree on a bijection between the positions [0, rows * cols) and the chunk's
// elements. The plain one is the identity (position p = element p of the chunk, as `index`
// gives it: load_tile / store_tile / CopyHooks). The blocked order below walks the chunk in
// 8 x 8 blocks, so that hooks that permute a matrix (a transpose) read and write whole sectors
// on both sides (gather_blocked / scatter_blocked).
#pragma once

#include "devcomm/handles.cuh"

namespace devcomm {

// The one context every hook gets. New fields are appended, never reordered.
struct Ctx {
  const void* in;     // this rank's whole send buffer (produce); null in consume
  void* out;          // this rank's whole receive buffer (consume); null in produce
  const void* user;   // the user arguments passed from Rust (device memory), or null
  dc_u64 index;       // flat index in `in` (produce) / `out` (consume) of the tile's 1st element
                      // in the identity order; index - pos is the chunk's first element
  dc_u64 pos;         // the tile's first wire position: its element's index inside this peer's
                      // chunk in the identity order
  dc_u64 rows;        // the chunk's shape: rows x cols elements (cols = row length)
  dc_u64 cols;
  dc_i32 peer;        // the rank the chunk goes to (produce) / comes from (consume)
  dc_i32 rank;        // this rank
  dc_i32 world_size;
  dc_u32 valid;       // bit k set: wire position pos + k lies inside the chunk (< rows * cols)
};

// 16 bytes of wire elements.
template <class W>
struct alignas(16) Tile {
  static constexpr int kElems = (int)(16 / sizeof(W));
  W v[kElems];
};

// Out of line on the device (the host compiler of the tests knows no __noinline__).
#if defined(__CUDACC_RTC__) || defined(__NVCC__)
#define DC_NOINLINE __noinline__
#else
#define DC_NOINLINE
#endif

// ---- The blocked wire order ----------------------------------------------------------------
//
// For hooks that permute a rows x cols chunk (row-major, cols = row length). The wire walks
// the chunk's grid of ceil(rows / 8) x ceil(cols / 8) blocks of 8 x 8 elements in row-major
// order, and each block's elements row-major; edge blocks are partial (height
// h = min(8, rows - 8 bi), width w = min(8, cols - 8 bj)). Positions are dense: block row bi
// holds positions [8 bi cols, 8 bi cols + h cols); its block bj starts at 8 bi cols + 8 h bj,
// and element (i, j) of the block, i.e. (row, col) = (8 bi + i, 8 bj + j), is at
// start + i w + j.
//
// With 4-byte elements and whole blocks, a tile is 4 consecutive elements of one row (one
// 16-byte load from a row-major input) and 16 consecutive tiles (lanes) are one block, so for
// each element of their tiles the 8 lanes that hold the same 4 columns of the block's 8 rows
// write 8 consecutive elements of a column-major (transposed) output: a whole 32-byte sector.
// With 8- and 2-byte elements a tile is 2 elements or a whole row of a block (one load too);
// with 1-byte elements it spans two rows of a block and is read element by element.
constexpr dc_u32 kBlockedSide = 8;

// A place in the blocked order: the element (row, col) of the chunk, where it lies in its
// block (i, j) and the block's shape (h, w). next() steps to the following position.
struct BlockedCursor {
  dc_u64 row, col;   // the element in the chunk
  dc_u64 rows, cols; // the chunk's shape
  dc_u32 i, j;       // the element inside its block: row = 8 bi + i, col = 8 bj + j
  dc_u32 h, w;       // the block's height and width (8 but at the chunk's edges)

  // The next wire position. Meaningless after the chunk's last position.
  DC_HOST_DEVICE inline void next() {
    if (j + 1 < w) {  // along the block's row
      ++j;
      ++col;
      return;
    }
    col -= j;
    j = 0;
    if (i + 1 < h) {  // the block's next row
      ++i;
      ++row;
      return;
    }
    row -= i;
    i = 0;
    col += w;
    if (col < cols) {  // the next block of this block row
      w = cols - col < kBlockedSide ? (dc_u32)(cols - col) : kBlockedSide;
      return;
    }
    col = 0;  // the first block of the next block row
    row += h;
    w = cols < kBlockedSide ? (dc_u32)cols : kBlockedSide;
    h = row < rows && rows - row < kBlockedSide ? (dc_u32)(rows - row) : kBlockedSide;
  }
};

namespace detail {
// blocked_cursor in the integer type U (dc_u32 when every quantity fits, see below).
template <class U>
DC_HOST_DEVICE inline BlockedCursor blocked_cursor_in(U p, U rows, U cols) {
  const U side = kBlockedSide;
  const U band = side * cols;  // positions of a whole block row
  const U bi = p / band, q = p - bi * band, r0 = side * bi;
  const U h = rows - r0 < side ? rows - r0 : side;
  U bj, s;
  if (h == side) {  // a whole-height block row: blocks of 64 positions
    bj = q >> 6;
    s = q & 63;
  } else {
    bj = q / (side * h);
    s = q - bj * (side * h);
  }
  const U c0 = side * bj;
  const U w = cols - c0 < side ? cols - c0 : side;
  U i, j;
  if (w == side) {
    i = s >> 3;
    j = s & 7;
  } else {
    i = s / w;
    j = s - i * w;
  }
  BlockedCursor c;
  c.row = (dc_u64)(r0 + i);
  c.col = (dc_u64)(c0 + j);
  c.rows = (dc_u64)rows;
  c.cols = (dc_u64)cols;
  c.i = (dc_u32)i;
  c.j = (dc_u32)j;
  c.h = (dc_u32)h;
  c.w = (dc_u32)w;
  return c;
}

// The 64-bit case, out of line on the device: it only serves chunks of 2^32 elements or more
// and would double the size of every kernel that inlines the hooks.
DC_NOINLINE DC_HOST_DEVICE inline BlockedCursor blocked_cursor_wide(dc_u64 p, dc_u64 rows,
                                                                    dc_u64 cols) {
  return blocked_cursor_in<dc_u64>(p, rows, cols);
}
}  // namespace detail

// The element at wire position `pos` (< rows * cols) of a rows x cols chunk in the blocked
// order. One division by 8 cols, plus one more for each partial dimension of the position's
// block; in 32-bit arithmetic when the chunk rounded up to whole blocks has fewer than 2^32
// elements, in 64-bit otherwise.
DC_HOST_DEVICE inline BlockedCursor blocked_cursor(dc_u64 pos, dc_u64 rows, dc_u64 cols) {
  const dc_u64 rows8 = (rows + 7) & ~(dc_u64)7, cols8 = (cols + 7) & ~(dc_u64)7;
  if ((rows8 >> 32) == 0 && (cols8 >> 32) == 0 && ((rows8 * cols8) >> 32) == 0) {
    return detail::blocked_cursor_in<dc_u32>((dc_u32)pos, (dc_u32)rows, (dc_u32)cols);
  }
  return detail::blocked_cursor_wide(pos, rows, cols);
}

// The other way: the wire position of element (row, col) of a rows x cols chunk.
DC_HOST_DEVICE inline dc_u64 blocked_position(dc_u64 row, dc_u64 col, dc_u64 rows,
                                              dc_u64 cols) {
  const dc_u64 side = kBlockedSide;
  const dc_u64 bi = row / side, bj = col / side, r0 = side * bi, c0 = side * bj;
  const dc_u64 h = rows - r0 < side ? rows - r0 : side;
  const dc_u64 w = cols - c0 < side ? cols - c0 : side;
  return r0 * cols + h * c0 + (row - r0) * w + (col - c0);
}

#if defined(__CUDACC__)

// Reads tile `c` of the input as T elements (T = In = Wire): one 16-byte load when the tile is
// whole and aligned, element by element otherwise.
template <class T>
__device__ __forceinline__ Tile<T> load_tile(const Ctx& c) {
  Tile<T> t;
  const T* p = static_cast<const T*>(c.in) + c.index;
  constexpr dc_u32 kFull = (1u << Tile<T>::kElems) - 1u;
  if (c.valid == kFull && (reinterpret_cast<dc_u64>(p) & 15) == 0) {
    *reinterpret_cast<uint4*>(&t) = *reinterpret_cast<const uint4*>(p);
  } else {
#pragma unroll
    for (int k = 0; k < Tile<T>::kElems; ++k) t.v[k] = (c.valid >> k & 1u) ? p[k] : T();
  }
  return t;
}

// Writes tile `t` to the output as T elements (T = Out = Wire).
template <class T>
__device__ __forceinline__ void store_tile(const Ctx& c, const Tile<T>& t) {
  T* p = static_cast<T*>(c.out) + c.index;
  constexpr dc_u32 kFull = (1u << Tile<T>::kElems) - 1u;
  if (c.valid == kFull && (reinterpret_cast<dc_u64>(p) & 15) == 0) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&t);
  } else {
#pragma unroll
    for (int k = 0; k < Tile<T>::kElems; ++k) {
      if (c.valid >> k & 1u) p[k] = t.v[k];
    }
  }
}

// Hooks in the blocked order (see "The blocked wire order" above). `index(row, col)` gives the
// index, inside this peer's chunk (the first element is c.index - c.pos), of the element that
// stands for (row, col) of the rows x cols chunk, e.g. `row * c.cols + col` for a row-major
// matrix, `col * c.rows + row` for its transpose. It is called only for the tile's valid
// elements.

namespace detail {
// The element-by-element paths of gather_blocked / scatter_blocked, for tiles that cross a row
// of a block (or the chunk's end). Inlined although they serve only the chunk's edges (all
// 4-byte tiles of whole blocks lie in one row): out of line, the calls made the collective
// kernel keep its tiles and contexts in a 440-byte stack frame in local memory, which cost the
// transpose all-to-all a third of its time (docs/PERFORMANCE.md, c9).
template <class T, class F>
__device__ __forceinline__ Tile<T> gather_elems(const T* m, BlockedCursor at, dc_u32 valid,
                                                F index) {
  Tile<T> t;
#pragma unroll
  for (int k = 0; k < Tile<T>::kElems; ++k) {
    if (valid >> k & 1u) {
      t.v[k] = m[(dc_u64)index(at.row, at.col)];
      if (k + 1 < Tile<T>::kElems && (valid >> (k + 1) & 1u)) at.next();
    } else {
      t.v[k] = T();
    }
  }
  return t;
}

template <class T, class F>
__device__ __forceinline__ void scatter_elems(T* m, const Tile<T> t, BlockedCursor at,
                                              dc_u32 valid, F index) {
#pragma unroll
  for (int k = 0; k < Tile<T>::kElems; ++k) {
    if (!(valid >> k & 1u)) break;
    m[(dc_u64)index(at.row, at.col)] = t.v[k];
    if (k + 1 < Tile<T>::kElems) at.next();
  }
}

// Whether the tile is whole and its elements are (at.row, at.col + k), k < kE: in one row of
// one block. If so, e0 = index(at.row, at.col), and vec says whether the elements map to
// consecutive elements from m + e0 on, 16-byte aligned.
template <class T, class F>
__device__ __forceinline__ bool one_row(const Ctx& c, const BlockedCursor& at, const T* m,
                                        F& index, dc_u64& e0, bool& vec) {
  constexpr int kE = Tile<T>::kElems;
  if (c.valid != (1u << kE) - 1u || at.j + kE > at.w) return false;
  e0 = (dc_u64)index(at.row, at.col);
  vec = (reinterpret_cast<dc_u64>(m + e0) & 15) == 0;
#pragma unroll
  for (int k = 1; k < kE; ++k) vec = vec && (dc_u64)index(at.row, at.col + k) == e0 + k;
  return true;
}
}  // namespace detail

// Reads the tile at wire position c.pos from the input as T elements (sizeof(T) divides 16).
// One 16-byte load when the tile is whole, lies in one row of one block, and `index` maps it to
// consecutive, 16-byte-aligned elements; element by element otherwise (T() outside `valid`).
template <class T, class F>
__device__ __forceinline__ Tile<T> gather_blocked(const Ctx& c, F index) {
  static_assert(16 % sizeof(T) == 0, "sizeof(T) must divide 16");
  const T* m = static_cast<const T*>(c.in) + (c.index - c.pos);
  const BlockedCursor at = blocked_cursor(c.pos, c.rows, c.cols);
  dc_u64 e0;
  bool vec;
  if (!detail::one_row<T>(c, at, m, index, e0, vec)) {
    return detail::gather_elems<T>(m, at, c.valid, index);
  }
  Tile<T> t;
  if (vec) {
    *reinterpret_cast<uint4*>(&t) = *reinterpret_cast<const uint4*>(m + e0);
  } else {
#pragma unroll
    for (int k = 0; k < Tile<T>::kElems; ++k) t.v[k] = m[(dc_u64)index(at.row, at.col + k)];
  }
  return t;
}

// Writes tile `t` at wire position c.pos to the output as T elements (sizeof(T) divides 16):
// only its valid elements; one 16-byte store when they are all valid, in one row of one block,
// and `index` maps them to consecutive, 16-byte-aligned elements, element stores otherwise.
template <class T, class F>
__device__ __forceinline__ void scatter_blocked(const Ctx& c, const Tile<T>& t, F index) {
  static_assert(16 % sizeof(T) == 0, "sizeof(T) must divide 16");
  T* m = static_cast<T*>(c.out) + (c.index - c.pos);
  const BlockedCursor at = blocked_cursor(c.pos, c.rows, c.cols);
  dc_u64 e0;
  bool vec;
  if (!detail::one_row<T>(c, at, m, index, e0, vec)) {
    detail::scatter_elems<T>(m, t, at, c.valid, index);
  } else if (vec) {
    *reinterpret_cast<uint4*>(m + e0) = *reinterpret_cast<const uint4*>(&t);
  } else {
#pragma unroll
    for (int k = 0; k < Tile<T>::kElems; ++k) m[(dc_u64)index(at.row, at.col + k)] = t.v[k];
  }
}

// The default hooks: copy elements of T (any type whose size divides 16).
template <class T>
struct CopyHooks {
  using In = T;
  using Out = T;
  using Wire = T;
  static __device__ __forceinline__ Tile<T> produce(const Ctx& c) { return load_tile<T>(c); }
  static __device__ __forceinline__ void consume(const Ctx& c, const Tile<T>& t) {
    store_tile<T>(c, t);
  }
};

// Plain byte-sized element types for CopyHooks by size (the Rust side names them by size).
struct alignas(1) Bytes1 { unsigned char b[1]; };
struct alignas(2) Bytes2 { unsigned char b[2]; };
struct alignas(4) Bytes4 { unsigned char b[4]; };
struct alignas(8) Bytes8 { unsigned char b[8]; };
struct alignas(16) Bytes16 { unsigned char b[16]; };

#endif  // __CUDACC__

}  // namespace devcomm
