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

// Whether a role runs: always unless it is gated on a negotiation (p2p.cuh), then only where
// its DECISION (word `dec_word` of the peer's block) is `wanted`. A gated role's blocks wait
// for the decision first: in p2p_negotiated_kernel only the role's block 0 makes it. The wait
// allows twice the timeout, so that the decider's own wait fails first and names what was
// missing; a failed wait records itself and closes the gate.
__device__ __forceinline__ bool gate_open(const P2PLaunch& a, const P2PSide& side,
                                         dc_u32 dec_word, dc_u64 wanted) {
  if (!(side.pull & kSideGated)) return true;
  const dc_u64 slot = p2p_ce_word(a, side.peer, dec_word);
  const dc_u64* dec = own_user_slot(a.w, slot);
  const DeviceOp op = dec_word == kCeDecS ? kOpSendSlotFree : kOpRecvSlotFull;
  if (!wait_until(error_state(a.w), 2 * a.w.timeout_ns, a.w.rank, dec, 1, Cmp::Ge,
                  WaitSite{op, side.peer, slot})) {
    return false;
  }
  return ld_acquire_sys(dec) == wanted;
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
  if (!gate_open(a, s, kCeDecS, kDecisionStaged)) return;
  // Push: the receiver's inbox for this rank, written over NVLink. Pull: this rank's own
  // outbox for the receiver, which the receiver reads over NVLink.
  const bool pull = (s.pull & kSidePull) != 0;
  char* staging = (pull ? reinterpret_cast<char*>(a.w.data) + p2p_outbox_offset(a, s.peer)
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
  // Copy-engine slots overlay the staging (even ones the push staging, odd ones the outbox):
  // lane k waits until the receiver consumed the last copy-engine chunk sent to slot k of the
  // staging this message writes (LAST is 0 when none was). Local loads when the last message
  // to this peer was not a copy-engine one.
  if (g.thread_rank() < kCeSlots && p2p_ce_pulled(g.thread_rank()) == pull) {
    const dc_u32 k = g.thread_rank();
    const dc_u64 last = *own_user_slot(a.w, p2p_ce_word(a, s.peer, kCeLast + k));
    const dc_u64 ce_head = p2p_ce_word(a, s.peer, kCeHead + k);
    if (last != 0) {
      ok = ok && bounded_wait(a, own_user_slot(a.w, ce_head), last, kOpSendSlotFree, s.peer,
                              ce_head);
    }
  }
  if (g.any(!ok)) return;
  for (dc_u64 i = 0; i < nchunks; ++i) {
    const dc_u64 step = step0 + i;
    const dc_u64 off = i * s.chunk_bytes;
    const dc_u64 n = sp.len - off < s.chunk_bytes ? sp.len - off : s.chunk_bytes;
    // The slot is free (its previous chunk was consumed), so its MODE word is too. Written
    // before the copy so that the remote store is long done when the fence below runs; the
    // fence and TAIL's release order it before TAIL.
    if (leader) st_relaxed_sys(mode + step % a.depth, pull ? 1ull : 0ull);
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
  if (!gate_open(a, r, kCeDecR, kDecisionStaged)) return;
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

// ---- LL128: 128-byte lines (docs/PROTOCOL.md, "LL128") ----
//
// A line is 16 words of 8 bytes; word 15 carries the call number (the flag), the others the
// payload: 15 words for 8-byte units, 14 for 16-byte units (a unit never straddles lines). Eight
// consecutive lanes of a warp move a line, lane l holding words 2l and 2l + 1, with ONE 16-byte
// store each in the same warp instruction; the receiver loads a line the same way and takes it
// when the flag lane sees this call's number. This relies on NVLink and the L2 delivering a
// warp's aligned 128-byte store whole (not promised by the PTX memory model; NCCL's LL128 relies
// on the same on NVLink). DEVCOMM_P2P_LL128=0 turns the protocol off (src/p2p/config.rs).
template <dc_u64 kUnit>
struct Ll128 {
  static_assert(kUnit == 8 || kUnit == 16, "low-latency units are 8 or 16 bytes");
  static constexpr dc_u64 kWords = kUnit == 8 ? 15 : 14;  // payload words per line
  static constexpr dc_u64 kBytes = kWords * 8;              // payload bytes per line
};

// Line groups (4 lines: one per 8 lanes) each warp keeps in flight (DC_LL128_UNROLL may change
// it per module for experiments, docs/TUNING.md).
#ifndef DC_LL128_UNROLL
#define DC_LL128_UNROLL 2
#endif
constexpr int kLl128Unroll = DC_LL128_UNROLL;

__device__ __forceinline__ void ll128_store(dc_u64* p, dc_u64 v0, dc_u64 v1) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v0), "l"(v1) : "memory");
}

__device__ __forceinline__ void ll128_load(const dc_u64* p, dc_u64& v0, dc_u64& v1) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(v0), "=l"(v1)
               : "l"(p)
               : "memory");
}

