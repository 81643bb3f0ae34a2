// devcomm/window_net.cuh: a window's operations routed per peer. One kernel reaches its
// NVLink peers with loads and stores (put.cuh, window.cuh) and its network peers through the
// communicator's descriptor queues (net.cuh), which the proxy performs with UCX into the
// peer's registered window (docs/NETWORK.md, "Users' kernels and network peers").
//
// A kernel receives the window's DeviceWindow and its WindowNet (Window::net_handle) by value.
// The route of `peer` is its NVLink mapping when it has one, else the network (when the window
// has a network path: WindowNet::data_key != 0). A peer with neither traps, as put() does.
//
// Network operations name the source by its offset in THIS rank's window data (the transport
// reads it from the registered window), so the routed put copies from the own window on both
// routes. Signals and waits keep their meaning: user slot `slot` of the peer's pad; the
// receiver waits on its own pad (wait_signal, window.cuh).
//
// CALLER CONTRACT, network peers (net.cuh):
// - one producer per (peer, channel) at a time: give each block that talks to a peer its own
//   channel (`channel < n.channels`, else trap);
// - the source of a network put must stay unchanged until flush_routed on the same (peer,
//   channel) returned true;
// - a signal word written over the network has one writer (the rank whose slot it is) and goes
//   through one channel; signal_add_routed becomes a put of the running sum;
// - a signal orders the puts of its own channel before it (and every put the proxy had already
//   started on that peer); order puts of other channels first with flush_routed.
// Every routed operation returns the same bool to every thread of the group: false when a
// bounded wait gave up (recorded in the error state, abort raised): the group must stop and
// publish nothing more (wait.cuh).
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"
#include "devcomm/group.cuh"
#include "devcomm/copy.cuh"
#include "devcomm/window.cuh"
#include "devcomm/barrier.cuh"
#include "devcomm/put.cuh"
#include "devcomm/registered.cuh"
#include "devcomm/net.cuh"

