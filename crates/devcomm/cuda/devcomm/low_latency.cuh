// devcomm/low_latency.cuh: a low-latency call (LL or LL128 lines, by the side's
// `low_latency`) of one (peer, direction), with its sequence number shared by all blocks.
#pragma once

#include "devcomm/ll128.cuh"

namespace devcomm {
namespace p2p {

#if defined(__CUDACC__)

// ll_poll (ll.cuh) that also polls the call's descriptor (agree.cuh) in the same loop until it
// matched: the line's payload is taken only once both sides agree. False on timeout, abort or
// a mismatch (recorded by this thread).
__device__ __forceinline__ bool ll_poll_agreed(const P2PLaunch& a, DeviceErrorState* err,
                                               const dc_u32* line, dc_u32 flag, int peer,
                                               dc_u64 index, dc_u64& v, AgreeRecv& ag) {
  if (ag.agreed) return ll_poll(a, err, line, flag, peer, index, v);
  dc_u32 lo, f0, hi, f1;
  ll_load(line, lo, f0, hi, f1);
  dc_u64 d = ld_relaxed_sys(ag.desc);
  PollClock clock;
  if ((linear_thread_index() & 31u) != 0) clock.abort_ns = 8 * kAbortCheckNs;
  for (;;) {
    if (!ag.look(a, d)) return false;
    if (ag.agreed && f0 == flag && f1 == flag) break;
    if (!clock.tick(a, err, peer, index, flag, (dc_u64)(f0 == flag ? f1 : f0))) return false;
    ll_load(line, lo, f0, hi, f1);
    if (!ag.agreed) d = ld_relaxed_sys(ag.desc);
  }
  v = ((dc_u64)hi << 32) | lo;
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
// `agree`: a send/recv call, whose block 0 stores the call's descriptor (agree.cuh); the
// collectives pass false (their calls are not numbered here). `mirror_at`: the abort mirror's
// address if the kernel loaded it before entering (agree_send_begin).
template <class G, class M>
__device__ void ll_send(const G& g, const P2PLaunch& a, const P2PSide& s, const M& m, dc_u32 b,
                        bool agree, dc_u64 mirror_at = kMirrorUnknown) {
  constexpr dc_u64 kUnit = M::kUnit;
  constexpr int kWords = (int)(kUnit / 8);
  const bool lines128 = s.low_latency == 2;
  const Span sp = block_span(s.bytes, s.blocks, b, lines128 ? Ll128<kUnit>::kBytes : kUnit);
  // Block 0's last thread numbers the call and stores its descriptor (agree.cuh): its loads
  // are issued here, next to the counter's, and the store follows the barrier below, so that
  // neither the barrier nor the lines wait for them (before, the role's time to its barrier
  // grew from 0.9 to 1.33 us at 8 B on 2 H100s). Lines stored before the descriptor are safe:
  // the receiver takes none of them before the descriptor of its call matched. The last
  // thread stores no line of a small message (thread 0 holds the first).
  const bool lead = agree && b == 0 && g.thread_rank() == g.size() - 1;
  AgreeSend call{};
  if (lead) call = agree_send_begin(a, s.peer, mirror_at);
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
  // A failure here is recorded (the communicator is aborted, or was by an earlier launch):
  // no descriptor goes out, so the receiver takes none of this call's lines.
  if (lead) (void)agree_send_finish(a, s.peer, call, kKindSendRecv, s.bytes);
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
// its warp's lines (LL128) until they carry this call's number, and the call's descriptor
// until it matched (agree.cuh). The role's last block out ends the call (agree_recv_done).
// `ag`: the descriptor to check before any line is taken (agree_none(): none); `finish`: this
// role's blocks end the call (a send/recv; a collective's role does that itself).
template <class G, class M>
__device__ void ll_recv(const G& g, const P2PLaunch& a, const P2PSide& r, const M& m, dc_u32 b,
                        AgreeRecv ag, bool finish) {
  constexpr dc_u64 kUnit = M::kUnit;
  constexpr int kWords = (int)(kUnit / 8);
  const bool lines128 = r.low_latency == 2;
  const Span sp = block_span(r.bytes, r.blocks, b, lines128 ? Ll128<kUnit>::kBytes : kUnit);
  dc_u64* counters = reinterpret_cast<dc_u64*>(r.ll_steps);
  const dc_u64 seq = counters[b] + 1;
  bool ok = true;
  if (lines128) {
    ok = ll128_recv_span(g, a, r, m, sp, seq, ag);
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
          ok = ll_poll_agreed(a, err, lines + (j * kWords + k) * 4, (dc_u32)seq, r.peer,
                              j * kWords + k, v[k], ag);
        }
      }
      if (ok) m.unit(sp.begin + j * kUnit, n, v);
    }
  }
  // A receive with nothing to poll here (an empty message, or a span of no lines) still
  // checks the call once, on block 0's first thread (already done when it had a line).
  if (ok && b == 0 && g.thread_rank() == 0 && !ag.agreed) ok = agree_recv_wait(a, ag);
  if (g.any(!ok)) return;  // barrier: every line of this block has been read
  // Release this block's share of the parity buffer (block 0 also releases the blocks this
  // call does not use, which read nothing), and advance the same counters as the sender.
  for (dc_u32 i = g.thread_rank(); i < a.max_blocks; i += g.size()) {
    if (i == b || (b == 0 && i >= r.blocks)) {
      st_release_sys(peer_user_slot(a.w, r.peer, p2p_llhead_slot(a, a.w.rank, i)), seq);
      counters[i] = seq;
    }
  }
  if (finish && g.thread_rank() == 0) agree_recv_done(a, r.peer, ag.call, r.blocks);
}

#endif  // __CUDACC__

}  // namespace p2p
}  // namespace devcomm