// The LL128 lines of call `seq` from `sender`, from line `first` on, inside a window's data.
__device__ __forceinline__ dc_u64* ll128_lines(const P2PLaunch& a, char* window_data, int sender,
                                               dc_u64 seq, dc_u64 first) {
  return reinterpret_cast<dc_u64*>(window_data + (dc_u64)sender * a.region_bytes +
                                   p2p_ll128_offset(a) + (seq & 1) * p2p_ll128_parity_bytes(a) +
                                   first * 128);
}

// Calls f(o, n, k) for each mover unit that lane l holds in a line whose first payload byte is
// `off` of a span of `len` bytes: o is the unit's offset in the span, n its bytes (fewer at the
// span's end), k its first word among the lane's two. Units past the end are skipped.
template <dc_u64 kUnit, class F>
__device__ __forceinline__ void ll128_lane_units(dc_u64 off, dc_u64 len, dc_u32 l, F f) {
  constexpr dc_u32 kPerLane = (dc_u32)(16 / kUnit);  // units per lane: 2 or 1
#pragma unroll
  for (dc_u32 k = 0; k < kPerLane; ++k) {
    const dc_u32 word = 2 * l + k;  // with 16-byte units k is 0: the unit is both words
    const dc_u64 o = off + (dc_u64)word * 8;
    if (word < Ll128<kUnit>::kWords && o < len) f(o, len - o < kUnit ? len - o : kUnit, k);
  }
}

// Lane l's payload of a line whose first payload byte is `off` in the span (`len` bytes from
// `begin` of the message): the mover's units, zero past the end.
template <class M>
__device__ __forceinline__ void ll128_pack(const M& m, dc_u64 begin, dc_u64 len, dc_u64 off,
                                           dc_u32 l, dc_u64 (&v)[2]) {
  v[0] = 0;
  v[1] = 0;
  ll128_lane_units<M::kUnit>(off, len, l, [&](dc_u64 o, dc_u64 n, dc_u32 k) {
    dc_u64 u[M::kUnit / 8];
    m.unit(begin + o, n, u);
#pragma unroll
    for (dc_u32 i = 0; i < M::kUnit / 8; ++i) v[k + i] = u[i];
  });
}

// The inverse of ll128_pack: hands lane l's payload of a line to the mover.
template <class M>
__device__ __forceinline__ void ll128_unpack(const M& m, dc_u64 begin, dc_u64 len, dc_u64 off,
                                             dc_u32 l, const dc_u64 (&v)[2]) {
  ll128_lane_units<M::kUnit>(off, len, l, [&](dc_u64 o, dc_u64 n, dc_u32 k) {
    dc_u64 u[M::kUnit / 8];
#pragma unroll
    for (dc_u32 i = 0; i < M::kUnit / 8; ++i) u[i] = v[k + i];
    const dc_u64(&cu)[M::kUnit / 8] = u;  // the receiving movers take their unit as const
    m.unit(begin + o, n, cu);
  });
}

// LL128 send of span `sp` by the warps of `g`.
template <class G, class M>
__device__ __forceinline__ void ll128_send_span(const G& g, const P2PLaunch& a, const P2PSide& s,
                                                const M& m, const Span& sp, dc_u64 seq) {
  using L = Ll128<M::kUnit>;
  constexpr dc_u64 kGroup = 4 * kLl128Unroll;  // lines a warp moves per step
  const dc_u64 nlines = (sp.len + L::kBytes - 1) / L::kBytes;
  dc_u64* lines = ll128_lines(a, static_cast<char*>(get_nvlink_address(a.w, s.peer)), a.w.rank,
                              seq, sp.begin / L::kBytes);
  const dc_u32 lane = g.thread_rank() & 31u, l = lane & 7u;
  const dc_u64 warps = g.size() / 32, first = g.thread_rank() / 32 * 4 + lane / 8;
  // Line j of step `base` for group u: the warps take consecutive quads of lines, so every warp
  // has work even when the span is short.
  for (dc_u64 base = 0; base < nlines; base += warps * kGroup) {
    dc_u64 v[kLl128Unroll][2];
#pragma unroll
    for (int u = 0; u < kLl128Unroll; ++u) {
      const dc_u64 j = base + u * warps * 4 + first;
      if (j < nlines) ll128_pack(m, sp.begin, sp.len, j * L::kBytes, l, v[u]);
      if (l == 7) v[u][1] = seq;
    }
    __syncwarp();  // the eight stores of a line leave in one instruction
#pragma unroll
    for (int u = 0; u < kLl128Unroll; ++u) {
      const dc_u64 j = base + u * warps * 4 + first;
      if (j < nlines) ll128_store(lines + j * 16 + 2 * l, v[u][0], v[u][1]);
    }
  }
}

