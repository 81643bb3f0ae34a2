// devcomm/agree.cuh: the two sides of every send/recv call agree before anything is written
// (docs/PROTOCOL.md, "Agreement").
//
// Every route (LL, LL128, staged push or pull, copy engine, negotiated, zero-copy) starts the
// same way. The sender's lead thread numbers the call (CALL_S + 1 for this peer) and stores
// its call word (call_word.cuh: call_word(call, kind, bytes)) into the receiver's pad, in ring
// word call % kAgRing.
// Every receiving thread or warp that is about to write the destination (or to let a copy
// stream write it) first waits for the descriptor of its own call number (CALL_R + 1) and
// compares kind and size with its own call. A difference is recorded as kOpCallMismatch
// (naming the peer, both values and the field) and aborts the communicator: the routes' own
// counters no longer agree, so it must be rebuilt. Nothing is written into the destination.
//
// The store needs no fence and the check no extra round trip: the descriptor leaves with the
// data (on the staged path the same thread stores it just before its first chunk; on the
// low-latency paths another thread of block 0 stores it after the role's barrier, beside the
// line stores), and the receiver polls it in the same loop as its data, so both arrive in
// one flight.
//
// Ring credit: once call c has ended on the receiver (its last block out advanced CALL_R),
// the lead thread of the receiver's NEXT call from that peer raises the sender's ACK to c, at
// its start (stream order: every reader of call c's ring word has finished by then). The
// update leaves with the call's first loads, off the path to the kernel's end: an ACK stored
// as the last act of call c cost about 0.35 us per 8 B call on 2 H200s (docs/PERFORMANCE.md,
// "Call agreement"). The sender waits for ACK >= call - kAgRing before overwriting a ring word,
// so it may run up to kAgRing - 1 calls ahead of the receiver's last started call.
//
// Words (user slots) of peer p's copy-engine block (p2p.cuh, p2p_ce_word):
//   +54 CALL_S  calls this rank sent to p              +55 CALL_R  calls received from p
//   +56 OUT_R   receiving blocks done with this call   +57 ACK     this rank's calls p finished
//   +58..63 DESC[kAgRing]  p's descriptors of its calls to this rank (written by p)
#pragma once

#include "devcomm/ll.cuh"

namespace devcomm {
namespace p2p {

// Words are in devcomm/p2p.cuh (kAg*), the word's encoding in devcomm/call_word.cuh.
// The agreement is always on: what it costs an 8 B call, and which part, was measured with
// build switches since removed (docs/PERFORMANCE.md, "Call agreement").

#if defined(__CUDACC__)

// Records a mismatch found by this rank (the receiver) against `peer`: field, this side's value
// (expected) and the peer's (seen); raises abort, since the routes' counters now disagree.
__device__ inline void agree_record(const P2PLaunch& a, int peer, dc_u32 field, dc_u64 mine,
                                    dc_u64 theirs) {
  record_wait_failure(error_state(a.w), a.w.rank, WaitSite{kOpCallMismatch, peer, field},
                      field_value(mine, field), field_value(theirs, field), 0);
}

// A sender's call number and credit, loaded early (agree_send_begin) so that the loads overlap
// the protocol's own ones, and used just before the first store of data (agree_send_finish).
// `aborted`: the communicator's abort mirror (DeviceErrorState::mirror, in device memory; its
// address is word 1 of the window's epoch buffer): 0, or the token of the launch that failed
// first (wait.cuh, launch_token). A rank whose earlier call failed announces no call: kernels it enqueued before the failure was known would otherwise send data that
// never arrived here (a ring forwarding a chunk its receive refused), and the peer would take
// it for the call's. Without the announcement the peer's receive times out naming this rank.
struct AgreeSend {
  dc_u64* own;
  dc_u64* ring;  // the peer's ring of this rank's descriptors (word 0), as mapped here
  dc_u64 call;
  dc_u64 ack;
  dc_u64 aborted;
};

// `mirror_at`: the abort mirror's address when the kernel loaded it before its
// enter_after_previous_kernel (window.cuh, mirror_address), kMirrorUnknown to load it here.
constexpr dc_u64 kMirrorUnknown = ~0ull;
__device__ __forceinline__ AgreeSend agree_send_begin(const P2PLaunch& a, int peer,
                                                      dc_u64 mirror_at = kMirrorUnknown) {
  dc_u64* own = own_user_slot(a.w, p2p_ce_word(a, peer, 0));
  const dc_u64 at = mirror_at == kMirrorUnknown ? mirror_address(a.w) : mirror_at;
  // The peer's pad address is a load from the window's table: issued here with the others,
  // not after the checks (it was the last load before the descriptor's store, on the path of
  // an 8-byte call's only line, which this thread stores after the barrier).
  dc_u64* ring =
      peer_user_slot(a.w, peer, p2p_ce_word(a, a.w.rank, kAgDesc + kAgRing - 1)) - (kAgRing - 1);
  return AgreeSend{own, ring, own[kAgCallS] + 1, ld_relaxed_sys(own + kAgAck),
                   mirror_value(at)};
}

// Stores the descriptor of call s.call into the peer's ring once its word is free (one thread,
// the lead of the send role). False when that wait failed (recorded; the caller stops) or the
// communicator had been aborted before this kernel (already recorded).
__device__ inline bool agree_send_finish(const P2PLaunch& a, int peer, const AgreeSend& s,
                                         dc_u32 kind, dc_u64 bytes) {
  // Aborted by an earlier launch: announce nothing (a role of the failing launch itself still
  // announces, so that its peer sees this rank's call and names the mismatch).
  if (s.aborted != 0 && s.aborted != launch_token()) return false;
  if (s.call > kAgRing && s.ack + kAgRing < s.call) {
    const dc_u64 slot = p2p_ce_word(a, peer, kAgAck);
    if (!wait_until(error_state(a.w), a.w.timeout_ns, a.w.rank, s.own + kAgAck,
                    s.call - kAgRing, Cmp::Ge, WaitSite{kOpSendSlotFree, peer, slot})) {
      return false;
    }
  }
  st_relaxed_sys(s.ring + s.call % kAgRing, call_word(s.call, kind, bytes));
  s.own[kAgCallS] = s.call;
  return true;
}

__device__ inline bool agree_send(const P2PLaunch& a, int peer, dc_u32 kind, dc_u64 bytes) {
  return agree_send_finish(a, peer, agree_send_begin(a, peer), kind, bytes);
}

// The call number this receive role has with `peer`, read by every receiving thread at the
// start (the role's last block out advances it, agree_recv_done). `lead`: exactly one thread
// of the role, which hands the previous call's ring word back to the sender (ACK, above).
__device__ __forceinline__ dc_u64 agree_recv_begin(const P2PLaunch& a, int peer, bool lead) {
  const dc_u64 call = *own_user_slot(a.w, p2p_ce_word(a, peer, kAgCallR)) + 1;
  if (lead && call > 1) {
    red_max_relaxed_sys(peer_user_slot(a.w, peer, p2p_ce_word(a, a.w.rank, kAgAck)), call - 1);
  }
  return call;
}

// The ring word that carries the descriptor of call `call` from `peer`.
__device__ __forceinline__ const dc_u64* agree_desc(const P2PLaunch& a, int peer, dc_u64 call) {
  return own_user_slot(a.w, p2p_ce_word(a, peer, kAgDesc + call % kAgRing));
}

// What a receiving thread checks: the peer's descriptor of `call` against (kind, bytes).
// `agreed` becomes true once it matched; a mismatch is recorded (by this thread).
struct AgreeRecv {
  const dc_u64* desc;
  dc_u64 call;
  dc_u64 bytes;
  dc_u64 mask;  // payload bits compared: all for send/recv, none for zero-copy (which compares
                // its sizes itself), the operation only for all-to-all-v (counts come later:
                // kCollOpMask)
  dc_u32 kind;
  int peer;
  bool agreed;

