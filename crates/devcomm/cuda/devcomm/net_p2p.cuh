// devcomm/net_p2p.cuh: one call's transfer with a network peer through host staging and the
// proxy, for send/recv (kernels/sendrecv_net.cu) and the collectives' network roles
// (collective.cuh) (docs/NETWORK.md, "Send/recv over the network"; the host side is
// src/net/route.rs and src/comm/net_p2p.rs). Rust twins of the structs: src/abi/net.rs and src/net/route.rs (static_asserts below,
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
//   slot and writes the header {kind, chunk, call, bytes, op, rows}, then net_put_signal to the
//   receiver's inbox slot with READY = j + 1 (the proxy puts the data, flushes, then the word);
//   after the last chunk it waits until FREE covers every chunk of the call (the receiver took
//   them all, or refused the call);
// - receiver: waits until READY >= j + 1, checks the header against its own call BEFORE it
//   writes the destination, copies the payload out, and returns the slot with net_signal
//   FREE = j + 1. A header that differs is refused: the receiver sets the sender's FREE to
//   kNetRefused | field << 56 | its value (which ends the sender's wait at once), flushes that
//   through the proxy, then records kOpCallMismatch; the sender, seeing the refusal, records
//   it too. Both calls return CallMismatch naming the peer; nothing was written.
// A send/recv call of 0 bytes has no chunk; a collective's call always has at least one, so
// that its receiver checks what the call is and, for all-to-all-v, learns the count.
#pragma once

#include "devcomm/call_word.cuh"
#include "devcomm/copy.cuh"
#include "devcomm/group.cuh"
#include "devcomm/net.cuh"

