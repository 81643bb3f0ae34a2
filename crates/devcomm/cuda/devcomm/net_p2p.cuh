// devcomm/net_p2p.cuh: send/recv with a network peer through host staging and the proxy
// (docs/NETWORK.md, "Send/recv over the network"; the host side is src/net/route.rs and
// src/comm/net_p2p.rs). Rust twins of the structs: src/net/route.rs (static_asserts below,
// const assertions there, tests/net_layout.rs compares them).
//
// Staging (pinned host memory, mapped here and registered with UCX under `key`, the same
// offsets on every rank): two words per peer p, READY[p] (word 2p: chunks p sent here, set by
// p's proxy) and FREE[p] (word 2p + 1: chunks of ours p consumed, set by p's proxy); then an
// outbox and an inbox of `slots` slots per peer, each a 64-byte NetChunkHeader and
// `slot_bytes` of payload.
//
// Chunk j (cumulative per (peer, direction), counters in device memory so that consecutive
// calls and graph replays need no host step) goes through slot j % slots:
// - sender: waits until FREE >= j - slots + 1 (a credit), copies the payload into its outbox
//   slot and writes the header {kind, chunk, call, bytes}, then net_put_signal to the
//   receiver's inbox slot with READY = j + 1 (the proxy puts the data, flushes, then the word);
//   after the last chunk it waits until FREE covers every chunk of the call (the receiver took
//   them all, or refused the call);
// - receiver: waits until READY >= j + 1, checks the header against its own call BEFORE it
//   writes the destination, copies the payload out, and returns the slot with net_signal
//   FREE = j + 1. A header that differs is refused: the receiver sets the sender's FREE to
//   kNetRefused | field << 56 | its value (which ends the sender's wait at once), flushes that
//   through the proxy, then records kOpCallMismatch; the sender, seeing the refusal, records
//   it too. Both calls return CallMismatch naming the peer; nothing was written.
#pragma once

#include "devcomm/copy.cuh"
#include "devcomm/group.cuh"
#include "devcomm/net.cuh"

