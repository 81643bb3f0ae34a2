// devcomm/bulk.cuh: the staged (bulk) protocol of one (peer, direction): chunks through
// per-channel slots with TAIL/HEAD signals, pushed or pulled (docs/PROTOCOL.md).
#pragma once

#include "devcomm/agree.cuh"

namespace devcomm {
namespace p2p {

#if defined(__CUDACC__)

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
// Each channel's leader checks the sender's descriptor (`ag`, agree.cuh) before its first
// chunk; channel 0 does even when it has none (an empty message). agree_none(): no check.
template <class G, class M>
__device__ void bulk_recv(const G& g, const P2PLaunch& a, const P2PSide& r, const M& m, dc_u32 c,
                          dc_u32 nch, AgreeRecv ag) {
  const Span sp = block_span(r.bytes, nch, c, 16);
  const dc_u64 nchunks = (sp.len + r.chunk_bytes - 1) / r.chunk_bytes;
  if (nchunks == 0 && (c != 0 || ag.agreed)) return;
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
  if (leader) {
    ok = (ag.agreed || agree_recv_wait(a, ag)) &&
         (nchunks == 0 || bounded_wait(a, tail, step0 + 1, kOpRecvSlotFull, r.peer, tail_slot));
  }
  if (g.any(!ok) || nchunks == 0) return;  // barrier after the acquire: the chunk is visible
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

#endif  // __CUDACC__

}  // namespace p2p
}  // namespace devcomm
