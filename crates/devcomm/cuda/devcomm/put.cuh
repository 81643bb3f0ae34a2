// devcomm/put.cuh: one-sided writes into a peer's window, with or without a signal.
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"
#include "devcomm/group.cuh"
#include "devcomm/copy.cuh"
#include "devcomm/window.cuh"

namespace devcomm {

#if defined(__CUDACC__)

// Copies `bytes` from local `src` into `peer`'s window data at `dst_offset`. Called by every
// thread of `g`. No signal and no barrier: the peer learns about the data through a later
// signal or barrier. Traps if the peer has no NVLink path or the range exceeds the window.
template <class G>
__device__ inline void put(const G& g, const DeviceWindow& w, int peer, dc_u64 dst_offset,
                           const void* src, dc_u64 bytes) {
  unsigned char* base = static_cast<unsigned char*>(get_nvlink_address(w, peer));
  if (base == nullptr || dst_offset > w.data_bytes || bytes > w.data_bytes - dst_offset) __trap();
  copy_bytes(g, base + dst_offset, src, bytes);
}

// put, then publishes it: sets `peer`'s user slot `slot` to `value` once every thread's stores
// are done (stores by the group, group barrier, one thread: fence + release store at system
// scope). Called by every thread of `g`. The receiver does wait_signal(slot, value) and may then
// read [dst_offset, dst_offset + bytes) of its window.
template <class G>
__device__ inline void put_signal(const G& g, const DeviceWindow& w, int peer, dc_u64 dst_offset,
                                  const void* src, dc_u64 bytes, dc_u64 slot, dc_u64 value) {
  put(g, w, peer, dst_offset, src, bytes);
  g.sync();
  if (g.thread_rank() == 0) {
    // The barrier ordered the other threads' stores before ours only at CTA scope; the fence
    // extends that to system scope so the peer never sees the signal before the data.
    fence_acq_rel_sys();
    signal(w, peer, slot, value);
  }
}

#endif  // __CUDACC__

}  // namespace devcomm
