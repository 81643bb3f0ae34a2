// devcomm/transfer.cuh: the send/recv protocol of one (peer, direction), shared by the send/recv
// kernels (kernels/sendrecv.cu) and the collectives (devcomm/collective.cuh). The protocol is
// docs/PROTOCOL.md: the bulk path stages chunks through per-channel slots with TAIL/HEAD
// signals, the low-latency path writes flag-in-data lines.
//
// The protocol (waits, slots, signals, counters) is separate from what moves the bytes: each
// function takes a *mover* that copies one chunk or one low-latency unit. Send/recv moves bytes
// (ByteSend / ByteRecv below); collectives move tiles through the user's hooks. Every byte
// count here is a count of *wire* bytes, the bytes that cross NVLink.
//
// A mover for the sending side provides
//   static constexpr dc_u64 kUnit;                         // 8 or 16: low-latency unit bytes
//   template <class G> void chunk(const G&, char* slot, dc_u64 off, dc_u64 n) const;
//       writes wire bytes [off, off + n) of the message into `slot` (called by all of G)
//   void unit(dc_u64 off, dc_u64 n, dc_u64 (&v)[kUnit / 8]) const;
//       one thread: the wire bytes [off, off + n) (n <= kUnit) as kUnit / 8 words
// and a mover for the receiving side
//   static constexpr dc_u64 kUnit;
//   template <class G> void chunk(const G&, const char* slot, dc_u64 off, dc_u64 n,
//                                 bool remote) const;   // remote: `slot` is the sender's memory
//   void unit(dc_u64 off, dc_u64 n, const dc_u64 (&v)[kUnit / 8]) const;
#pragma once

#include "devcomm/devcomm.cuh"
#include "devcomm/p2p.cuh"

