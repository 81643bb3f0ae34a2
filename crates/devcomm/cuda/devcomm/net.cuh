// devcomm/net.cuh: the device side of the network transport. For a peer reached over the
// network, a kernel does not store into the peer's memory: it writes fixed-size descriptors
// into a queue per (peer, channel) in host-mapped memory, and the proxy thread of the
// communicator performs them through UCX (src/net/, docs/NETWORK.md).
//
// Every struct here has a Rust twin in src/abi/net.rs with the same size and offsets
// (static_assert below, const assertions in Rust, tests/net_layout.rs compares them).
//
// Queue protocol (single producer per queue: one thread of the kernel at a time):
// - the producer owns `head`; it may write position p only while p < tail + capacity (a
//   credit), else it waits (bounded, wait.cuh) and on timeout records kOpNetQueueFull;
// - it writes the descriptor's fields, then publishes the entry with a release store of
//   seq = p + 1; the proxy consumes entries in order and stores `tail` (credits back);
// - a flush descriptor makes the proxy complete every earlier operation of the queue and then
//   store `done = seq`; net_flush waits (bounded) for it.
// Waits on signals from network peers are the ordinary bounded waits (wait_signal): the
// proxy writes the signal into this rank's pad only after the data is in place.
//
// CALLER CONTRACT: the source of a put must stay unchanged until a later net_flush on the same
// queue returned true (the proxy reads it after the descriptor is consumed). A signal word
// written over the network has one writer, the rank whose slot it is, and goes through one
// channel (the proxy turns an add into a put of its running sum; channels are not ordered with
// one another).
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"
#include "devcomm/wait.cuh"

