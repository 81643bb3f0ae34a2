// devcomm/wait.cuh: the one bounded spin-wait every device wait goes through.
//
// No wait may hang (DESIGN section 3). A wait polls its word with ld.acquire.sys; every
// kAbortCheckPolls polls it also checks the process-wide abort flag and its deadline. When the
// deadline passes it records what it was waiting for in the host-mapped ErrorRecord (first
// failure of the process wins), raises `abort` so every other wait of the process gives up
// within a few polls, and returns false.
//
// CALLER CONTRACT: a thread (or group) that gets `false` must stop its part of the operation and
// must not publish any further signal (no data-ready, no slot-free, no barrier arrival): the
// data those signals would announce was not moved. It should return from the kernel promptly.
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"
#include "devcomm/trace.cuh"

namespace devcomm {

// How a wait compares the value it reads (`seen`) with the value it waits for (`expected`).
// Signals are monotonic, so Ge is the usual choice.
enum class Cmp : dc_u32 { Ge = 0, Eq = 1, Ne = 2, Gt = 3 };

// What a wait is for, recorded on timeout so the host error names the peer and slot.
struct WaitSite {
  dc_u32 op;    // DeviceOp
  dc_i32 peer;  // the peer expected to write the word, -1 if unknown
  dc_u64 slot;  // signal slot index (as the caller numbers it)
};

#if defined(__CUDACC__)

// Polls between two reads of the clock. globaltimer is on-chip and cheap enough to read every
// 64 polls; the abort flag lives in host memory (a PCIe round trip), so a waiting thread reads
// it only once every kAbortCheckNs. Thousands of threads wait at once (a warp leader per staged
// channel, every thread of an LL receive), and host reads from all of them congest PCIe and
// slow every transfer. Measured on 4 H200s: with a read every 20 us, all-to-alls stalled at
// 10-100x their time (64 MiB per peer: 5.6 ms instead of 0.7; docs/PERFORMANCE.md, v8);
// per-poll-batch reads had made 64 KiB messages take 27 us instead of 5 us. An abort raised
// elsewhere reaches a waiting kernel within about kAbortCheckNs; timeouts do not depend on it.
constexpr dc_u32 kAbortCheckPolls = 64;
constexpr dc_u64 kAbortCheckNs = 1000000;

// A wait not satisfied within kSpinPolls polls sleeps between polls, from kMinSleepNs doubling
// to kMaxSleepNs: a spinning warp takes issue slots from the warps that share its SM (measured:
// both-direction transfers, whose receiving warps share SMs with sending warps, ran at a
// quarter of one-way speed while every waiting leader spun).
constexpr dc_u32 kSpinPolls = 64;
constexpr dc_u32 kMinSleepNs = 64;
constexpr dc_u32 kMaxSleepNs = 1024;

__device__ __forceinline__ bool compare(dc_u64 seen, dc_u64 expected, Cmp cmp) {
  switch (cmp) {
    case Cmp::Eq: return seen == expected;
    case Cmp::Ne: return seen != expected;
    case Cmp::Gt: return seen > expected;
    default: return seen >= expected;
  }
}

// True once the host or another wait of this process raised the abort flag.
// A volatile load is enough: the flag orders no other data (a wait that sees it only gives
// up), so no acquire is needed, and volatile forces a fresh read from host memory on every
// check instead of a register or L1 copy. `err` may be null (no error state: never aborted).
__device__ __forceinline__ bool abort_raised(const DeviceErrorState* err) {
  return err != nullptr && *reinterpret_cast<const volatile dc_u32*>(&err->abort) != 0;
}

// This launch's token for the abort mirror (DeviceErrorState::mirror): %gridid, the temporal
// number of the launch in this context, with the top bit set so that it is never 0.
__device__ __forceinline__ dc_u64 launch_token() {
  dc_u64 g;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
  return g | (1ull << 63);
}

// Records a failed wait (only the first failure of the process is kept) and raises abort.
// `op` is written last: a thread that loses the claim raises abort at once, so the host may see
// abort and the claimed flag before the winner's fields; it takes a record as complete only
// once its op is set (src/cuda/error_state/mod.rs, evaluate).
__device__ inline void record_wait_failure(DeviceErrorState* err, dc_i32 rank, WaitSite site,
                                           dc_u64 expected, dc_u64 seen, dc_u64 elapsed_ns) {
  if (err == nullptr) return;
  // Only this process's GPU writes its error state, so a device-scope atomic on the host-mapped
  // word is atomic enough (mapped-memory atomics are not atomic w.r.t. the host, who only reads;
  // the one host writer, the network proxy, claims the record with a host CAS, and a failure of
  // both at the same instant could mix the two records: docs/NETWORK.md, "Failures").
  if (atomicCAS(&err->record.flag, 0u, 1u) == 0u) {
    volatile ErrorRecord* rec = &err->record;
    rec->rank = rank;
    rec->peer = site.peer;
    rec->slot = site.slot;
    rec->expected = expected;
    rec->seen = seen;
    rec->elapsed_ns = elapsed_ns;
    __threadfence_system();
    rec->op = site.op;
    // The record must be complete in host memory before this thread raises `abort`.
    __threadfence_system();
  }
  *reinterpret_cast<volatile dc_u32*>(&err->abort) = 1u;
  // The device-memory copy that later kernels read at their start (agree.cuh: no call is
  // announced after a failure), holding the failing launch's token: roles of this same launch
  // still announce theirs, so that their peers can tell a mismatch from a silence. The first
  // failing launch keeps it. Read over the host mapping: this path is rare.
  const dc_u64 mirror = *reinterpret_cast<volatile dc_u64*>(&err->mirror);
  if (mirror != 0) {
    atomicCAS(reinterpret_cast<unsigned long long*>(mirror), 0ull,
              static_cast<unsigned long long>(launch_token()));
  }
  __threadfence_system();
}

// Records an error that leaves the protocol consistent (the kernel still ran it to the end, so
// no peer waits on this one): no abort is raised and the communicator stays usable. `op` is
// written last: the host takes a record with flag set, abort clear and a soft op as complete
// (src/cuda/error_state.rs). Used for all-to-all-v counts beyond a buffer and for zero-copy
// calls whose two sides disagree.
__device__ inline void record_soft_error(DeviceErrorState* err, dc_u32 op, dc_i32 rank,
                                         dc_i32 peer, dc_u64 slot, dc_u64 expected,
                                         dc_u64 seen) {
  if (err == nullptr) return;
  if (atomicCAS(&err->record.flag, 0u, 1u) == 0u) {
    volatile ErrorRecord* rec = &err->record;
    rec->rank = rank;
    rec->peer = peer;
    rec->slot = slot;
    rec->expected = expected;
    rec->seen = seen;
    rec->elapsed_ns = 0;
    __threadfence_system();
    rec->op = op;
    __threadfence_system();
  }
}

// Waits (one thread) until `cmp(*addr, expected)` holds, at most `timeout_ns` nanoseconds.
// Returns true when it holds (with acquire semantics: what the writer published before its
// release store is visible to this thread), false on timeout or abort (see CALLER CONTRACT).
// A timeout of 0 gives up at the first check; the host always sets a real bound.
__device__ inline bool wait_until(DeviceErrorState* err, dc_u64 timeout_ns, dc_i32 rank,
                                  const dc_u64* addr, dc_u64 expected, Cmp cmp, WaitSite site) {
  dc_u64 seen = ld_acquire_sys(addr);
  if (compare(seen, expected, cmp)) return true;  // fast path: no clock read at all
  // Spin with relaxed loads and acquire once when the value is there: an acquire per poll
  // slows the other warps of the SM (measured: both-direction transfers at a quarter speed).
  const dc_u64 start = globaltimer_ns();
  dc_u64 next_abort_check = start + kAbortCheckNs;
  dc_u32 sleep_ns = kMinSleepNs;
  for (dc_u32 polls = 1;; ++polls) {
    if (polls > kSpinPolls) {
      __nanosleep(sleep_ns);
      sleep_ns = sleep_ns < kMaxSleepNs ? 2 * sleep_ns : kMaxSleepNs;
    }
    if (polls % kAbortCheckPolls == 0) {
      const dc_u64 now = globaltimer_ns();
      if (now >= next_abort_check) {
        if (abort_raised(err)) return false;  // someone else recorded the failure
        next_abort_check = now + kAbortCheckNs;
      }
      const dc_u64 elapsed = now - start;
      if (elapsed >= timeout_ns) {
        record_wait_failure(err, rank, site, expected, seen, elapsed);
        return false;
      }
    }
    seen = ld_relaxed_sys(addr);
    if (compare(seen, expected, cmp)) {
      seen = ld_acquire_sys(addr);  // orders what follows after the writer's release
      if (compare(seen, expected, cmp)) return true;
    }
  }
}

#endif  // __CUDACC__

}  // namespace devcomm