namespace devcomm {
namespace p2p {

#if defined(__CUDACC__)

struct Span {
  dc_u64 begin;
  dc_u64 len;
};

// Block b's share of `bytes` split over `blocks`, in multiples of `align` bytes. Sender and
// receiver compute the same spans, hence the same chunk counts and step counters.
__device__ __forceinline__ Span block_span(dc_u64 bytes, dc_u32 blocks, dc_u32 b, dc_u64 align) {
  dc_u64 per = (bytes + blocks - 1) / blocks;
  per = (per + align - 1) / align * align;
  const dc_u64 begin = per * b < bytes ? per * b : bytes;
  const dc_u64 end = begin + per < bytes ? begin + per : bytes;
  return Span{begin, end - begin};
}

__device__ __forceinline__ bool bounded_wait(const P2PLaunch& a, const dc_u64* addr,
                                             dc_u64 expected, DeviceOp op, int peer,
                                             dc_u64 slot) {
  return wait_until(error_state(a.w), a.w.timeout_ns, a.w.rank, addr, expected, Cmp::Ge,
                    WaitSite{op, peer, slot});
}

// Publishes `value` into `flag` after everything the group wrote before its last barrier.
__device__ __forceinline__ void publish(dc_u64* flag, dc_u64 value) {
  fence_acq_rel_sys();
  st_release_sys(flag, value);
}

// Bulk send of channel c's span (c of nch channels) of side `s`. `g` is the channel's warp:
// lane 0 checks that the next chunk's slot is free while the lanes finish copying this chunk,
// then publishes it.
template <class G, class M>
__device__ void bulk_send(const G& g, const P2PLaunch& a, const P2PSide& s, const M& m, dc_u32 c,
                          dc_u32 nch) {
  const Span sp = block_span(s.bytes, nch, c, 16);
  const dc_u64 nchunks = (sp.len + s.chunk_bytes - 1) / s.chunk_bytes;
  if (nchunks == 0) return;
  dc_u64* steps = reinterpret_cast<dc_u64*>(s.steps);
  const dc_u64 step0 = steps[c];  // written by an earlier kernel: ordered by the kernel boundary
  // Push: the receiver's inbox for this rank, written over NVLink. Pull: this rank's own
  // outbox for the receiver, which the receiver reads over NVLink.
  char* staging = (s.pull ? reinterpret_cast<char*>(a.w.data) + p2p_outbox_offset(a, s.peer)
                          : static_cast<char*>(get_nvlink_address(a.w, s.peer)) +
                                p2p_inbox_offset(a, a.w.rank)) +
                  (dc_u64)c * a.depth * a.slot_stride;
  dc_u64* mode = peer_user_slot(a.w, s.peer, p2p_mode_slot(a, a.w.rank, c, 0));
  const dc_u64 head_slot = p2p_head_slot(a, s.peer, c);
  const dc_u64* head = own_user_slot(a.w, head_slot);
  dc_u64* tail = peer_user_slot(a.w, s.peer, p2p_tail_slot(a, a.w.rank, c));
  const bool leader = g.thread_rank() == 0;

  // Slot of step t is free once the receiver has consumed step t - depth.
  bool ok = true;
  if (leader && step0 >= a.depth) {
    ok = bounded_wait(a, head, step0 - a.depth + 1, kOpSendSlotFree, s.peer, head_slot);
  }
  if (g.any(!ok)) return;
  for (dc_u64 i = 0; i < nchunks; ++i) {
    const dc_u64 step = step0 + i;
    const dc_u64 off = i * s.chunk_bytes;
    const dc_u64 n = sp.len - off < s.chunk_bytes ? sp.len - off : s.chunk_bytes;
    // The slot is free (its previous chunk was consumed), so its MODE word is too. Written
    // before the copy so that the remote store is long done when the fence below runs; the
    // fence and TAIL's release order it before TAIL.
    if (leader) st_relaxed_sys(mode + step % a.depth, s.pull);
    m.chunk(g, staging + (step % a.depth) * a.slot_stride, sp.begin + off, n);
    if (leader && i + 1 < nchunks && step + 1 >= a.depth) {
      ok = bounded_wait(a, head, step + 2 - a.depth, kOpSendSlotFree, s.peer, head_slot);
    }
    const bool failed = g.any(!ok);  // barrier: every lane's stores of this chunk are done
    if (leader) publish(tail, step + 1);
    if (failed) return;  // this chunk was moved and published; nothing after it is
  }
  if (leader) steps[c] = step0 + nchunks;
}

// Bulk receive of channel c's span of side `r` from the staging region of sender `r.peer`.
template <class G, class M>
__device__ void bulk_recv(const G& g, const P2PLaunch& a, const P2PSide& r, const M& m, dc_u32 c,
                          dc_u32 nch) {
  const Span sp = block_span(r.bytes, nch, c, 16);
  const dc_u64 nchunks = (sp.len + r.chunk_bytes - 1) / r.chunk_bytes;
  if (nchunks == 0) return;
  dc_u64* steps = reinterpret_cast<dc_u64*>(r.steps);
  const dc_u64 step0 = steps[c];
  // The sender chose per chunk where it staged it (MODE word): our inbox (push) or its
  // outbox (pull).
  const dc_u64 channel_off = (dc_u64)c * a.depth * a.slot_stride;
  const char* inbox =
      reinterpret_cast<const char*>(a.w.data) + p2p_inbox_offset(a, r.peer) + channel_off;
  const char* outbox = static_cast<const char*>(get_nvlink_address(a.w, r.peer)) +
                       p2p_outbox_offset(a, a.w.rank) + channel_off;
  const dc_u64* mode = own_user_slot(a.w, p2p_mode_slot(a, r.peer, c, 0));
  const dc_u64 tail_slot = p2p_tail_slot(a, r.peer, c);
  const dc_u64* tail = own_user_slot(a.w, tail_slot);
  dc_u64* head = peer_user_slot(a.w, r.peer, p2p_head_slot(a, a.w.rank, c));
  const bool leader = g.thread_rank() == 0;

  bool ok = true;
  if (leader) ok = bounded_wait(a, tail, step0 + 1, kOpRecvSlotFull, r.peer, tail_slot);
  if (g.any(!ok)) return;  // barrier after the acquire: the chunk is visible to every lane
  // The leader read MODE after its acquire of TAIL; `any` hands it to the lanes.
  bool pull = g.any(leader && ld_relaxed_sys(mode + step0 % a.depth) != 0);
  for (dc_u64 i = 0; i < nchunks; ++i) {
    const dc_u64 step = step0 + i;
    const dc_u64 off = i * r.chunk_bytes;
    const dc_u64 n = sp.len - off < r.chunk_bytes ? sp.len - off : r.chunk_bytes;
    const dc_u64 slot_off = (step % a.depth) * a.slot_stride;
    m.chunk(g, (pull ? outbox : inbox) + slot_off, sp.begin + off, n, pull);
    if (leader && i + 1 < nchunks) {
      ok = bounded_wait(a, tail, step + 2, kOpRecvSlotFull, r.peer, tail_slot);
    }
    const bool failed = g.any(!ok);  // barrier: every read of this slot is done
    // The slot may be refilled. Only reads precede this store (nothing to publish), so a
    // release store without the full fence is enough: it also orders the reads of a pulled
    // chunk before the sender overwrites it.
    if (leader) st_release_sys(head, step + 1);
    if (failed) return;
    if (i + 1 < nchunks) pull = g.any(leader && ld_relaxed_sys(mode + (step + 1) % a.depth) != 0);
  }
  if (leader) steps[c] = step0 + nchunks;
}

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

// Low-latency calls share one sequence number across all blocks: a line's position depends on
// how the call splits the message over blocks, which changes with the size, so a flag must be
// unique to the call, not to the block. Counters stay equal because block 0 also advances the
// counters of the blocks the call does not use (no other block of this launch touches them).

// Low-latency send of block b's span of side `s`: every 8 bytes of payload travel with the
// call's sequence number.
template <class G, class M>
__device__ void ll_send(const G& g, const P2PLaunch& a, const P2PSide& s, const M& m, dc_u32 b) {
  constexpr dc_u64 kUnit = M::kUnit;
  constexpr int kWords = (int)(kUnit / 8);
  const Span sp = block_span(s.bytes, s.blocks, b, kUnit);
  dc_u64* counters = reinterpret_cast<dc_u64*>(s.ll_steps);
  const dc_u64 seq = counters[b] + 1;
  // This parity's lines were last written by call seq - 2; every receiver block must have
  // finished reading them (any block may have read any line then). Thread i checks block i.
  bool ok = true;
  if (seq > 2) {
    for (dc_u32 i = g.thread_rank(); i < a.max_blocks; i += g.size()) {
      const dc_u64 slot = p2p_llhead_slot(a, s.peer, i);
      ok = ok && bounded_wait(a, own_user_slot(a.w, slot), seq - 2, kOpSendSlotFree, s.peer, slot);
    }
  }
  if (g.any(!ok)) return;
  dc_u32* lines =
      ll_lines(a, static_cast<char*>(get_nvlink_address(a.w, s.peer)), a.w.rank, seq, sp);
  const dc_u64 nunits = (sp.len + kUnit - 1) / kUnit;
  for (dc_u64 j = g.thread_rank(); j < nunits; j += g.size()) {
    const dc_u64 n = sp.len - j * kUnit < kUnit ? sp.len - j * kUnit : kUnit;
    dc_u64 v[kWords];
    m.unit(sp.begin + j * kUnit, n, v);
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      if (k * 8 < (int)n) ll_store(lines + (j * kWords + k) * 4, v[k], (dc_u32)seq);
    }
  }
  // Every thread has read counters[b] (before g.any above), so it may now change.
  for (dc_u32 i = g.thread_rank(); i < a.max_blocks; i += g.size()) {
    if (i == b || (b == 0 && i >= s.blocks)) counters[i] = seq;
  }
}

// Polls one line until both flags carry `flag`; false on timeout or abort.
__device__ __forceinline__ bool ll_poll(const P2PLaunch& a, DeviceErrorState* err,
                                        const dc_u32* line, dc_u32 flag, int peer, dc_u64 index,
                                        dc_u64& v) {
  dc_u32 lo, f0, hi, f1;
  ll_load(line, lo, f0, hi, f1);
  dc_u64 start = 0;
  dc_u64 next_abort_check = 0;
  for (dc_u32 polls = 1; f0 != flag || f1 != flag; ++polls) {
    if (polls % kAbortCheckPolls == 0) {
      const dc_u64 now = globaltimer_ns();
      if (start == 0) {
        start = now;
        next_abort_check = now + kAbortCheckNs;
      }
      if (now >= next_abort_check) {  // a host read (PCIe): rarely, see wait.cuh
        if (abort_raised(err)) return false;
        next_abort_check = now + kAbortCheckNs;
      }
      if (now - start >= a.w.timeout_ns) {
        record_wait_failure(err, a.w.rank, WaitSite{kOpRecvSlotFull, peer, index}, flag,
                            (dc_u64)(f0 == flag ? f1 : f0), now - start);
        return false;
      }
    }
    ll_load(line, lo, f0, hi, f1);
  }
  v = ((dc_u64)hi << 32) | lo;
  return true;
}

// Low-latency receive of block b's span of side `r`: each thread polls its own lines until both
// flags carry this call's number.
template <class G, class M>
__device__ void ll_recv(const G& g, const P2PLaunch& a, const P2PSide& r, const M& m, dc_u32 b) {
  constexpr dc_u64 kUnit = M::kUnit;
  constexpr int kWords = (int)(kUnit / 8);
  const Span sp = block_span(r.bytes, r.blocks, b, kUnit);
  dc_u64* counters = reinterpret_cast<dc_u64*>(r.ll_steps);
  const dc_u64 seq = counters[b] + 1;
  const dc_u32* lines = ll_lines(a, reinterpret_cast<char*>(a.w.data), r.peer, seq, sp);
  const dc_u64 nunits = (sp.len + kUnit - 1) / kUnit;
  DeviceErrorState* err = error_state(a.w);
  bool ok = true;
  for (dc_u64 j = g.thread_rank(); ok && j < nunits; j += g.size()) {
    const dc_u64 n = sp.len - j * kUnit < kUnit ? sp.len - j * kUnit : kUnit;
    dc_u64 v[kWords];
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      v[k] = 0;
      if (ok && k * 8 < (int)n) {
        ok = ll_poll(a, err, lines + (j * kWords + k) * 4, (dc_u32)seq, r.peer, j * kWords + k,
                     v[k]);
      }
    }
    if (ok) m.unit(sp.begin + j * kUnit, n, v);
  }
  if (g.any(!ok)) return;  // barrier: every line of this block has been read
  // Release this block's share of the parity buffer (block 0 also releases the blocks this
  // call does not use, which read nothing), and advance the same counters as the sender.
  for (dc_u32 i = g.thread_rank(); i < a.max_blocks; i += g.size()) {
    if (i == b || (b == 0 && i >= r.blocks)) {
      st_release_sys(peer_user_slot(a.w, r.peer, p2p_llhead_slot(a, a.w.rank, i)), seq);
      counters[i] = seq;
    }
  }
}

