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
// Tile k of a chunk covers the chunk's elements [k * E, k * E + E), E = 16 / sizeof(Wire), of
// In on the sending side and of Out on the receiving side; at the chunk's end `valid` says which
// of them exist. Hooks must not touch elements outside `valid` (the framework writes nothing
// there either).
#pragma once

#include "devcomm/handles.cuh"

namespace devcomm {

// The one context every hook gets. New fields are appended, never reordered.
struct Ctx {
  const void* in;     // this rank's whole send buffer (produce); null in consume
  void* out;          // this rank's whole receive buffer (consume); null in produce
  const void* user;   // the user arguments passed from Rust (device memory), or null
  dc_u64 index;       // flat index in `in` (produce) / `out` (consume) of the tile's 1st element
  dc_u64 pos;         // the same element's index inside this peer's chunk
  dc_u64 rows;        // the chunk's shape: rows x cols elements (cols = row length)
  dc_u64 cols;
  dc_i32 peer;        // the rank the chunk goes to (produce) / comes from (consume)
  dc_i32 rank;        // this rank
  dc_i32 world_size;
  dc_u32 valid;       // bit k set: element k of the tile lies inside the chunk
};

// 16 bytes of wire elements.
template <class W>
struct alignas(16) Tile {
  static constexpr int kElems = (int)(16 / sizeof(W));
  W v[kElems];
};

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
