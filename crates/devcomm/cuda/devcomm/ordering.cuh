// devcomm/ordering.cuh: the memory-ordering primitives every other header builds on.
//
// All cross-GPU synchronisation in devcomm goes through these few instructions, at system scope
// (`.sys`): peers' memory is reached over NVLink and the error state lives in host memory, so
// GPU scope is not enough. Signals are 64-bit and monotonic; they are never reset on the device.
//
// Message passing rule (DESIGN section 3): data stores by the group, then a barrier of the group,
// then ONE thread publishes the signal with release semantics at system scope; the receiver
// acquires the signal (one thread), then barriers its group, then reads.
#pragma once

#include "devcomm/handles.cuh"

namespace devcomm {

#if defined(__CUDACC__)

// Load with acquire semantics at system scope: reads after it (by this thread, and by the
// threads of its group after a group barrier) see everything the releasing writer published.
__device__ __forceinline__ dc_u64 ld_acquire_sys(const dc_u64* addr) {
  dc_u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
  return v;
}

// Relaxed (but strong, non-cached-stale) load at system scope: for reading a counter whose value
// alone matters and that orders no other data (e.g. polling progress for statistics).
__device__ __forceinline__ dc_u64 ld_relaxed_sys(const dc_u64* addr) {
  dc_u64 v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
  return v;
}

// Store with release semantics at system scope: every write this thread made (or observed)
// before it is visible to a thread that acquires this value.
__device__ __forceinline__ void st_release_sys(dc_u64* addr, dc_u64 v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}

// Relaxed store at system scope: publishes a value that orders no data (the `_relaxed` signal).
__device__ __forceinline__ void st_relaxed_sys(dc_u64* addr, dc_u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}

// Atomic add with release semantics at system scope, result not returned (a reduction). Used
// where several writers bump one counter (barrier arrivals, `signal_add`).
__device__ __forceinline__ void red_add_release_sys(dc_u64* addr, dc_u64 v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}

// Full acquire-release fence at system scope. The publishing thread of a group issues it before
// the release store: the group barrier (bar.sync) orders the other threads' stores before this
// thread only at CTA scope, and the fence makes everything this thread has observed (their
// stores included) visible at system scope before the signal. This is what NCCL and mscclpp do;
// it costs one fence per message, not per store.
// Raises *addr to at least v (a word that only grows, whatever order such updates arrive in).
__device__ __forceinline__ void red_max_relaxed_sys(dc_u64* addr, dc_u64 v) {
  asm volatile("red.relaxed.sys.global.max.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_sys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// The global nanosecond timer (same clock on every SM of a GPU). Used for wait deadlines and
// latency measurements; its resolution is about a microsecond on current GPUs.
__device__ __forceinline__ dc_u64 globaltimer_ns() {
  dc_u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// Programmatic dependent launch (docs/PROTOCOL.md, "Back-to-back launches"). The host launches
// devcomm's kernels with programmatic stream serialization, so a kernel may be scheduled while
// the kernel before it on the stream still runs. Every such kernel calls this first: it lets
// the next kernel be scheduled (once every block of this one has called it), then waits until
// the kernel before this one has finished and its memory operations are visible, exactly the
// guarantee an ordinary launch gives. Launched without the attribute, both are no-ops.
__device__ __forceinline__ void enter_after_previous_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#endif  // __CUDACC__

}  // namespace devcomm