// Reads up to 8 bytes at p (fewer at the message's end), any alignment.
__device__ __forceinline__ dc_u64 load_payload(const unsigned char* p, dc_u64 n) {
  if (n == 8 && (reinterpret_cast<dc_u64>(p) & 7) == 0) return *reinterpret_cast<const dc_u64*>(p);
  dc_u64 v = 0;
  for (dc_u64 k = 0; k < n; ++k) v |= (dc_u64)p[k] << (8 * k);
  return v;
}

__device__ __forceinline__ void store_payload(unsigned char* p, dc_u64 v, dc_u64 n) {
  if (n == 8 && (reinterpret_cast<dc_u64>(p) & 7) == 0) {
    *reinterpret_cast<dc_u64*>(p) = v;
    return;
  }
  for (dc_u64 k = 0; k < n; ++k) p[k] = (unsigned char)(v >> (8 * k));
}

// Send/recv's movers: the wire bytes are the buffer's bytes, at any alignment.
struct ByteSend {
  static constexpr dc_u64 kUnit = 8;
  const unsigned char* src;
  template <class G>
  __device__ __forceinline__ void chunk(const G& g, char* slot, dc_u64 off, dc_u64 n) const {
    copy_bytes(g, slot, src + off, n);
  }
  __device__ __forceinline__ void unit(dc_u64 off, dc_u64 n, dc_u64 (&v)[1]) const {
    v[0] = load_payload(src + off, n);
  }
};

struct ByteRecv {
  static constexpr dc_u64 kUnit = 8;
  unsigned char* dst;
  template <class G>
  __device__ __forceinline__ void chunk(const G& g, const char* slot, dc_u64 off, dc_u64 n,
                                        bool remote) const {
    if (remote) {  // reads over NVLink: more loads in flight
      copy_bytes<kCopyUnrollRemote>(g, dst + off, slot, n);
    } else {
      copy_bytes(g, dst + off, slot, n);
    }
  }
  __device__ __forceinline__ void unit(dc_u64 off, dc_u64 n, const dc_u64 (&v)[1]) const {
    store_payload(dst + off, v[0], n);
  }
};

#endif  // __CUDACC__

}  // namespace p2p
}  // namespace devcomm
