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

// The barrier over the peers `part(p)` selects: thread 0 takes the next epoch e, announces its
// arrival to each with `arrive(p, e)` (false: a bounded wait gave up, recorded), then waits
// until its own slot p >= e for each. Rules and result as barrier() below; barrier_routed
// (window_net.cuh) arrives at network peers through their queues.
template <class G, class Part, class Arrive>
__device__ inline bool barrier_over(const G& g, const DeviceWindow& w, Part part, Arrive arrive) {
  g.sync();  // the group's stores happen before thread 0 announces arrival
  bool ok = true;
  if (g.thread_rank() == 0) {
    dc_u64* epoch_ptr = reinterpret_cast<dc_u64*>(w.barrier_epoch);
    const dc_u64 epoch = *epoch_ptr + 1;  // only this thread touches it (see barrier())
    *epoch_ptr = epoch;
    // Cumulativity: makes the other threads' stores (ordered before us by g.sync at CTA scope)
    // visible at system scope before the arrival; see fence_acq_rel_sys.
    fence_acq_rel_sys();
    for (int p = 0; p < w.world_size && ok; ++p) {
      if (p != w.rank && part(p)) ok = arrive(p, epoch);
    }
    const dc_u64* own = reinterpret_cast<const dc_u64*>(w.signals);
    for (int p = 0; p < w.world_size && ok; ++p) {
      if (p == w.rank || !part(p)) continue;
      const WaitSite site{kOpBarrier, p, static_cast<dc_u64>(p)};
      ok = wait_until(error_state(w), w.timeout_ns, w.rank, own + p, epoch, Cmp::Ge, site);
    }
  }
  return !g.any(!ok);
}

// Cross-rank barrier over all NVLink peers of the window. Called by every thread of `g`, and
// on every rank by exactly one group per barrier (the epoch counter is per rank, so two groups
// of one rank entering the same barrier would count twice). Writes the group made before the
// barrier (local or to peers' windows) are visible on every rank after it. Returns the same
// bool to every thread; false (timeout or abort, recorded) means the group must stop and
// publish nothing more.
template <class G>
__device__ inline bool barrier(const G& g, const DeviceWindow& w) {
  return barrier_over(
      g, w, [&](int p) { return peer_signal_pad(w, p) != nullptr; },
      [&](int p, dc_u64) {
        red_add_release_sys(peer_signal_pad(w, p) + w.rank, 1);
        return true;
      });
}

#endif  // __CUDACC__

}  // namespace devcomm