namespace devcomm {

// A window's network path (WindowNetHandle in src/abi/net.rs); zero: none.
struct WindowNet {
  NetQueues queues;      // @0  the communicator's queues
  dc_u32 first_channel;  // @48 user channel c is queue channel first_channel + c
  dc_u32 channels;       // @52 user channels
  dc_u32 data_key;       // @56 registration of every rank's window data
  dc_u32 signal_key;     // @60 registration of every rank's signal pad
};

static_assert(sizeof(WindowNet) == 64, "WindowNet layout");
static_assert(DC_OFFSETOF(WindowNet, first_channel) == 48, "WindowNet layout");
static_assert(DC_OFFSETOF(WindowNet, signal_key) == 60, "WindowNet layout");

#if defined(__CUDACC__)

// Whether operations towards `peer` go through the network queues (no NVLink mapping and a
// network path); false for this rank and NVLink peers.
__device__ __forceinline__ bool is_network_peer(const DeviceWindow& w, const WindowNet& n,
                                                int peer) {
  return peer >= 0 && peer < w.world_size && get_nvlink_address(w, peer) == nullptr &&
         n.data_key != 0;
}

// The queue channel of user channel `channel` towards network peer `peer`; traps without a
// network path or on a channel out of range.
__device__ __forceinline__ dc_u32 user_queue_channel(const DeviceWindow& w, const WindowNet& n,
                                                     int peer, dc_u32 channel) {
  if (!is_network_peer(w, n, peer) || channel >= n.channels) __trap();
  return n.first_channel + channel;
}

// Whether [offset, offset + bytes) lies in the window's data.
__device__ __forceinline__ bool in_window(const DeviceWindow& w, dc_u64 offset, dc_u64 bytes) {
  return offset <= w.data_bytes && bytes <= w.data_bytes - offset;
}

// One result for the whole group from thread 0's descriptor seq (0: the wait gave up).
template <class G>
__device__ __forceinline__ bool group_enqueued(const G& g, dc_u64 seq) {
  return !g.any(g.thread_rank() == 0 && seq == 0);
}

// Copies `bytes` of this rank's window data at `src_offset` into `peer`'s window data at
// `dst_offset`. Called by every thread of `g`. No signal: the peer learns of the data through
// a later signal on the same channel (network) or any later signal (NVLink). Traps when a range
// exceeds the window. NVLink: done when it returns; network: enqueued (flush_routed completes
// it and frees the source).
template <class G>
__device__ inline bool put_routed(const G& g, const DeviceWindow& w, const WindowNet& n, int peer,
                                  dc_u64 dst_offset, dc_u64 src_offset, dc_u64 bytes,
                                  dc_u32 channel = 0) {
  if (!in_window(w, src_offset, bytes) || !in_window(w, dst_offset, bytes)) __trap();
  const unsigned char* own = reinterpret_cast<const unsigned char*>(w.data);
  if (!is_network_peer(w, n, peer)) {
    put(g, w, peer, dst_offset, own + src_offset, bytes);
    return true;
  }
  const dc_u32 ch = user_queue_channel(w, n, peer, channel);
  return group_enqueued(g, net_put(g, n.queues, peer, ch, n.data_key, src_offset, dst_offset,
                                   bytes));
}

// put_routed, then sets `peer`'s user slot `slot` to `value`; the peer sees the value only
// after the data (NVLink: the fence of put_signal; network: the proxy flushes the endpoint
// between the put and the signal). The receiver does wait_signal(slot, value).
template <class G>
__device__ inline bool put_signal_routed(const G& g, const DeviceWindow& w, const WindowNet& n,
                                         int peer, dc_u64 dst_offset, dc_u64 src_offset,
                                         dc_u64 bytes, dc_u64 slot, dc_u64 value,
                                         dc_u32 channel = 0) {
  if (!in_window(w, src_offset, bytes) || !in_window(w, dst_offset, bytes)) __trap();
  const unsigned char* own = reinterpret_cast<const unsigned char*>(w.data);
  if (!is_network_peer(w, n, peer)) {
    put_signal(g, w, peer, dst_offset, own + src_offset, bytes, slot, value);
    return true;
  }
  if (slot >= w.signal_count) __trap();
  const dc_u32 ch = user_queue_channel(w, n, peer, channel);
  const dc_u64 pad_slot = static_cast<dc_u64>(w.world_size) + slot;
  return group_enqueued(g, net_put_signal(g, n.queues, peer, ch, n.data_key, src_offset,
                                          dst_offset, bytes, n.signal_key, pad_slot, value));
}

// Sets (add = false) or adds to (add = true) `peer`'s user slot, ordered after the group's
// earlier writes (NVLink) or the channel's earlier puts (network).
template <class G>
__device__ inline bool signal_routed_op(const G& g, const DeviceWindow& w, const WindowNet& n,
                                        int peer, dc_u64 slot, dc_u64 value, bool add,
                                        dc_u32 channel) {
  if (!is_network_peer(w, n, peer)) {
    g.sync();
    if (g.thread_rank() == 0) {
      fence_acq_rel_sys();  // the group's stores before the signal (see put_signal)
      if (add) {
        signal_add(w, peer, slot, value);
      } else {
        signal(w, peer, slot, value);
      }
    }
    return true;
  }
  if (slot >= w.signal_count) __trap();
  const dc_u32 ch = user_queue_channel(w, n, peer, channel);
  const dc_u64 pad_slot = static_cast<dc_u64>(w.world_size) + slot;
  const dc_u64 seq =
      add ? net_counter_add(g, n.queues, peer, ch, n.signal_key, pad_slot, value)
          : net_signal(g, n.queues, peer, ch, n.signal_key, pad_slot, value);
  return group_enqueued(g, seq);
}

template <class G>
__device__ inline bool signal_routed(const G& g, const DeviceWindow& w, const WindowNet& n,
                                     int peer, dc_u64 slot, dc_u64 value, dc_u32 channel = 0) {
  return signal_routed_op(g, w, n, peer, slot, value, false, channel);
}

// A counter: over the network, one writer per slot (the proxy puts its running sum).
template <class G>
__device__ inline bool signal_add_routed(const G& g, const DeviceWindow& w, const WindowNet& n,
                                         int peer, dc_u64 slot, dc_u64 delta,
                                         dc_u32 channel = 0) {
  return signal_routed_op(g, w, n, peer, slot, delta, true, channel);
}

// Completes the group's earlier operations towards `peer` on `channel`: afterwards their
// sources may be rewritten and their data is in the peer's window. NVLink: a fence.
template <class G>
__device__ inline bool flush_routed(const G& g, const DeviceWindow& w, const WindowNet& n,
                                    int peer, dc_u32 channel = 0) {
  if (!is_network_peer(w, n, peer)) {
    g.sync();
    if (g.thread_rank() == 0) fence_acq_rel_sys();
    return true;
  }
  return net_flush(g, n.queues, peer, user_queue_channel(w, n, peer, channel));
}

// Copies `bytes` of this rank's buffer of registration `reg` at `src_offset` into `peer`'s
// buffer of the same registration at `dst_offset`: stores when the registration maps `peer`
// here, else a network put under the registration's key (reg->lkey) through the window's
// queues. Traps when the source range exceeds this rank's buffer, or when `peer` has neither
// route (no mapping, and no key or no network path in `n`). The peer's bounds: over NVLink the
// caller's (as for get_nvlink_address); over the network the proxy refuses a put past the
// peer's buffer (kOpNetBadDescriptor recorded, nothing written). Signal it with signal_routed
// on the same channel, which orders it.
template <class G>
__device__ inline bool put_registered_routed(const G& g, const DeviceWindow& w, const WindowNet& n,
                                             const RegisteredBuffer* reg, int peer,
                                             dc_u64 dst_offset, dc_u64 src_offset, dc_u64 bytes,
                                             dc_u32 channel = 0) {
  if (reg == nullptr || src_offset > reg->size || bytes > reg->size - src_offset) __trap();
  const unsigned char* src = reinterpret_cast<const unsigned char*>(reg->base_ptr) + src_offset;
  unsigned char* dst = static_cast<unsigned char*>(get_nvlink_address(reg, peer));
  if (dst != nullptr) {
    copy_bytes(g, dst + dst_offset, src, bytes);
    return true;
  }
  const dc_u32 key = reg->lkey;
  if (key == 0) __trap();
  const dc_u32 ch = user_queue_channel(w, n, peer, channel);
  return group_enqueued(g, net_put(g, n.queues, peer, ch, key, src_offset, dst_offset, bytes));
}

// barrier() over every peer, NVLink and network: arrival at a network peer is a signal set to
// this rank's epoch in its barrier slot (one writer), through `channel`, ordered after that
// channel's earlier puts. Rules as for barrier() (barrier.cuh): one group per rank per barrier;
// the same bool to every thread. Traps when a peer has neither route.
template <class G>
__device__ inline bool barrier_routed(const G& g, const DeviceWindow& w, const WindowNet& n,
                                      dc_u32 channel = 0) {
  return barrier_over(
      g, w, [](int) { return true; },
      [&](int p, dc_u64 epoch) {
        if (!is_network_peer(w, n, p)) {
          dc_u64* pad = peer_signal_pad(w, p);
          if (pad == nullptr) __trap();
          red_add_release_sys(pad + w.rank, 1);
          return true;
        }
        const NetDescriptor d =
            net_signal_desc(n.signal_key, static_cast<dc_u64>(w.rank), kNetSignalSet, epoch);
        return net_enqueue(n.queues, p, user_queue_channel(w, n, p, channel), d) != 0;
      });
}

#endif  // __CUDACC__

}  // namespace devcomm
