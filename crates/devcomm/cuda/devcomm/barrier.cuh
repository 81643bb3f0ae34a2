// devcomm/barrier.cuh: the cross-rank barrier on a window.
//
// Every rank keeps a private epoch counter (w.barrier_epoch) and every pad has one barrier slot
// per rank (entries [0, world_size)). Entering barrier number e, a rank adds 1 to its slot
// (entry [rank]) in every NVLink peer's pad, then waits until its own entry [p] >= e for every
// such peer. Counters only grow, so nothing is ever reset and a fast rank that enters barrier
// e+1 early cannot confuse a slow one still in barrier e.
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"
#include "devcomm/group.cuh"
#include "devcomm/wait.cuh"
#include "devcomm/window.cuh"

namespace devcomm {

#if defined(__CUDACC__)

// Cross-rank barrier over all NVLink peers of the window. Called by every thread of `g`, and
// on every rank by exactly one group per barrier (the epoch counter is per rank, so two groups
// of one rank entering the same barrier would count twice). Writes the group made before the
// barrier (local or to peers' windows) are visible on every rank after it. Returns the same
// bool to every thread; false (timeout or abort, recorded) means the group must stop and
// publish nothing more.
template <class G>
__device__ inline bool barrier(const G& g, const DeviceWindow& w) {
  g.sync();  // the group's stores happen before thread 0 announces arrival
  bool ok = true;
  if (g.thread_rank() == 0) {
    dc_u64* epoch_ptr = reinterpret_cast<dc_u64*>(w.barrier_epoch);
    const dc_u64 epoch = *epoch_ptr + 1;  // only this thread touches it (see above)
    *epoch_ptr = epoch;
    // Cumulativity: makes the other threads' stores (ordered before us by g.sync at CTA scope)
    // visible at system scope before the arrival; see fence_acq_rel_sys.
    fence_acq_rel_sys();
    for (int p = 0; p < w.world_size; ++p) {
      dc_u64* pad = peer_signal_pad(w, p);
      if (p != w.rank && pad != nullptr) red_add_release_sys(pad + w.rank, 1);
    }
    const dc_u64* own = reinterpret_cast<const dc_u64*>(w.signals);
    for (int p = 0; p < w.world_size && ok; ++p) {
      if (p == w.rank || peer_signal_pad(w, p) == nullptr) continue;
      const WaitSite site{kOpBarrier, p, static_cast<dc_u64>(p)};
      ok = wait_until(error_state(w), w.timeout_ns, w.rank, own + p, epoch, Cmp::Ge, site);
    }
  }
  return !g.any(!ok);
}

#endif  // __CUDACC__

}  // namespace devcomm
