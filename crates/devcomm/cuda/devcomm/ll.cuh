// devcomm/ll.cuh: low-latency (LL) lines: 16-byte flag-in-data lines and the bounded poll
// loop that receivers of LL and LL128 lines share (docs/PROTOCOL.md).
#pragma once

#include "devcomm/transfer_common.cuh"

namespace devcomm {
namespace p2p {

#if defined(__CUDACC__)

// Low-latency line: two 8-byte halves {payload u32, flag u32}, written by one 16-byte store.
__device__ __forceinline__ void ll_store(dc_u32* line, dc_u64 v, dc_u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line),
               "r"((dc_u32)v), "r"(flag), "r"((dc_u32)(v >> 32)), "r"(flag)
               : "memory");
}

__device__ __forceinline__ void ll_load(const dc_u32* line, dc_u32& lo, dc_u32& f0, dc_u32& hi,
                                        dc_u32& f1) {
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(lo), "=r"(f0), "=r"(hi), "=r"(f1)
               : "l"(line)
               : "memory");
}

// The lines of call `seq` for a span, in the region of `sender` inside a window's data.
__device__ __forceinline__ dc_u32* ll_lines(const P2PLaunch& a, char* window_data, int sender,
                                            dc_u64 seq, const Span& sp) {
  return reinterpret_cast<dc_u32*>(window_data + (dc_u64)sender * a.region_bytes + a.ll_offset +
                                   (seq & 1) * a.ll_parity_bytes + sp.begin / 8 * 16);
}

// The clock of a flag-in-data poll loop (one thread): every kAbortCheckPolls polls it reads the
// time, checks the communicator's abort flag every `abort_ns` (a host read over PCIe) and gives
// up after the timeout, recording the failure.
struct PollClock {
  dc_u64 start = 0;
  dc_u64 next_abort_check = 0;
  dc_u32 polls = 0;
  dc_u64 abort_ns = kAbortCheckNs;

  // False when the poll loop must stop: timeout (recorded here) or abort.
  __device__ __forceinline__ bool tick(const P2PLaunch& a, DeviceErrorState* err, int peer,
                                       dc_u64 index, dc_u64 expected, dc_u64 seen) {
    if (++polls % kAbortCheckPolls != 0) return true;
    const dc_u64 now = globaltimer_ns();
    if (start == 0) {
      start = now;
      next_abort_check = now + abort_ns;
    }
    if (now >= next_abort_check) {
      if (abort_raised(err)) return false;
      next_abort_check = now + abort_ns;
    }
    if (now - start >= a.w.timeout_ns) {
      record_wait_failure(err, a.w.rank, WaitSite{kOpRecvSlotFull, peer, index}, expected, seen,
                          now - start);
      return false;
    }
    return true;
  }
};

// Polls one line until both flags carry `flag`; false on timeout or abort. Every thread of an
// LL receive polls on its own, up to 16384 of them per GPU: lane 0 of each warp checks the
// abort flag every kAbortCheckNs and the other lanes 8 times less often, so that waiting
// receivers read host memory about as rarely as the bulk path's one leader per warp (an abort
// reaches every lane within 8 x kAbortCheckNs; see kAbortCheckNs in wait.cuh for the stalls
// that frequent host reads caused).
__device__ __forceinline__ bool ll_poll(const P2PLaunch& a, DeviceErrorState* err,
                                        const dc_u32* line, dc_u32 flag, int peer, dc_u64 index,
                                        dc_u64& v) {
  dc_u32 lo, f0, hi, f1;
  ll_load(line, lo, f0, hi, f1);
  PollClock clock;
  if ((linear_thread_index() & 31u) != 0) clock.abort_ns = 8 * kAbortCheckNs;
  while (f0 != flag || f1 != flag) {
    if (!clock.tick(a, err, peer, index, flag, (dc_u64)(f0 == flag ? f1 : f0))) return false;
    ll_load(line, lo, f0, hi, f1);
  }
  v = ((dc_u64)hi << 32) | lo;
  return true;
}

#endif  // __CUDACC__

}  // namespace p2p
}  // namespace devcomm
