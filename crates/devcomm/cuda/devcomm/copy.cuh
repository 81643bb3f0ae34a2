// devcomm/copy.cuh: group-wide memory copy, local or over NVLink.
//
// NVLink loads and stores have microsecond-scale latency, so bandwidth comes from many requests
// in flight: each thread issues kCopyUnroll independent 16-byte loads before storing any of
// them. Correct for any size and any alignment: when dst and src share 16-byte alignment the
// body moves uint4 vectors and only the head (up to the first 16-byte boundary) and the tail
// (under 16 bytes) go narrower; when they are mutually misaligned the widest common width
// (8, 4, 2 or 1 bytes) is used throughout.
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/group.cuh"

namespace devcomm {

#if defined(__CUDACC__)

// Independent loads each thread keeps in flight per iteration. Reads over NVLink (the pull
// protocol) wait a round trip per load, so they take kCopyUnrollRemote.
constexpr int kCopyUnroll = 4;
constexpr int kCopyUnrollRemote = 8;

namespace detail {

// Copies `n` elements of T; threads of `g` take elements round-robin (coalesced), kCopyUnroll
// per iteration. Needs dst and src aligned to sizeof(T).
template <int U, class T, class G>
__device__ __forceinline__ void copy_elements(const G& g, T* dst, const T* src, dc_u64 n) {
  const dc_u64 nthreads = g.size();
  dc_u64 i = g.thread_rank();
  // All loads of one iteration are issued before its stores so they overlap in flight.
  for (; i + (U - 1) * nthreads < n; i += U * nthreads) {
    T v[U];
#pragma unroll
    for (int k = 0; k < U; ++k) v[k] = src[i + k * nthreads];
#pragma unroll
    for (int k = 0; k < U; ++k) dst[i + k * nthreads] = v[k];
  }
  // Fewer than U elements left for this thread.
  for (; i < n; i += nthreads) dst[i] = src[i];
}

// Byte copy for heads and tails (fewer than 16 bytes, so one pass of the group).
template <class G>
__device__ __forceinline__ void copy_tail_bytes(const G& g, unsigned char* dst,
                                                const unsigned char* src, dc_u64 n) {
  for (dc_u64 i = g.thread_rank(); i < n; i += g.size()) dst[i] = src[i];
}

}  // namespace detail

// Copies `bytes` from `src` to `dst` (either may be local or a peer's NVLink mapping).
// Called by every thread of `g`. There is no barrier at the end: a thread's stores are not
// ordered with the others'. Publish with put_signal / a group sync, never by one thread alone.
// U: loads in flight per thread (kCopyUnrollRemote when `src` is a peer's memory).
template <int U = kCopyUnroll, class G>
__device__ inline void copy_bytes(const G& g, void* dst, const void* src, dc_u64 bytes) {
  unsigned char* d = static_cast<unsigned char*>(dst);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  // The widest width both pointers can share after a common head.
  const dc_u64 skew = reinterpret_cast<dc_u64>(d) ^ reinterpret_cast<dc_u64>(s);
  const dc_u64 width = (skew & 15) == 0 ? 16 : (skew & 7) == 0 ? 8 : (skew & 3) == 0 ? 4
                     : (skew & 1) == 0  ? 2  : 1;
  dc_u64 head = (width - (reinterpret_cast<dc_u64>(d) & (width - 1))) & (width - 1);
  if (head > bytes) head = bytes;
  detail::copy_tail_bytes(g, d, s, head);
  d += head;
  s += head;
  bytes -= head;

  const dc_u64 n = bytes / width;
  switch (width) {
    case 16:
      detail::copy_elements<U>(g, reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(s), n);
      break;
    case 8:
      detail::copy_elements<U>(g, reinterpret_cast<dc_u64*>(d), reinterpret_cast<const dc_u64*>(s), n);
      break;
    case 4:
      detail::copy_elements<U>(g, reinterpret_cast<dc_u32*>(d), reinterpret_cast<const dc_u32*>(s), n);
      break;
    case 2:
      detail::copy_elements<U>(g, reinterpret_cast<unsigned short*>(d),
                            reinterpret_cast<const unsigned short*>(s), n);
      break;
    default:
      detail::copy_elements<U>(g, d, s, n);
      break;
  }
  const dc_u64 done = n * width;
  detail::copy_tail_bytes(g, d + done, s + done, bytes - done);
}

#endif  // __CUDACC__

}  // namespace devcomm