// LL128 receive of span `sp` by the warps of `g`; false on timeout or abort.
template <class G, class M>
__device__ __forceinline__ bool ll128_recv_span(const G& g, const P2PLaunch& a, const P2PSide& r,
                                                const M& m, const Span& sp, dc_u64 seq) {
  using L = Ll128<M::kUnit>;
  constexpr dc_u64 kGroup = 4 * kLl128Unroll;
  const dc_u64 nlines = (sp.len + L::kBytes - 1) / L::kBytes;
  const dc_u64* lines = ll128_lines(a, reinterpret_cast<char*>(a.w.data), r.peer, seq,
                                    sp.begin / L::kBytes);
  const dc_u32 lane = g.thread_rank() & 31u, l = lane & 7u;
  const dc_u64 warps = g.size() / 32, first = g.thread_rank() / 32 * 4 + lane / 8;
  DeviceErrorState* err = error_state(a.w);
  PollClock clock;
  for (dc_u64 base = 0; base < nlines; base += warps * kGroup) {  // as in ll128_send_span
    dc_u64 v[kLl128Unroll][2];
    // Every lane reloads its part of the group's lines until each line's flag lane saw this
    // call in the same load instruction as the rest of its line.
    for (;;) {
      bool ready = true;
      dc_u64 stale = seq;
#pragma unroll
      for (int u = 0; u < kLl128Unroll; ++u) {
        const dc_u64 j = base + u * warps * 4 + first;
        if (j < nlines) {
          ll128_load(lines + j * 16 + 2 * l, v[u][0], v[u][1]);
          if (l == 7 && v[u][1] != seq) {
            if (ready) stale = v[u][1];
            ready = false;
          }
        }
      }
      const dc_u32 waiting = __ballot_sync(0xffffffffu, !ready);
      if (waiting == 0) break;
      const int first = __ffs(waiting) - 1;
      stale = __shfl_sync(0xffffffffu, stale, first);
      int stop = 0;
      if (lane == 0) {
        stop = !clock.tick(a, err, r.peer, sp.begin / L::kBytes + base, seq, stale);
      }
      if (__shfl_sync(0xffffffffu, stop, 0)) return false;
    }
#pragma unroll
    for (int u = 0; u < kLl128Unroll; ++u) {
      const dc_u64 j = base + u * warps * 4 + first;
      if (j < nlines) ll128_unpack(m, sp.begin, sp.len, j * L::kBytes, l, v[u]);
    }
  }
  return true;
}

// Low-latency calls (LL and LL128) share one sequence number across all blocks: a line's
// position depends on how the call splits the message over blocks, which changes with the
// size, so a flag must be unique to the call, not to the block. Counters stay equal because
// block 0 also advances the counters of the blocks the call does not use (no other block of
// this launch touches them). Parity seq & 1 of the LL lines and of the LL128 lines is free
// once every receiver block has released call seq - 2, whichever protocol that call used.

// Low-latency send of block b's span of side `s` (s.low_latency: 1 LL, 2 LL128): every 8
// bytes of payload (LL) or every 120 or 112 (LL128) travel with the call's sequence number.
template <class G, class M>
__device__ void ll_send(const G& g, const P2PLaunch& a, const P2PSide& s, const M& m, dc_u32 b) {
  constexpr dc_u64 kUnit = M::kUnit;
  constexpr int kWords = (int)(kUnit / 8);
  const bool lines128 = s.low_latency == 2;
  const Span sp = block_span(s.bytes, s.blocks, b, lines128 ? Ll128<kUnit>::kBytes : kUnit);
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
  if (lines128) {
    ll128_send_span(g, a, s, m, sp, seq);
  } else {
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
  }
  // Every thread has read counters[b] (before g.any above), so it may now change.
  for (dc_u32 i = g.thread_rank(); i < a.max_blocks; i += g.size()) {
    if (i == b || (b == 0 && i >= s.blocks)) counters[i] = seq;
  }
}

// Low-latency receive of block b's span of side `r`: each thread polls its own lines (LL) or
// its warp's lines (LL128) until they carry this call's number.
template <class G, class M>
__device__ void ll_recv(const G& g, const P2PLaunch& a, const P2PSide& r, const M& m, dc_u32 b) {
  constexpr dc_u64 kUnit = M::kUnit;
  constexpr int kWords = (int)(kUnit / 8);
  const bool lines128 = r.low_latency == 2;
  const Span sp = block_span(r.bytes, r.blocks, b, lines128 ? Ll128<kUnit>::kBytes : kUnit);
  dc_u64* counters = reinterpret_cast<dc_u64*>(r.ll_steps);
  const dc_u64 seq = counters[b] + 1;
  bool ok = true;
  if (lines128) {
    ok = ll128_recv_span(g, a, r, m, sp, seq);
  } else {
    const dc_u32* lines = ll_lines(a, reinterpret_cast<char*>(a.w.data), r.peer, seq, sp);
    const dc_u64 nunits = (sp.len + kUnit - 1) / kUnit;
    DeviceErrorState* err = error_state(a.w);
    for (dc_u64 j = g.thread_rank(); ok && j < nunits; j += g.size()) {
      const dc_u64 n = sp.len - j * kUnit < kUnit ? sp.len - j * kUnit : kUnit;
      dc_u64 v[kWords];
#pragma unroll
      for (int k = 0; k < kWords; ++k) {
        v[k] = 0;
        if (ok && k * 8 < (int)n) {
          ok = ll_poll(a, err, lines + (j * kWords + k) * 4, (dc_u32)seq, r.peer,
                       j * kWords + k, v[k]);
        }
      }
      if (ok) m.unit(sp.begin + j * kUnit, n, v);
    }
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