namespace devcomm {

constexpr dc_u32 kNetChunkKind = 0x5354454Eu;  // "NETS": a send/recv call's chunk
constexpr dc_u32 kNetCollKind = 0x4C4F434Eu;   // "NCOL": a collective's chunk
constexpr dc_u32 kNetChannelData = 0;
constexpr dc_u32 kNetChannelCredit = 1;
constexpr dc_u64 kNetRefused = 1ull << 63;
constexpr dc_u64 kNetHeaderBytes = 64;
// A mismatch names the fields of the header by the call word's codes (call_word.cuh, kField*).

struct NetChunkHeader {
  dc_u32 kind;         // @0  kNetChunkKind or kNetCollKind
  dc_u32 chunk;        // @4  index in the message
  dc_u64 call;         // @8  the sender's call number with this receiver
  dc_u64 bytes;        // @16 the message's size (a collective: its wire bytes)
  dc_u64 op;           // @24 a collective's operation (CollMode + 1); 0 for send/recv
  dc_u64 rows;         // @32 all-to-all-v: the rows sent (its count exchange); 0 otherwise
  dc_u64 reserved[3];  // @40
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
static_assert(DC_OFFSETOF(NetChunkHeader, rows) == 32, "NetChunkHeader layout");
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

// What every chunk of a call says of it besides its index (the chunk's header), and what the
// receiver expects of it.
struct NetCallDesc {
  dc_u32 kind;   // kNetChunkKind (send/recv) or kNetCollKind (a collective)
  dc_u64 bytes;  // the message's bytes (a collective: its wire bytes with this peer)
  dc_u64 op;     // a collective's operation (CollMode + 1); 0 for send/recv
  dc_u64 rows;   // all-to-all-v: the rows sent; 0 otherwise
};

// A kind word as the agreement's field 1 reports it (0: send/recv, 2: collective); any other
// word as it is.
__device__ __forceinline__ dc_u64 net_kind_value(dc_u32 kind) {
  return kind == kNetChunkKind ? 0 : kind == kNetCollKind ? 2 : kind;
}

// This side's value of a mismatch field, for the record.
__device__ __forceinline__ dc_u64 net_field_value(const NetCallDesc& d, dc_u64 call,
                                                  dc_u32 field) {
  switch (field) {
    case kFieldKind: return net_kind_value(d.kind);
    case kFieldCollOp: return d.op;
    case kFieldP2PBytes:
    case kFieldCollBytes: return d.bytes;
    default: return call;
  }
}

// Sender, one thread: waits until FREE[peer] >= `needed` (bounded, kOpSendSlotFree). False when
// the wait failed (recorded) or the receiver refused the call (recorded here as a mismatch,
// with this side's value of the field from `d` and `call`).
__device__ inline bool net_wait_free(const NetP2PLaunch& a, int peer, dc_u64 needed,
                                     dc_u64 slot, const NetCallDesc& d, dc_u64 call) {
  const dc_u64* word = net_word(a, 2ull * peer + 1);
  if (!wait_until(net_errors(a), a.q.timeout_ns, static_cast<dc_i32>(a.q.rank), word, needed,
                  Cmp::Ge, WaitSite{kOpSendSlotFree, peer, slot}))
    return false;
  const dc_u64 seen = ld_acquire_sys(word);
  if (seen & kNetRefused) {
    const dc_u32 field = static_cast<dc_u32>((seen >> 56) & 0x7f);
    net_record_mismatch(a, peer, field, net_field_value(d, call, field),
                        seen & ((1ull << 56) - 1));
    return false;
  }
  return true;
}

// Receiver, one thread: the field in which chunk `chunk`'s header differs from the expected
// call (0: none), the header's value in `remote`. `any_size`: the size is not compared (an
// all-to-all-v's first chunk, which tells it).
__device__ inline dc_u32 net_header_differs(const volatile NetChunkHeader* h,
                                            const NetCallDesc& e, dc_u64 call, dc_u64 chunk,
                                            bool any_size, dc_u64& remote) {
  const dc_u32 kind = h->kind;
  if (kind != e.kind || h->chunk != chunk) {
    remote = net_kind_value(kind);
    return kFieldKind;
  }
  if (h->op != e.op) {
    remote = h->op;
    return kFieldCollOp;
  }
  if (!any_size && h->bytes != e.bytes) {
    remote = h->bytes;
    return e.kind == kNetCollKind ? kFieldCollBytes : kFieldP2PBytes;
  }
  if (h->call != call) {
    remote = h->call;
    return kFieldNetCall;
  }
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

// Receiver, one thread: waits until chunk j (chunk i of the call `call`) from `peer` is in and
// checks its header against `e` before anything is written; a difference refuses the call.
// With `any_size`, chunk 0 tells the call's size: its bytes and rows go into `e`. False after a
// failed wait or a refusal (both recorded).
__device__ inline bool net_take_chunk(const NetP2PLaunch& a, int peer, dc_u64 j, dc_u64 i,
                                      dc_u64 call, NetCallDesc& e, bool any_size) {
  const dc_u64 slot = j % a.slots;
  if (!wait_until(net_errors(a), a.q.timeout_ns, static_cast<dc_i32>(a.q.rank),
                  net_word(a, 2ull * peer), j + 1, Cmp::Ge,
                  WaitSite{kOpRecvSlotFull, peer, slot}))
    return false;
  const volatile NetChunkHeader* h = reinterpret_cast<const volatile NetChunkHeader*>(
      reinterpret_cast<const unsigned char*>(a.staging) + net_inbox(a, peer, slot));
  dc_u64 remote = 0;
  const dc_u32 field = net_header_differs(h, e, call, i, any_size && i == 0, remote);
  if (field != 0) {
    net_refuse(a, peer, field, net_field_value(e, call, field), remote);
    return false;
  }
  if (any_size && i == 0) {
    e.bytes = h->bytes;
    e.rows = h->rows;
  }
  return true;
}

// Sends one call to `peer`, every thread of block g: the message in ceil(d.bytes / slot_bytes)
// chunks, at least `min_chunks` (a collective sends one even with nothing to move, so that its
// receiver learns of the call); fill(g, payload, off, len) writes each chunk's payload into
// the outbox slot. Counters [peer][0..2) (chunks sent, calls sent) advance once the receiver
// took every chunk. False after a failure (recorded: the communicator is aborted).
template <class G, class Fill>
__device__ bool net_send_call(const G& g, const NetP2PLaunch& a, int peer, const NetCallDesc& d,
                              dc_u64 min_chunks, Fill fill) {
  dc_u64* ctr = reinterpret_cast<dc_u64*>(a.counters) + 4ull * peer;
  const dc_u64 sent = ctr[0];
  const dc_u64 call = ctr[1] + 1;
  dc_u64 n = (d.bytes + a.slot_bytes - 1) / a.slot_bytes;
  if (n < min_chunks) n = min_chunks;
  unsigned char* staging = reinterpret_cast<unsigned char*>(a.staging);
  for (dc_u64 i = 0; i < n; ++i) {
    const dc_u64 j = sent + i;
    const dc_u64 slot = j % a.slots;
    bool ok = true;
    if (g.thread_rank() == 0 && j >= a.slots)
      ok = net_wait_free(a, peer, j - a.slots + 1, slot, d, call);
    if (g.any(!ok)) return false;
    const dc_u64 off = i * a.slot_bytes;
    const dc_u64 rest = d.bytes > off ? d.bytes - off : 0;
    const dc_u64 len = rest < a.slot_bytes ? rest : a.slot_bytes;
    const dc_u64 out = net_outbox(a, peer, slot);
    if (len > 0) fill(g, staging + out + kNetHeaderBytes, off, len);
    if (g.thread_rank() == 0) {
      volatile NetChunkHeader* h = reinterpret_cast<volatile NetChunkHeader*>(staging + out);
      h->kind = d.kind;
      h->chunk = static_cast<dc_u32>(i);
      h->call = call;
      h->bytes = d.bytes;
      h->op = d.op;
      h->rows = d.rows;
    }
    // net_submit syncs the block and fences before the descriptor is published.
    const dc_u64 seq = net_put_signal(g, a.q, peer, kNetChannelData, a.key, out,
                                      net_inbox(a, static_cast<int>(a.q.rank), slot),
                                      kNetHeaderBytes + len, a.key, 2ull * a.q.rank, j + 1);
    if (g.any(g.thread_rank() == 0 && seq == 0)) return false;
  }
  // Every chunk taken (or the call refused) before the call ends.
  bool ok = true;
  if (g.thread_rank() == 0) ok = net_wait_free(a, peer, sent + n, (sent + n) % a.slots, d, call);
  if (g.any(!ok)) return false;
  if (g.thread_rank() == 0) {
    ctr[0] = sent + n;
    ctr[1] = call;
  }
  return true;
}

// Receives one call from `peer`, every thread of block g: for each chunk, waits for it and
// checks its header before anything is written (net_take_chunk), then drain(g, payload, off,
// len) and hands the slot back. `e`: the expected call, in ceil(e.bytes / slot_bytes) chunks,
// at least `min_chunks`; with `any_size` its size comes from chunk 0 instead (all-to-all-v:
// at least one chunk). start(e) runs once on every thread, after chunk 0 was checked and
// before it is drained (false: stop; it recorded why). Counters [peer][2..4) (chunks received,
// calls received). False after a failure.
template <class G, class Start, class Drain>
__device__ bool net_recv_call(const G& g, const NetP2PLaunch& a, int peer, NetCallDesc e,
                              dc_u64 min_chunks, bool any_size, Start start, Drain drain) {
  __shared__ dc_u64 told[2];  // chunk 0's bytes and rows, from thread 0 to the block
  dc_u64* ctr = reinterpret_cast<dc_u64*>(a.counters) + 4ull * peer;
  const dc_u64 received = ctr[2];
  const dc_u64 call = ctr[3] + 1;
  dc_u64 n = any_size ? 1 : (e.bytes + a.slot_bytes - 1) / a.slot_bytes;
  if (n < min_chunks) n = min_chunks;
  const unsigned char* staging = reinterpret_cast<const unsigned char*>(a.staging);
  for (dc_u64 i = 0; i < n; ++i) {
    const dc_u64 j = received + i;
    bool ok = true;
    if (g.thread_rank() == 0) {
      ok = net_take_chunk(a, peer, j, i, call, e, any_size);
      if (ok && i == 0) {
        told[0] = e.bytes;
        told[1] = e.rows;
      }
    }
    if (g.any(!ok)) return false;  // any() orders thread 0's acquire before the reads below
    if (i == 0) {
      e.bytes = told[0];
      e.rows = told[1];
      if (any_size) {
        n = (e.bytes + a.slot_bytes - 1) / a.slot_bytes;
        if (n < 1) n = 1;
      }
      if (!start(e)) return false;
    }
    const dc_u64 off = i * a.slot_bytes;
    const dc_u64 rest = e.bytes > off ? e.bytes - off : 0;
    const dc_u64 len = rest < a.slot_bytes ? rest : a.slot_bytes;
    if (len > 0) drain(g, staging + net_inbox(a, peer, j % a.slots) + kNetHeaderBytes, off, len);
    // net_submit syncs the block and fences: the slot is read before it is handed back.
    const dc_u64 seq =
        net_signal(g, a.q, peer, kNetChannelCredit, a.key, 2ull * a.q.rank + 1, j + 1);
    if (g.any(g.thread_rank() == 0 && seq == 0)) return false;
  }
  if (g.thread_rank() == 0) {
    ctr[2] = received + n;
    ctr[3] = call;
  }
  return true;
}

#endif  // __CUDACC__

}  // namespace devcomm