namespace devcomm {

constexpr dc_u32 kNetChunkKind = 0x5354454Eu;  // "NETS"
constexpr dc_u32 kNetChannelData = 0;
constexpr dc_u32 kNetChannelCredit = 1;
constexpr dc_u64 kNetRefused = 1ull << 63;
constexpr dc_u64 kNetHeaderBytes = 64;
// Call-mismatch fields (src/cuda/error_record.rs, call_mismatch_field).
constexpr dc_u32 kNetFieldKind = 1;
constexpr dc_u32 kNetFieldBytes = 2;
constexpr dc_u32 kNetFieldCall = 5;

struct NetChunkHeader {
  dc_u32 kind;         // @0  kNetChunkKind
  dc_u32 chunk;        // @4  index in the message
  dc_u64 call;         // @8  the sender's call number with this receiver
  dc_u64 bytes;        // @16 the message's size
  dc_u64 reserved[5];  // @24
};

struct NetP2PLaunch {
  NetQueues q;          // @0
  dc_u64 staging;       // @48  this rank's staging, as this device addresses it
  dc_u64 counters;      // @56  u64[world][4]: chunks sent, calls sent, chunks received, calls received
  dc_u64 slot_bytes;    // @64  payload per slot
  dc_u32 slots;         // @72  slots per (peer, direction)
  dc_u32 key;           // @76  registration of the staging
  dc_u64 send_buf;      // @80
  dc_u64 send_bytes;    // @88
  dc_u64 recv_buf;      // @96
  dc_u64 recv_bytes;    // @104
  dc_i32 send_peer;     // @112 -1: no send role
  dc_i32 recv_peer;     // @116 -1: no receive role
};

static_assert(sizeof(NetChunkHeader) == 64, "NetChunkHeader layout");
static_assert(DC_OFFSETOF(NetChunkHeader, bytes) == 16, "NetChunkHeader layout");
static_assert(sizeof(NetP2PLaunch) == 120, "NetP2PLaunch layout");
static_assert(DC_OFFSETOF(NetP2PLaunch, staging) == 48, "NetP2PLaunch layout");
static_assert(DC_OFFSETOF(NetP2PLaunch, send_peer) == 112, "NetP2PLaunch layout");

// Offsets in the staging (StagingLayout in Rust; tests/net_layout.rs compares the two on the
// host, hence host and device).
DC_HOST_DEVICE inline dc_u64 net_words_bytes(const NetP2PLaunch& a) {
  return (static_cast<dc_u64>(a.q.world_size) * 16 + 4095) / 4096 * 4096;
}
DC_HOST_DEVICE inline dc_u64 net_outbox(const NetP2PLaunch& a, int peer, dc_u64 slot) {
  return net_words_bytes(a) +
         (static_cast<dc_u64>(peer) * a.slots + slot) * (kNetHeaderBytes + a.slot_bytes);
}
DC_HOST_DEVICE inline dc_u64 net_inbox(const NetP2PLaunch& a, int sender, dc_u64 slot) {
  return net_words_bytes(a) +
         ((static_cast<dc_u64>(a.q.world_size) + sender) * a.slots + slot) *
             (kNetHeaderBytes + a.slot_bytes);
}

#if defined(__CUDACC__)

__device__ __forceinline__ dc_u64* net_word(const NetP2PLaunch& a, dc_u64 index) {
  return reinterpret_cast<dc_u64*>(a.staging) + index;
}
__device__ __forceinline__ DeviceErrorState* net_errors(const NetP2PLaunch& a) {
  return reinterpret_cast<DeviceErrorState*>(a.q.error_state);
}

// Records a call mismatch found by this rank against `peer` (no wait; aborts).
__device__ inline void net_record_mismatch(const NetP2PLaunch& a, int peer, dc_u32 field,
                                           dc_u64 local, dc_u64 remote) {
  record_wait_failure(net_errors(a), static_cast<dc_i32>(a.q.rank),
                      WaitSite{kOpCallMismatch, peer, field}, local, remote, 0);
}

// Sender, one thread: waits until FREE[peer] >= `needed` (bounded, kOpSendSlotFree). False when
// the wait failed (recorded) or the receiver refused the call (recorded here as a mismatch).
__device__ inline bool net_wait_free(const NetP2PLaunch& a, int peer, dc_u64 needed,
                                     dc_u64 slot) {
  const dc_u64* word = net_word(a, 2ull * peer + 1);
  if (!wait_until(net_errors(a), a.q.timeout_ns, static_cast<dc_i32>(a.q.rank), word, needed,
                  Cmp::Ge, WaitSite{kOpSendSlotFree, peer, slot}))
    return false;
  const dc_u64 seen = ld_acquire_sys(word);
  if (seen & kNetRefused) {
    const dc_u32 field = static_cast<dc_u32>((seen >> 56) & 0x7f);
    const dc_u64 local = field == kNetFieldBytes ? a.send_bytes : 0;
    net_record_mismatch(a, peer, field, local, seen & ((1ull << 56) - 1));
    return false;
  }
  return true;
}

// Receiver, one thread: the field in which the chunk's header differs from this call (0: none).
__device__ __forceinline__ dc_u32 net_header_differs(const volatile NetChunkHeader* h,
                                                     dc_u64 call, dc_u64 bytes, dc_u64 chunk) {
  if (h->kind != kNetChunkKind || h->chunk != chunk) return kNetFieldKind;
  if (h->bytes != bytes) return kNetFieldBytes;
  if (h->call != call) return kNetFieldCall;
  return 0;
}

// Receiver, one thread: refuses the call from `peer` (the sender learns it through its FREE
// word, flushed through the proxy before the abort stops it), then records the mismatch.
__device__ inline void net_refuse(const NetP2PLaunch& a, int peer, dc_u32 field, dc_u64 local,
                                  dc_u64 remote) {
  const dc_u64 word = kNetRefused | (static_cast<dc_u64>(field & 0x7f) << 56) |
                      (local & ((1ull << 56) - 1));
  fence_acq_rel_sys();
  net_enqueue(a.q, peer, kNetChannelCredit,
              net_signal_desc(a.key, 2ull * a.q.rank + 1, kNetSignalSet, word));
  NetDescriptor flush{};
  flush.op = kNetFlush;
  const dc_u64 seq = net_enqueue(a.q, peer, kNetChannelCredit, flush);
  NetQueueHeader* h = net_queue(a.q, peer, kNetChannelCredit);
  if (seq != 0)
    wait_until(net_errors(a), a.q.timeout_ns, static_cast<dc_i32>(a.q.rank), &h->done, seq,
               Cmp::Ge, WaitSite{kOpNetFlush, peer, kNetChannelCredit});
  net_record_mismatch(a, peer, field, local, remote);
}

#endif  // __CUDACC__

}  // namespace devcomm
