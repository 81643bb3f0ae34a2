// devcomm/group.cuh: the cooperating groups every device operation takes explicitly.
//
// An operation that takes a group `g` must be called by EVERY thread of `g` with the same
// arguments (it contains group barriers); the doc comment of each operation says which thread
// does what. Groups are cheap value types, built inside the kernel:
//
//   Thread          one thread on its own (no barrier at all)
//   Warp            the 32 lanes of the calling warp; all 32 must be active and call
//   Block           every thread of the block
//   NamedBarrier    threads [first, first + threads) of the block (linear thread index), synced
//                   through hardware barrier `id` (1..15; 0 is __syncthreads'); `threads` must be
//                   a multiple of 32 and the range must cover whole warps
//
// Every group has thread_rank(), size(), sync() and any(pred). `any` is a group-wide OR whose
// result every thread gets, AND a barrier of the group with the same memory ordering as sync():
// writes made before it by any thread of the group are visible to all threads after it.
#pragma once

#include "devcomm/handles.cuh"

namespace devcomm {

#if defined(__CUDACC__)

// Linear index of the calling thread inside its block (x fastest).
__device__ __forceinline__ dc_u32 linear_thread_index() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// One thread working alone.
struct Thread {
  __device__ __forceinline__ dc_u32 thread_rank() const { return 0; }
  __device__ __forceinline__ dc_u32 size() const { return 1; }
  __device__ __forceinline__ void sync() const {}
  __device__ __forceinline__ bool any(bool pred) const { return pred; }
};

// The calling warp; all 32 lanes must be active.
struct Warp {
  __device__ __forceinline__ dc_u32 thread_rank() const { return linear_thread_index() & 31u; }
  __device__ __forceinline__ dc_u32 size() const { return 32; }
  __device__ __forceinline__ void sync() const { __syncwarp(); }
  __device__ __forceinline__ bool any(bool pred) const {
    // __any_sync converges the lanes but is not documented to order memory; __syncwarp is, so
    // the barrier semantics promised above come from it.
    __syncwarp();
    return __any_sync(0xffffffffu, pred) != 0;
  }
};

// Every thread of the block.
struct Block {
  __device__ __forceinline__ dc_u32 thread_rank() const { return linear_thread_index(); }
  __device__ __forceinline__ dc_u32 size() const { return blockDim.x * blockDim.y * blockDim.z; }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
  __device__ __forceinline__ bool any(bool pred) const { return __syncthreads_or(pred) != 0; }
};

// A subset of the block, threads [first, first + threads), synced by hardware barrier `id`.
struct NamedBarrier {
  dc_u32 id;       // hardware barrier 1..15 (0 belongs to __syncthreads)
  dc_u32 first;    // first linear thread index of the subset (a multiple of 32)
  dc_u32 threads;  // number of threads (a multiple of 32)

  __device__ __forceinline__ NamedBarrier(dc_u32 id_, dc_u32 first_, dc_u32 threads_)
      : id(id_), first(first_), threads(threads_) {}
  __device__ __forceinline__ dc_u32 thread_rank() const { return linear_thread_index() - first; }
  __device__ __forceinline__ dc_u32 size() const { return threads; }
  __device__ __forceinline__ void sync() const {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
  }
  __device__ __forceinline__ bool any(bool pred) const {
    dc_u32 result;
    asm volatile(
        "{\n\t"
        ".reg .pred p_in, p_out;\n\t"
        "setp.ne.u32 p_in, %1, 0;\n\t"
        "bar.red.or.pred p_out, %2, %3, p_in;\n\t"
        "selp.u32 %0, 1, 0, p_out;\n\t"
        "}"
        : "=r"(result)
        : "r"((dc_u32)pred), "r"(id), "r"(threads)
        : "memory");
    return result != 0;
  }
};

#endif  // __CUDACC__

}  // namespace devcomm