  // Looks at one loaded descriptor value: false on a mismatch (recorded when `record`).
  __device__ __forceinline__ bool look(const P2PLaunch& a, dc_u64 d, bool record = true) {
    if (agreed || !call_word_is(d, call)) return true;
    const dc_u64 mine = call_word(call, kind, bytes);
    const dc_u32 field = call_differs(kind, mine, d, mask);
    if (field != 0) {
      if (record) agree_record(a, peer, field, mine, d);
      return false;
    }
    agreed = true;
    return true;
  }
};

__device__ __forceinline__ AgreeRecv agree_recv(const P2PLaunch& a, int peer, dc_u64 call,
                                                dc_u32 kind, dc_u64 bytes) {
  return AgreeRecv{agree_desc(a, peer, call), call, bytes, kPayloadMask, kind, peer, false};
}

// No check at all (a role whose caller checked already).
__device__ __forceinline__ AgreeRecv agree_none() {
  return AgreeRecv{nullptr, 0, 0, 0, 0, -1, true};
}

// Waits (one thread) for the descriptor of the call and checks it: true when the two sides
// agree; false after a mismatch or a failed wait (both recorded).
__device__ inline bool agree_recv_wait(const P2PLaunch& a, AgreeRecv& ag) {
  DeviceErrorState* err = error_state(a.w);
  PollClock clock;
  for (;;) {
    const dc_u64 d = ld_relaxed_sys(ag.desc);
    if (!ag.look(a, d)) return false;
    if (ag.agreed) return true;
    const dc_u64 slot = p2p_ce_word(a, ag.peer, kAgDesc + ag.call % kAgRing);
    if (!clock.tick(a, err, ag.peer, slot, ag.call & kCallNumberMask, call_number(d))) {
      return false;
    }
    if (clock.polls > kSpinPolls) __nanosleep(kMaxSleepNs);
  }
}

// The end of a receive call (one thread, once every receiving thread is done): advances CALL_R
// (the next call's lead hands the ring word back, agree_recv_begin).
__device__ __forceinline__ void agree_recv_end(const P2PLaunch& a, int peer, dc_u64 call) {
  *own_user_slot(a.w, p2p_ce_word(a, peer, kAgCallR)) = call;
}

// The end of a receive role in one block (one thread, after every thread of the role in this
// block is done): the last of `nblocks` blocks advances CALL_R.
__device__ inline void agree_recv_done(const P2PLaunch& a, int peer, dc_u64 call,
                                       dc_u32 nblocks) {
  dc_u64* own = own_user_slot(a.w, p2p_ce_word(a, peer, 0));
  if (nblocks > 1) {
    const unsigned long long out =
        atomicAdd(reinterpret_cast<unsigned long long*>(own + kAgOutR), 1ull);
    if (out + 1 != nblocks) return;
    own[kAgOutR] = 0;
  }
  agree_recv_end(a, peer, call);
}

#endif  // __CUDACC__

}  // namespace p2p
}  // namespace devcomm
