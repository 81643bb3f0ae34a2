// devcomm/window.cuh: raw operations on a DeviceWindow (peer addresses, signals, waits).
//
// Signal slots: user slot `slot` is pad entry world_size + slot (the first world_size entries
// belong to the barrier). Sender writes the RECEIVER's pad; the receiver waits on its own pad.
// Slot and peer indices are preconditions: an out-of-range index traps (the launch fails with
// an error) rather than writing into a peer's memory at a wrong address.
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"
#include "devcomm/group.cuh"
#include "devcomm/wait.cuh"

namespace devcomm {

#if defined(__CUDACC__)

// The window's data region of `peer` as mapped on this GPU; null if peer is out of range or
// there is no NVLink path. get_nvlink_address(w, w.rank) is this rank's own data.
__device__ __forceinline__ void* get_nvlink_address(const DeviceWindow& w, int peer) {
  if (peer < 0 || peer >= w.world_size) return nullptr;
  return reinterpret_cast<void*>(reinterpret_cast<const dc_u64*>(w.peer_data)[peer]);
}

// The communicator's abort mirror (DeviceErrorState::mirror, in device memory; its address is
// word 1 of the window's epoch buffer): 0, or the token of the launch that failed first
// (wait.cuh, launch_token). Senders read it to announce no call after a failure
// (devcomm/agree.cuh, and the reductions' agreement in devcomm/reduce.cuh).
// The mirror's address never changes (written before any kernel runs), so a kernel may load it
// before enter_after_previous_kernel and read the mirror itself after, one load on the path.
__device__ __forceinline__ dc_u64 mirror_address(const DeviceWindow& w) {
  return w.barrier_epoch == 0 ? 0 : reinterpret_cast<const dc_u64*>(w.barrier_epoch)[1];
}
__device__ __forceinline__ dc_u64 mirror_value(dc_u64 address) {
  return address == 0 ? 0 : *reinterpret_cast<const volatile dc_u64*>(address);
}
__device__ __forceinline__ dc_u64 abort_mirror(const DeviceWindow& w) {
  return mirror_value(mirror_address(w));
}

// `peer`'s signal pad as mapped here, null without NVLink path.
__device__ __forceinline__ dc_u64* peer_signal_pad(const DeviceWindow& w, int peer) {
  if (peer < 0 || peer >= w.world_size) return nullptr;
  return reinterpret_cast<dc_u64*>(reinterpret_cast<const dc_u64*>(w.peer_signals)[peer]);
}

// The host-mapped error state shared by all waits on this window.
__device__ __forceinline__ DeviceErrorState* error_state(const DeviceWindow& w) {
  return reinterpret_cast<DeviceErrorState*>(w.error_state);
}

// Address of user slot `slot` in `peer`'s pad; traps on a bad peer, slot or missing path.
__device__ __forceinline__ dc_u64* peer_user_slot(const DeviceWindow& w, int peer, dc_u64 slot) {
  dc_u64* pad = peer_signal_pad(w, peer);
  if (pad == nullptr || slot >= w.signal_count) __trap();
  return pad + w.world_size + slot;
}

// Address of user slot `slot` in this rank's own pad; traps on a bad slot.
__device__ __forceinline__ dc_u64* own_user_slot(const DeviceWindow& w, dc_u64 slot) {
  if (slot >= w.signal_count) __trap();
  return reinterpret_cast<dc_u64*>(w.signals) + w.world_size + slot;
}

// Sets `peer`'s user slot to `value` with release semantics at system scope (one thread).
// Publishes this thread's own prior writes; to publish a group's writes use put_signal, or
// g.sync() then fence_acq_rel_sys() then signal from one thread.
__device__ __forceinline__ void signal(const DeviceWindow& w, int peer, dc_u64 slot, dc_u64 value) {
  st_release_sys(peer_user_slot(w, peer, slot), value);
}

// Adds `delta` to `peer`'s user slot (release, system scope). For slots several senders bump.
__device__ __forceinline__ void signal_add(const DeviceWindow& w, int peer, dc_u64 slot,
                                           dc_u64 delta) {
  red_add_release_sys(peer_user_slot(w, peer, slot), delta);
}

// Sets `peer`'s user slot without ordering any data: only the value itself is communicated.
__device__ __forceinline__ void signal_relaxed(const DeviceWindow& w, int peer, dc_u64 slot,
                                               dc_u64 value) {
  st_relaxed_sys(peer_user_slot(w, peer, slot), value);
}

// Waits until this rank's user slot `slot` satisfies cmp(value, expected), bounded by
// w.timeout_ns. Called by every thread of `g`; thread 0 polls, then the group barriers, so all
// threads may read the data the signal announced once this returns true. Every thread gets the
// same result; on false (timeout or abort, already recorded) the group must stop and publish
// nothing more. `peer_hint` is the rank expected to signal, for the error report.
template <class G>
__device__ inline bool wait_signal(const G& g, const DeviceWindow& w, dc_u64 slot, dc_u64 expected,
                                   Cmp cmp = Cmp::Ge, int peer_hint = -1) {
  bool ok = true;
  if (g.thread_rank() == 0) {
    const WaitSite site{kOpWaitSignal, peer_hint, slot};
    ok = wait_until(error_state(w), w.timeout_ns, w.rank, own_user_slot(w, slot), expected, cmp,
                    site);
  }
  // any() is also the group barrier of the receive rule: acquire by thread 0, barrier, read.
  return !g.any(!ok);
}

#endif  // __CUDACC__

}  // namespace devcomm