namespace devcomm {

// What a descriptor asks the proxy to do (NetOp in Rust).
enum NetOp : dc_u32 { kNetPut = 1, kNetPutSignal = 2, kNetSignal = 3, kNetFlush = 4 };
// How a signal changes the peer's word (SignalOp in Rust).
enum NetSignalOp : dc_u32 { kNetSignalNone = 0, kNetSignalSet = 1, kNetSignalAdd = 2 };
// Error-record op codes of the network layer: kOpNet* in handles.cuh (src/net/record.rs, `op`).

// One queue entry, 64 bytes; `seq` is written last.
struct NetDescriptor {
  dc_u32 op;             // @0  NetOp
  dc_u32 key;            // @4  registration of the data (source here, destination on the peer)
  dc_u64 src_offset;     // @8  offset of the source in the local registration
  dc_u64 dst_offset;     // @16 offset of the destination in the peer's registration
  dc_u64 bytes;          // @24 bytes to copy
  dc_u32 signal_key;     // @32 registration of the peer's signal word
  dc_u32 signal_op;      // @36 NetSignalOp
  dc_u64 signal_offset;  // @40 byte offset of the signal word (8-byte aligned)
  dc_u64 signal_value;   // @48 value set or added
  dc_u64 seq;            // @56 position + 1; marks the entry full
};

// The shared words of one queue, 128 bytes; the entries follow it.
struct NetQueueHeader {
  dc_u64 head;          // @0  descriptors written (producer only)
  dc_u64 reserved0[7];  // @8
  dc_u64 tail;          // @64 descriptors consumed (proxy only): the producer's credits
  dc_u64 done;          // @72 seq of the last completed flush (proxy only)
  dc_u64 reserved1[6];  // @80
};

// Where the queues are; passed to kernels by value.
struct NetQueues {
  dc_u64 base;         // @0  queue (peer 0, channel 0), as this device addresses it
  dc_u64 stride;       // @8  bytes from one queue to the next
  dc_u32 capacity;     // @16 entries per queue
  dc_u32 channels;     // @20 queues per peer
  dc_u32 world_size;   // @24
  dc_u32 rank;         // @28 this rank
  dc_u64 error_state;  // @32 DeviceErrorState* (host-mapped)
  dc_u64 timeout_ns;   // @40 bound of every wait
};

static_assert(sizeof(NetDescriptor) == 64, "NetDescriptor layout");
static_assert(DC_OFFSETOF(NetDescriptor, signal_key) == 32, "NetDescriptor layout");
static_assert(DC_OFFSETOF(NetDescriptor, seq) == 56, "NetDescriptor layout");
static_assert(sizeof(NetQueueHeader) == 128, "NetQueueHeader layout");
static_assert(DC_OFFSETOF(NetQueueHeader, tail) == 64, "NetQueueHeader layout");
static_assert(DC_OFFSETOF(NetQueueHeader, done) == 72, "NetQueueHeader layout");
static_assert(sizeof(NetQueues) == 48, "NetQueues layout");
static_assert(DC_OFFSETOF(NetQueues, error_state) == 32, "NetQueues layout");

#if defined(__CUDACC__)

// The header of (peer, channel)'s queue; null when out of range.
__device__ __forceinline__ NetQueueHeader* net_queue(const NetQueues& q, int peer,
                                                     dc_u32 channel) {
  if (peer < 0 || static_cast<dc_u32>(peer) >= q.world_size || channel >= q.channels)
    return nullptr;
  const dc_u64 index = static_cast<dc_u64>(peer) * q.channels + channel;
  return reinterpret_cast<NetQueueHeader*>(q.base + index * q.stride);
}

// Writes `d` at the next position of (peer, channel)'s queue, waiting (bounded) for a credit.
// Called by ONE thread. Returns the descriptor's seq, or 0 when the wait gave up (recorded as
// kOpNetQueueFull, abort raised: see wait.cuh's CALLER CONTRACT) or the queue does not exist.
__device__ inline dc_u64 net_enqueue(const NetQueues& q, int peer, dc_u32 channel,
                                     NetDescriptor d) {
  NetQueueHeader* h = net_queue(q, peer, channel);
  if (h == nullptr) return 0;
  DeviceErrorState* err = reinterpret_cast<DeviceErrorState*>(q.error_state);
  const dc_u64 head = h->head;
  if (head >= q.capacity) {
    const WaitSite site{kOpNetQueueFull, peer, channel};
    if (!wait_until(err, q.timeout_ns, static_cast<dc_i32>(q.rank), &h->tail,
                    head - q.capacity + 1, Cmp::Ge, site))
      return 0;
  }
  NetDescriptor* e = reinterpret_cast<NetDescriptor*>(reinterpret_cast<unsigned char*>(h) +
                                                      sizeof(NetQueueHeader)) +
                     head % q.capacity;
  volatile NetDescriptor* ve = e;
  ve->op = d.op;
  ve->key = d.key;
  ve->src_offset = d.src_offset;
  ve->dst_offset = d.dst_offset;
  ve->bytes = d.bytes;
  ve->signal_key = d.signal_key;
  ve->signal_op = d.signal_op;
  ve->signal_offset = d.signal_offset;
  ve->signal_value = d.signal_value;
  // The fields (and, through the caller's fence, the source data) before the entry is seen.
  st_release_sys(&e->seq, head + 1);
  h->head = head + 1;
  return head + 1;
}

// Descriptor builders (pure).
__device__ __forceinline__ NetDescriptor net_put_desc(dc_u32 key, dc_u64 src_offset,
                                                      dc_u64 dst_offset, dc_u64 bytes) {
  NetDescriptor d{};
  d.op = kNetPut;
  d.key = key;
  d.src_offset = src_offset;
  d.dst_offset = dst_offset;
  d.bytes = bytes;
  return d;
}

__device__ __forceinline__ NetDescriptor net_signal_desc(dc_u32 signal_key, dc_u64 slot,
                                                         NetSignalOp op, dc_u64 value) {
  NetDescriptor d{};
  d.op = kNetSignal;
  d.signal_key = signal_key;
  d.signal_op = op;
  d.signal_offset = slot * 8;
  d.signal_value = value;
  return d;
}

// Publishes the group's writes to the source, then one thread enqueues `d`. Called by every
// thread of `g`; returns the seq (0 on failure) in thread 0, 0 elsewhere.
template <class G>
__device__ inline dc_u64 net_submit(const G& g, const NetQueues& q, int peer, dc_u32 channel,
                                    const NetDescriptor& d) {
  g.sync();
  dc_u64 seq = 0;
  if (g.thread_rank() == 0) {
    fence_acq_rel_sys();  // the group's stores to the source are visible to the proxy/NIC
    seq = net_enqueue(q, peer, channel, d);
  }
  return seq;
}

// put: `bytes` of registration `key` at `src_offset` to the peer's registration at
// `dst_offset`. No signal: the peer learns of the data through a later signal.
template <class G>
__device__ inline dc_u64 net_put(const G& g, const NetQueues& q, int peer, dc_u32 channel,
                                 dc_u32 key, dc_u64 src_offset, dc_u64 dst_offset,
                                 dc_u64 bytes) {
  return net_submit(g, q, peer, channel, net_put_desc(key, src_offset, dst_offset, bytes));
}

// put, then sets the peer's slot `slot` of pad registration `signal_key` to `value`; the peer
// sees the signal only after the data (the proxy flushes the endpoint in between).
template <class G>
__device__ inline dc_u64 net_put_signal(const G& g, const NetQueues& q, int peer,
                                        dc_u32 channel, dc_u32 key, dc_u64 src_offset,
                                        dc_u64 dst_offset, dc_u64 bytes, dc_u32 signal_key,
                                        dc_u64 slot, dc_u64 value) {
  NetDescriptor d = net_signal_desc(signal_key, slot, kNetSignalSet, value);
  d.op = kNetPutSignal;
  d.key = key;
  d.src_offset = src_offset;
  d.dst_offset = dst_offset;
  d.bytes = bytes;
  return net_submit(g, q, peer, channel, d);
}

// The signal alone (set), ordered after every earlier put of the queue.
template <class G>
__device__ inline dc_u64 net_signal(const G& g, const NetQueues& q, int peer, dc_u32 channel,
                                    dc_u32 signal_key, dc_u64 slot, dc_u64 value) {
  return net_submit(g, q, peer, channel, net_signal_desc(signal_key, slot, kNetSignalSet, value));
}

// A counter: adds `value` to the peer's slot, ordered after every earlier put of the queue.
template <class G>
__device__ inline dc_u64 net_counter_add(const G& g, const NetQueues& q, int peer,
                                         dc_u32 channel, dc_u32 signal_key, dc_u64 slot,
                                         dc_u64 value) {
  return net_submit(g, q, peer, channel, net_signal_desc(signal_key, slot, kNetSignalAdd, value));
}

// Completes every earlier operation of (peer, channel)'s queue: afterwards their sources may
// be reused and their data is at the peer. Called by every thread of `g`; true in every
// thread when done, false when a wait gave up (kOpNetQueueFull or kOpNetFlush recorded).
template <class G>
__device__ inline bool net_flush(const G& g, const NetQueues& q, int peer, dc_u32 channel) {
  NetDescriptor d{};
  d.op = kNetFlush;
  const dc_u64 seq = net_submit(g, q, peer, channel, d);
  bool ok = true;
  if (g.thread_rank() == 0) {
    NetQueueHeader* h = net_queue(q, peer, channel);
    const WaitSite site{kOpNetFlush, peer, channel};
    ok = seq != 0 && wait_until(reinterpret_cast<DeviceErrorState*>(q.error_state),
                                q.timeout_ns, static_cast<dc_i32>(q.rank), &h->done, seq,
                                Cmp::Ge, site);
  }
  return !g.any(!ok);
}

#endif  // __CUDACC__

}  // namespace devcomm
