// Send/recv over NVLink: the bulk (staged, pipelined) path and the low-latency (flag-in-data)
// path, one-way or both ways in one kernel. The protocol is docs/PROTOCOL.md; the host side is
// src/p2p/. Instantiated by the JIT as
//   devcomm::p2p::p2p_kernel<SEND_THREADS, RECV_THREADS>
// Blocks hold up to two roles: threads [0, SEND_THREADS) send block b's span of the send
// message, threads [SEND_THREADS, SEND_THREADS + RECV_THREADS) receive block b's span of the
// recv message. Bulk transfers are warp-granular: each warp of a role is a channel with its
// own staging slots and TAIL/HEAD signals, so the system fence that publishes one warp's chunk
// stalls only that warp while the others keep copying. Low-latency transfers use the role's
// threads as one group, synchronised by its own named barrier (1 and 2), never the block.
#include "devcomm/transfer.cuh"

namespace devcomm {
namespace p2p {

// The check of send/recv call `call` of the launch's receive role (agree.cuh).
__device__ __forceinline__ AgreeRecv recv_call(const P2PLaunch& a, dc_u64 call) {
  return agree_recv(a, a.recv.peer, call, kKindSendRecv, a.recv.bytes);
}

// Warp 0 of block 0 of a send role: lane 0 numbers the call and stores its descriptor in the
// receiver's pad (agree.cuh). False on every lane when that failed (recorded, aborted).
__device__ __forceinline__ bool announce_call(const P2PLaunch& a, const P2PSide& s, dc_u32 kind) {
  bool ok = true;
  if ((threadIdx.x & 31u) == 0) ok = agree_send(a, s.peer, kind, s.bytes);
  return !__any_sync(0xffffffffu, !ok);
}

// The grid has max(send.blocks, recv.blocks) blocks; a role's surplus blocks return at once.
// Bulk channel numbering: warp w of block b is channel b * warps + w, the same on both ranks
// because both take blocks and threads from the message size (src/p2p/config.rs).
template <int SEND_THREADS, int RECV_THREADS>
__global__ void __launch_bounds__(SEND_THREADS + RECV_THREADS, 1) p2p_kernel(P2PLaunch a) {
  enter_after_previous_kernel();
  const dc_u32 b = blockIdx.x;
  const ByteSend snd{reinterpret_cast<const unsigned char*>(a.send.buf)};
  const ByteRecv rcv{reinterpret_cast<unsigned char*>(a.recv.buf)};
  if (SEND_THREADS > 0 && threadIdx.x < SEND_THREADS) {
    if (a.send.peer < 0 || b >= a.send.blocks) return;
    if (a.send.low_latency) {
      ll_send(NamedBarrier(1, 0, SEND_THREADS), a, a.send, snd, b, true);
    } else {
      constexpr dc_u32 kWarps = SEND_THREADS / 32;
      if (b == 0 && threadIdx.x < 32 && !announce_call(a, a.send, kKindSendRecv)) return;
      bulk_send(Warp{}, a, a.send, snd, b * kWarps + threadIdx.x / 32, a.send.blocks * kWarps);
    }
  } else if (RECV_THREADS > 0) {
    if (a.recv.peer < 0 || b >= a.recv.blocks) return;
    if (a.recv.low_latency) {
      ll_recv(NamedBarrier(2, SEND_THREADS, RECV_THREADS), a, a.recv, rcv, b,
              recv_call(a, agree_recv_call(a, a.recv.peer)), true);
    } else {
      constexpr dc_u32 kWarps = RECV_THREADS / 32;
      const dc_u64 call = agree_recv_call(a, a.recv.peer);
      bulk_recv(Warp{}, a, a.recv, rcv, b * kWarps + (threadIdx.x - SEND_THREADS) / 32,
                a.recv.blocks * kWarps, recv_call(a, call));
      NamedBarrier(2, SEND_THREADS, RECV_THREADS).sync();
      if (threadIdx.x == SEND_THREADS) agree_recv_done(a, a.recv.peer, call, a.recv.blocks);
    }
  }
}

// Which role block blockIdx.x of a launch of send_blocks + recv_blocks blocks serves, and as
// which block of it: with `interleave`, the roles take blocks in turn (even blocks send, odd
// ones receive, the larger role's surplus last); otherwise the senders come first.
__device__ __forceinline__ void split_block(dc_u32 send_blocks, dc_u32 recv_blocks,
                                            bool interleave, bool& send, dc_u32& b) {
  const dc_u32 pairs = send_blocks < recv_blocks ? send_blocks : recv_blocks;
  if (!interleave) {
    send = blockIdx.x < send_blocks;
    b = send ? blockIdx.x : blockIdx.x - send_blocks;
  } else if (blockIdx.x < 2 * pairs) {
    send = (blockIdx.x & 1u) == 0;
    b = blockIdx.x >> 1;
  } else {
    send = send_blocks > recv_blocks;
    b = blockIdx.x - pairs;
  }
}

// Block b of one role of a launch whose roles have blocks of their own, on the block's first
// `threads` threads, by the role's own protocol (LL, LL128 or staged): p2p_split_kernel's
// blocks, and p2p_negotiated_kernel's for a role that is not negotiated or chose staging.
// `own_call`: the role numbers and ends its call itself (agree.cuh); a negotiated role's
// kernel does that around both layouts instead.
__device__ __forceinline__ void plain_role(const P2PLaunch& a, bool send, dc_u32 b, dc_u32 threads,
                                           bool own_call) {
  if (threadIdx.x >= threads) return;
  const dc_u32 warps = threads / 32;
  if (send) {
    const ByteSend snd{reinterpret_cast<const unsigned char*>(a.send.buf)};
    if (a.send.low_latency) {
      ll_send(NamedBarrier(1, 0, threads), a, a.send, snd, b, true);
    } else {
      if (own_call && b == 0 && threadIdx.x < 32 && !announce_call(a, a.send, kKindSendRecv)) {
        return;
      }
      bulk_send(Warp{}, a, a.send, snd, b * warps + threadIdx.x / 32, a.send.blocks * warps);
    }
  } else {
    const ByteRecv rcv{reinterpret_cast<unsigned char*>(a.recv.buf)};
    if (a.recv.low_latency) {
      ll_recv(NamedBarrier(2, 0, threads), a, a.recv, rcv, b,
              recv_call(a, agree_recv_call(a, a.recv.peer)), true);
    } else {
      const dc_u64 call = agree_recv_call(a, a.recv.peer);
      bulk_recv(Warp{}, a, a.recv, rcv, b * warps + threadIdx.x / 32, a.recv.blocks * warps,
                recv_call(a, call));
      if (!own_call) return;
      NamedBarrier(2, 0, threads).sync();
      if (threadIdx.x == 0) agree_recv_done(a, a.recv.peer, call, a.recv.blocks);
    }
  }
}

// Both directions with the roles in separate blocks of all THREADS threads, send.blocks +
// recv.blocks of them. Used when both roles have the same thread count and DEVCOMM_P2P_SPLIT is
// not 0 (docs/PERFORMANCE.md compares it with p2p_kernel). INTERLEAVE: the roles take blocks
// in turn (even blocks send, odd ones receive, the larger role's surplus last), so that each
// role is spread over the whole GPU; otherwise blocks [0, send.blocks) send and the rest
// receive (docs/PERFORMANCE.md, v12).
template <int THREADS, bool INTERLEAVE>
__global__ void __launch_bounds__(THREADS, 1) p2p_split_kernel(P2PLaunch a) {
  enter_after_previous_kernel();
  bool send;
  dc_u32 b;
  split_block(a.send.blocks, a.recv.blocks, INTERLEAVE, send, b);
  if (!send && b >= a.recv.blocks) return;
  plain_role(a, send, b, THREADS, true);
}

// ---- Comm::barrier: a call of its own on the agreement ring (devcomm/agree.cuh) ----

// One warp; lane l serves peers l, l + 32, ... Every rank stores a barrier descriptor (kind
// kKindBarrier) into each NVLink peer's ring after a system fence (everything this rank's
// stream did before is visible first), then waits for each peer's descriptor of the same call
// number and checks its kind: a peer in send/recv or a collective instead is a CallMismatch
// naming it, not a timeout. After the waits, a fence orders what peers did before their
// arrival before anything this rank's stream does next.
__global__ void __launch_bounds__(32, 1) p2p_barrier_kernel(P2PLaunch a) {
  enter_after_previous_kernel();
  const DeviceWindow& w = a.w;
  const dc_u32 lane = threadIdx.x;
  fence_acq_rel_sys();
  bool ok = true;
  for (int p = (int)lane; p < w.world_size; p += 32) {
    if (p == w.rank || peer_signal_pad(w, p) == nullptr) continue;
    ok = ok && agree_send(a, p, kKindBarrier, 0);
  }
  for (int p = (int)lane; p < w.world_size && ok; p += 32) {
    if (p == w.rank || peer_signal_pad(w, p) == nullptr) continue;
    const dc_u64 call = agree_recv_call(a, p);
    AgreeRecv ag = agree_recv(a, p, call, kKindBarrier, 0);
    ok = agree_recv_wait(a, ag);
    if (ok) agree_recv_end(a, p, call);
  }
  fence_acq_rel_sys();
}

// ---- Zero-copy into a registered destination (docs/PROTOCOL.md, "Zero-copy") ----

// Thread 0 of a zero-copy sender: waits for the receiver's descriptor of call `seq` and checks
// it against this call. 0: they match; 1: refused (a mismatch, recorded once, by `record`);
// 2: the wait failed (the communicator is aborted).
__device__ inline int zc_await_descriptor(const ZcLaunch& z, dc_u64 seq, bool record) {
  const P2PSide& s = z.p.send;
  const DeviceWindow& w = z.p.w;
  const dc_u64 ready_slot = zc_desc_slot(z, s.peer, kZcReady);
  const dc_u64* desc = own_user_slot(w, ready_slot);
  if (!wait_until(error_state(w), w.timeout_ns, w.rank, desc, seq, Cmp::Ge,
                  WaitSite{kOpZcReady, s.peer, ready_slot})) {
    return 2;
  }
  // After the acquire of READY: the descriptor the receiver wrote before it is visible.
  const dc_u64 mine[3] = {z.send_reg, z.send_offset, s.bytes};
  for (dc_u32 f = 0; f < 3; ++f) {
    const dc_u64 theirs = ld_relaxed_sys(desc + 1 + f);
    if (theirs != mine[f]) {
      if (record) {
        record_soft_error(error_state(w), kOpZcMismatch, w.rank, s.peer, f, mine[f], theirs);
      }
      return 1;
    }
  }
  return 0;
}

// A refused zero-copy call: DONE = 2 seq + 1 in every DONE slot of this sender, so the receiver
// never waits for blocks that will not come, whatever block count it derived from its own size.
__device__ inline void zc_refuse_all(const ZcLaunch& z, dc_u64 seq, dc_u32 lane, dc_u32 lanes) {
  const DeviceWindow& w = z.p.w;
  for (dc_u32 i = lane; i < z.p.max_blocks; i += lanes) {
    st_release_sys(peer_user_slot(w, z.p.send.peer, zc_done_slot(z, w.rank, i)), 2 * seq + 1);
  }
}

// Sender block b of a zero-copy message: waits for the receiver's descriptor of this call,
// checks it against its own, copies its span straight into the receiver's registered buffer and
// publishes DONE. Nothing is written when the two sides disagree; block 0 then answers every
// DONE slot with the refusal so the receiver never waits for blocks that will not come.
__device__ inline void zc_send(const ZcLaunch& z, dc_u32 b) {
  const P2PSide& s = z.p.send;
  const DeviceWindow& w = z.p.w;
  dc_u64* counters = reinterpret_cast<dc_u64*>(s.steps);
  const dc_u64 seq = counters[b] + 1;
  __shared__ int status;  // 0 go, 1 refused (mismatch), 2 failed wait
  if (threadIdx.x == 0) {
    const bool announced = b != 0 || agree_send(z.p, s.peer, kKindZeroCopy, s.bytes);
    status = announced ? zc_await_descriptor(z, seq, b == 0) : 2;
  }
  __syncthreads();
  const int st = status;
  if (st == 2) return;  // the wait failed and aborted the communicator: publish nothing
  if (st == 0) {
    const Span sp = block_span(s.bytes, s.blocks, b, 16);
    copy_bytes(Block{}, reinterpret_cast<unsigned char*>(z.send_dst) + sp.begin,
               reinterpret_cast<const unsigned char*>(s.buf) + sp.begin, sp.len);
    __syncthreads();  // every thread's stores of the span are issued
    if (threadIdx.x == 0) publish(peer_user_slot(w, s.peer, zc_done_slot(z, w.rank, b)), 2 * seq);
  } else if (b == 0) {
    zc_refuse_all(z, seq, threadIdx.x, blockDim.x);
  }
  // Block b read counters[b] before the barrier above; block 0 also advances the blocks this
  // call does not use, as the low-latency path does, so every counter of the peer stays equal.
  for (dc_u32 i = threadIdx.x; i < z.p.max_blocks; i += blockDim.x) {
    if (i == b || (b == 0 && i >= s.blocks)) counters[i] = seq;
  }
}

// The receiver (one warp): posts where this call may land, then waits for every sender block.
__device__ inline void zc_recv(const ZcLaunch& z) {
  const P2PSide& r = z.p.recv;
  const DeviceWindow& w = z.p.w;
  const dc_u32 lane = threadIdx.x & 31u;
  dc_u64* counter = reinterpret_cast<dc_u64*>(r.steps);
  const dc_u64 seq = *counter + 1;
  const dc_u64 call = agree_recv_call(z.p, r.peer);
  if (lane == 0) {
    // Stream order: every earlier kernel of this stream, including any reader of the
    // destination, has finished, so the sender may overwrite it from now on.
    dc_u64* desc = peer_user_slot(w, r.peer, zc_desc_slot(z, w.rank, 0));
    st_relaxed_sys(desc + kZcReg, z.recv_reg);
    st_relaxed_sys(desc + kZcOffset, z.recv_offset);
    st_relaxed_sys(desc + kZcBytes, r.bytes);
    publish(desc + kZcReady, seq);
  }
  // The sender's call must be a zero-copy one too (agree.cuh); the sizes and ranges are
  // compared by the sender against the descriptor above (a soft refusal).
  bool ok = true, refused = false;
  if (lane == 0) {
    AgreeRecv ag = agree_recv(z.p, r.peer, call, kKindZeroCopy, r.bytes);
    ag.mask = 0;
    ok = agree_recv_wait(z.p, ag);
  }
  ok = !__any_sync(0xffffffffu, !ok);
  for (dc_u32 i = lane; i < r.blocks; i += 32) {
    const dc_u64 slot = zc_done_slot(z, r.peer, i);
    const dc_u64* done = own_user_slot(w, slot);
    ok = ok && wait_until(error_state(w), w.timeout_ns, w.rank, done, 2 * seq, Cmp::Ge,
                          WaitSite{kOpZcDone, r.peer, slot});
    if (ok) refused = refused || (ld_relaxed_sys(done) & 1) != 0;
  }
  const bool failed = __any_sync(0xffffffffu, !ok);
  refused = __any_sync(0xffffffffu, refused);
  __syncwarp();
  if (failed) return;
  if (lane == 0) {
    if (refused) {
      record_soft_error(error_state(w), kOpZcMismatch, w.rank, r.peer, 3, r.bytes, 0);
    }
    *counter = seq;
    agree_recv_end(z.p, r.peer, call);
  }
}

// One launch for a zero-copy send, receive or both: blocks [0, send.blocks) send, one more block
// receives (its first warp), so both directions at once cannot deadlock.
template <int THREADS>
__global__ void __launch_bounds__(THREADS, 1) p2p_zc_kernel(ZcLaunch z) {
  enter_after_previous_kernel();
  const dc_u32 send_blocks = z.p.send.peer >= 0 ? z.p.send.blocks : 0;
  if (blockIdx.x < send_blocks) {
    zc_send(z, blockIdx.x);
  } else if (z.p.recv.peer >= 0 && threadIdx.x < 32) {
    zc_recv(z);
  }
}

// Paces a zero-copy send by copy engine (one warp, on a stream of its own; docs/PROTOCOL.md,
// "Zero-copy by copy engine"). The host enqueued the copy of the whole message on a copy stream
// behind "GO >= 1" (the peer's copy-engine GO word of slot 0 in this rank's pad), followed by
// GO = 0 and DONE = 1. This kernel waits for the receiver's descriptor, checks it, releases GO,
// waits for DONE, puts it back to 0 and only then publishes DONE to the receiver (one DONE slot:
// the receiver derives one block for this route from the size). The copy stream's waits have
// no deadline, so GO is released whatever happens: after a mismatch or a failed wait the copy
// still lands in the sender's own range of the receiver's registered buffer (checked against
// its size on the host), and the error is reported on both sides.
__global__ void __launch_bounds__(32, 1) p2p_zc_ce_kernel(ZcLaunch z) {
  enter_after_previous_kernel();
  const P2PSide& s = z.p.send;
  const DeviceWindow& w = z.p.w;
  dc_u64* counters = reinterpret_cast<dc_u64*>(s.steps);
  const dc_u32 lane = threadIdx.x;
  const dc_u64 seq = counters[0] + 1;
  int st = 0;
  if (lane == 0) {
    st = agree_send(z.p, s.peer, kKindZeroCopy, s.bytes) ? zc_await_descriptor(z, seq, true) : 2;
    dc_u64* go = own_user_slot(w, p2p_ce_word(z.p, s.peer, kCeGo));
    st_release_sys(go, 1);
    if (st != 2) {
      const dc_u64 word = p2p_ce_word(z.p, s.peer, kCeDone);
      dc_u64* done = own_user_slot(w, word);
      if (!wait_until(error_state(w), w.timeout_ns, w.rank, done, 1, Cmp::Ge,
                      WaitSite{kOpSendSlotFree, s.peer, word})) {
        st = 2;
      } else {
        *done = 0;  // the copy stream wrote GO = 0 before DONE: both are back to 0
        if (st == 0) publish(peer_user_slot(w, s.peer, zc_done_slot(z, w.rank, 0)), 2 * seq);
      }
    }
  }
  st = __shfl_sync(0xffffffffu, st, 0);
  if (st == 2) return;  // aborted: nothing announced, the counters stay
  if (st == 1) zc_refuse_all(z, seq, lane, 32);
  for (dc_u32 i = lane; i < z.p.max_blocks; i += 32) counters[i] = seq;
}

// ---- Copy-engine messages (docs/PROTOCOL.md, "Copy engine"; words in devcomm/p2p.cuh) ----

constexpr int kCeCopyUnroll = 16;

// Announces this side's type for its next negotiated large message with the peer (p2p.cuh):
// seq = LSEQ + 1, TYPE[seq & 1] = seq << 1 | alone in the peer's pad, then LSEQ = seq.
__device__ inline dc_u64 announce_type(dc_u64* lseq, dc_u64* type, bool alone) {
  const dc_u64 seq = *lseq + 1;
  publish(type + (seq & 1), (seq << 1) | (alone ? 1u : 0u));
  *lseq = seq;
  return seq;
}

// Whether slot k no longer holds chunk g of this `bytes`-byte message from q: INTENT, and
// before the copy SIZE too, against the call; records the mismatch (naming the word) if so.
__device__ inline bool ce_mismatch(const DeviceWindow& w, const dc_u64* own, int q, dc_u32 k,
                                   dc_u64 g, dc_u64 bytes, bool after_copy) {
  const dc_u64 intent = ld_relaxed_sys(own + kCeIntent + k);
  const dc_u64 size = ld_relaxed_sys(own + kCeSize + k);
  if (intent == g && (after_copy || size == bytes)) return false;
  const bool id = intent != g;
  record_wait_failure(error_state(w), w.rank,
                      WaitSite{kOpCeMismatch, q, (id ? kCeIntent : kCeSize) + k}, id ? g : bytes,
                      id ? intent : size, 0);
  return true;
}

// Negotiates the layout of gated role i (0 send, 1 receive) of a launch that has two roles
// (p2p.cuh): announces this side's type (seq << 1: not alone), waits for the peer's type for
// the same message and records DECISION: the copy-engine layout if the peer is alone in its
// launch, the staged protocol if not, kDecisionFailed after a failed wait (the error is
// recorded for the host). One thread; released, since the role's other blocks wait for it.
__device__ void decide_role(const P2PLaunch& a, const P2PSide& side, int i) {
  const DeviceWindow& w = a.w;
  dc_u64* own = own_user_slot(w, p2p_ce_word(a, side.peer, 0));
  dc_u64* theirs = peer_user_slot(w, side.peer, p2p_ce_word(a, w.rank, 0));
  const dc_u64 seq = announce_type(own + (i == 0 ? kCeLseqS : kCeLseqR),
                                   theirs + (i == 0 ? kCeTypeS : kCeTypeR), false);
  // Sending, the receiver's type arrives in TYPE_R; receiving, the sender's in TYPE_S.
  const dc_u32 word = (i == 0 ? kCeTypeR : kCeTypeS) + (seq & 1);
  const bool ok = bounded_wait(a, own + word, seq << 1, i == 0 ? kOpSendSlotFree : kOpRecvSlotFull,
                               side.peer, p2p_ce_word(a, side.peer, word));
  const dc_u64 type = ok ? ld_acquire_sys(own + word) : 0;
  st_release_sys(own + (i == 0 ? kCeDecS : kCeDecR),
                 !ok ? kDecisionFailed : (type & 1) ? kDecisionCe : kDecisionStaged);
}

// The pacers' polling loop: `step()` returns 1 after progress, 0 when nothing moved, -1 on a
// failure it recorded; it runs until `finished()`. Between idle polls it backs off like every
// wait (wait.cuh), checks the abort flag, and after a whole timeout without progress calls
// `timed_out(now - since)`, which records what it was waiting on. Returns false on failure.
template <class Step, class Finished, class TimedOut>
__device__ bool pace_loop(const DeviceWindow& w, Step step, Finished finished,
                          TimedOut timed_out) {
  DeviceErrorState* err = error_state(w);
  dc_u64 since = globaltimer_ns(), next_abort_check = since + kAbortCheckNs;
  dc_u32 idle = 0, sleep_ns = kMinSleepNs;
  while (!finished()) {
    const int r = step();
    if (r < 0) return false;
    if (r > 0) {
      idle = 0;
      sleep_ns = kMinSleepNs;
      since = globaltimer_ns();
      continue;
    }
    if (++idle > kSpinPolls) {
      __nanosleep(sleep_ns);
      sleep_ns = sleep_ns < kMaxSleepNs ? 2 * sleep_ns : kMaxSleepNs;
    }
    if (idle % kAbortCheckPolls != 0) continue;
    const dc_u64 now = globaltimer_ns();
    if (now >= next_abort_check) {
      if (abort_raised(err)) return false;
      next_abort_check = now + kAbortCheckNs;
    }
    if (now - since >= w.timeout_ns) {
      timed_out(now - since);
      return false;
    }
  }
  return true;
}

// Paces a copy-engine send (warp 0 of block 0 of p2p_ce_send_kernel). Chunk i of the message
// (slot k = i % kCeSlots, id g = SENT + i): once the receiver consumed the slot's previous
// chunk, write INTENT = g and SIZE into the receiver's pad, then GO = i + 1, so that the copy
// stream (even slots) or the filling blocks (odd slots) start on it; once DONE = i + 1 comes
// back, announce it (TAIL = g + 1). Only this warp signals the receiver, so a failed wait
// announces nothing (wait.cuh's contract); it still releases every GO, because the copy
// stream's waits have no deadline of their own, and the copies then land in slots the
// receiver may be reading: the receiver sees INTENT change and reports it.
__device__ void ce_pace_send(const P2PLaunch& a) {
  const P2PSide& s = a.send;
  const DeviceWindow& w = a.w;
  const int r = s.peer;
  DeviceErrorState* err = error_state(w);
  if (threadIdx.x == 0 && (s.pull & kSideAnnounce)) {
    announce_type(own_user_slot(w, p2p_ce_word(a, r, kCeLseqS)),
                  peer_user_slot(w, r, p2p_ce_word(a, w.rank, kCeTypeS)), true);
  }
  // The slots overlay the staging: every staged chunk sent to this peer, pushed or pulled,
  // must have been consumed (HEAD of each channel up to its step counter).
  const dc_u64* steps = reinterpret_cast<const dc_u64*>(s.steps);
  bool ok = true;
  for (dc_u32 c = threadIdx.x; c < a.max_channels && ok; c += 32) {
    const dc_u64 step = steps[c];
    const dc_u64 slot = p2p_head_slot(a, r, c);
    if (step != 0) ok = bounded_wait(a, own_user_slot(w, slot), step, kOpSendSlotFree, r, slot);
  }
  const bool failed_drain = __any_sync(0xffffffffu, !ok);
  if (threadIdx.x != 0) return;
  dc_u64* own = own_user_slot(w, p2p_ce_word(a, r, 0));
  dc_u64* theirs = peer_user_slot(w, r, p2p_ce_word(a, w.rank, 0));
  const dc_u64 n = (s.bytes + s.chunk_bytes - 1) / s.chunk_bytes;
  const dc_u64 base = own[kCeSent];
  dc_u64 issued = 0, announced = 0;
  const auto step = [&]() -> int {
    int progress = 0;
    if (announced < issued) {
      const dc_u32 k = announced % kCeSlots;
      if (ld_acquire_sys(own + kCeDone + k) >= announced + 1) {
        publish(theirs + kCeTail, base + announced + 1);
        ++announced;
        progress = 1;
      }
    }
    if (issued < n) {
      const dc_u32 k = issued % kCeSlots;
      if (ld_acquire_sys(own + kCeHead + k) >= own[kCeLast + k]) {
        const dc_u64 g = base + issued;
        st_relaxed_sys(theirs + kCeIntent + k, g);
        st_relaxed_sys(theirs + kCeSize + k, s.bytes);
        own[kCeLast + k] = g + 1;
        fence_acq_rel_sys();  // INTENT is at the receiver before the chunk can move
        st_release_sys(own + kCeGo + k, issued + 1);
        ++issued;
        progress = 1;
      }
    }
    return progress;
  };
  // No progress for a whole timeout: waiting on the receiver (HEAD of the next slot) or on
  // this side's copies (DONE), whichever comes first in the order above.
  const auto timed_out = [&](dc_u64 waited) {
    const bool on_copy = announced < issued && issued == n;
    const dc_u32 k = (on_copy ? announced : issued) % kCeSlots;
    const dc_u32 word = (on_copy ? kCeDone : kCeHead) + k;
    record_wait_failure(err, w.rank, WaitSite{kOpSendSlotFree, r, p2p_ce_word(a, r, word)},
                        on_copy ? announced + 1 : own[kCeLast + k], ld_relaxed_sys(own + word),
                        waited);
  };
  const bool done = !failed_drain && pace_loop(w, step, [&] { return announced == n; },
                                               timed_out);
  if (!done) {
    for (; issued < n; ++issued) {
      const dc_u32 k = issued % kCeSlots;
      st_relaxed_sys(theirs + kCeIntent + k, base + issued);
      fence_acq_rel_sys();
      st_release_sys(own + kCeGo + k, issued + 1);
    }
    return;  // SENT stays: the communicator is aborted
  }
  // Every DONE of this call was seen, so the filling blocks are past their last GO too; the
  // copy streams, when there are any (s.pull == 0), put the even slots' GO back themselves.
  for (dc_u32 k = 0; k < kCeSlots; ++k) {
    own[kCeDone + k] = 0;
    if (p2p_ce_pulled(k) || (s.pull & kSidePull)) own[kCeGo + k] = 0;
  }
  own[kCeSent] = base + n;
}

// Blocks 1.. of p2p_ce_send_kernel (fb of fblocks): for each pulled chunk i (odd slot k), and
// for every chunk when this side moves its pushed chunks by SMs too (s.pull != 0), wait for
// GO[k] >= i + 1, copy this block's share of the chunk into slot k (the outbox, or the
// receiver's inbox over NVLink), and the last block done sets DONE[k] = i + 1 for the pacer.
// The wait allows twice the timeout: the pacer's own waits fail first and name what was
// missing, and on failure it releases every GO.
__device__ void ce_fill(const P2PLaunch& a, dc_u32 fb, dc_u32 fblocks) {
  const P2PSide& s = a.send;
  const DeviceWindow& w = a.w;
  const int r = s.peer;
  dc_u64* own = own_user_slot(w, p2p_ce_word(a, r, 0));
  unsigned char* outbox = reinterpret_cast<unsigned char*>(w.data) + p2p_outbox_offset(a, r);
  unsigned char* inbox =
      static_cast<unsigned char*>(get_nvlink_address(w, r)) + p2p_inbox_offset(a, w.rank);
  const unsigned char* src = reinterpret_cast<const unsigned char*>(s.buf);
  const dc_u64 n = (s.bytes + s.chunk_bytes - 1) / s.chunk_bytes;
  const bool by_sm = (s.pull & kSidePull) != 0;
  const dc_u64 first = by_sm ? 0 : 1, stride = by_sm ? 1 : 2;
  __shared__ int status;
  for (dc_u64 i = first; i < n; i += stride) {
    const dc_u32 k = i % kCeSlots;
    const dc_u64 off = i * s.chunk_bytes;
    const dc_u64 len = s.bytes - off < s.chunk_bytes ? s.bytes - off : s.chunk_bytes;
    if (threadIdx.x == 0) {
      const dc_u64 go = p2p_ce_word(a, r, kCeGo + k);
      status = wait_until(error_state(w), 2 * w.timeout_ns, w.rank, own + kCeGo + k, i + 1,
                          Cmp::Ge, WaitSite{kOpSendSlotFree, r, go})
                   ? 0
                   : 1;
    }
    __syncthreads();
    if (status != 0) return;
    const Span sp = block_span(len, fblocks, fb, 16);
    unsigned char* slot = (p2p_ce_pulled(k) ? outbox : inbox) + p2p_ce_slot_offset(a, k);
    copy_bytes<kCeCopyUnroll>(Block{}, slot + sp.begin, src + off + sp.begin, sp.len);
    __syncthreads();  // every thread's stores of the chunk are issued
    if (threadIdx.x == 0) {
      fence_acq_rel_sys();  // and visible to the receiver's copy engine before DONE
      const unsigned long long filled =
          atomicAdd(reinterpret_cast<unsigned long long*>(own + kCeFilled + k), 1ull);
      if (filled + 1 == fblocks) {
        own[kCeFilled + k] = 0;
        st_release_sys(own + kCeDone + k, i + 1);
      }
    }
  }
}

// Sends a copy-engine message: block 0's first warp paces it, blocks 1.. (s.blocks of them)
// fill the outbox slots of the pulled chunks; the host's copy streams push the others.
template <int THREADS>
__global__ void __launch_bounds__(THREADS, 1) p2p_ce_send_kernel(P2PLaunch a) {
  enter_after_previous_kernel();
  if (blockIdx.x == 0) {
    // The pacer runs even when the descriptor could not be stored: it releases every GO that
    // the copy streams wait on (their waits have no deadline).
    if (threadIdx.x < 32) {
      announce_call(a, a.send, kKindSendRecv);
      ce_pace_send(a);
    }
    return;
  }
  ce_fill(a, blockIdx.x - 1, gridDim.x - 1);
}

// Paces the pulled chunks of a copy-engine receive (thread 0 of the last block of
// p2p_ce_recv_kernel). Pulled chunk i (odd slot k, id g = RECV + i): once TAIL announces it
// and INTENT and SIZE match this call, GOR[k] = i + 1 lets the copy stream read it from the
// sender's outbox into the destination; once the copy stream reports DONER[k] = i + 1 and
// INTENT still holds g, HEAD[k] = g + 1 frees the slot at the sender. Last, it waits until the
// blocks copied every pushed chunk out (DRAINED) and advances RECV. On failure it releases
// every GOR still owed (the copy stream's waits have no deadline of their own).
__device__ void ce_pace_recv(const P2PLaunch& a, dc_u64 call) {
  const P2PSide& r = a.recv;
  const DeviceWindow& w = a.w;
  const int q = r.peer;
  DeviceErrorState* err = error_state(w);
  dc_u64* own = own_user_slot(w, p2p_ce_word(a, q, 0));
  dc_u64* theirs = peer_user_slot(w, q, p2p_ce_word(a, w.rank, 0));
  const dc_u64 n = (r.bytes + r.chunk_bytes - 1) / r.chunk_bytes;
  // With r.pull set, this side's blocks read the pulled chunks too, and DRAINED counts them.
  const dc_u64 pulls = (r.pull & kSidePull) ? 0 : n / 2, pushes = n - pulls;
  const dc_u64 base = own[kCeRecv];
  if (r.pull & kSideAnnounce) {
    announce_type(own + kCeLseqR, theirs + kCeTypeR, true);
  }
  dc_u64 issued = 0, completed = 0;  // pulled chunks: GOR set, slot freed
  // No GOR before the two sides agree on the call (agree.cuh).
  AgreeRecv ag = agree_recv(a, q, call, kKindSendRecv, r.bytes);
  const bool agreed = agree_recv_wait(a, ag);
  const auto mismatch = [&](dc_u32 k, dc_u64 g, bool after_copy) {
    return ce_mismatch(w, own, q, k, g, r.bytes, after_copy);
  };
  const auto step = [&]() -> int {
    int progress = 0;
    if (completed < issued) {
      const dc_u64 i = 2 * completed + 1;
      const dc_u32 k = i % kCeSlots;
      if (ld_acquire_sys(own + kCeDoneR + k) >= i + 1) {
        if (mismatch(k, base + i, true)) return -1;
        publish(theirs + kCeHead + k, base + i + 1);
        ++completed;
        progress = 1;
      }
    }
    if (issued < pulls) {
      const dc_u64 i = 2 * issued + 1;
      const dc_u32 k = i % kCeSlots;
      if (ld_acquire_sys(own + kCeTail) >= base + i + 1) {
        if (mismatch(k, base + i, false)) return -1;
        st_release_sys(own + kCeGoR + k, i + 1);
        ++issued;
        progress = 1;
      }
    }
    return progress;
  };
  const auto finished = [&] {
    return completed == pulls && ld_acquire_sys(own + kCeDrained) >= pushes;
  };
  const auto timed_out = [&](dc_u64 waited) {
    dc_u32 word;
    dc_u64 expected;
    if (issued < pulls) {  // the sender's announcement of the next pulled chunk
      word = kCeTail;
      expected = base + 2 * issued + 2;
    } else if (completed < pulls) {  // this side's copy stream
      const dc_u64 i = 2 * completed + 1;
      word = kCeDoneR + i % kCeSlots;
      expected = i + 1;
    } else {  // this kernel's blocks, copying the pushed chunks out
      word = kCeDrained;
      expected = pushes;
    }
    record_wait_failure(err, w.rank, WaitSite{kOpRecvSlotFull, q, p2p_ce_word(a, q, word)},
                        expected, ld_relaxed_sys(own + word), waited);
  };
  if (!agreed || !pace_loop(w, step, finished, timed_out)) {
    for (; issued < pulls; ++issued) {
      const dc_u64 i = 2 * issued + 1;
      st_release_sys(own + kCeGoR + i % kCeSlots, i + 1);
    }
    return;  // RECV stays: the communicator is aborted
  }
  // The copy stream put GOR back to 0 after its last wait; DONER and DRAINED are ours.
  for (dc_u32 k = 0; k < kCeSlots; ++k) own[kCeDoneR + k] = 0;
  own[kCeDrained] = 0;
  own[kCeRecv] = base + n;
}

// Block b of the blocks [0, r.blocks) that copy a copy-engine message out (p2p_ce_recv_kernel):
// its share of each pushed chunk (even slots) out of the inbox into the destination, and of
// every pulled chunk too (from the sender's outbox over NVLink) when this side moves them by
// SMs (r.pull != 0); the last block done with a chunk frees its slot (HEAD = id + 1) and counts
// it in DRAINED. Each block checks the slot's INTENT before and after its copy, so a chunk
// overwritten under it (the sender gave up waiting) or a chunk of another message is reported,
// never taken silently.
__device__ void ce_copy_out(const P2PLaunch& a, dc_u32 b, dc_u64 call) {
  const P2PSide& r = a.recv;
  const DeviceWindow& w = a.w;
  const int q = r.peer;
  DeviceErrorState* err = error_state(w);
  dc_u64* own = own_user_slot(w, p2p_ce_word(a, q, 0));
  dc_u64* theirs = peer_user_slot(w, q, p2p_ce_word(a, w.rank, 0));
  const unsigned char* inbox =
      reinterpret_cast<const unsigned char*>(w.data) + p2p_inbox_offset(a, q);
  const unsigned char* outbox =
      static_cast<const unsigned char*>(get_nvlink_address(w, q)) + p2p_outbox_offset(a, w.rank);
  unsigned char* dst = reinterpret_cast<unsigned char*>(r.buf);
  const dc_u64 n = (r.bytes + r.chunk_bytes - 1) / r.chunk_bytes;
  const dc_u64 base = own[kCeRecv];  // advanced by the pacer once every block is done
  const dc_u64 stride = (r.pull & kSidePull) ? 1 : 2;
  __shared__ int status;
  if (threadIdx.x == 0) {  // nothing is copied before the two sides agree (agree.cuh)
    AgreeRecv ag = agree_recv(a, q, call, kKindSendRecv, r.bytes);
    status = agree_recv_wait(a, ag) ? 0 : 1;
  }
  __syncthreads();
  if (status != 0) return;
  for (dc_u64 i = 0; i < n; i += stride) {
    const dc_u32 k = i % kCeSlots;
    const dc_u64 g = base + i;
    const dc_u64 off = i * r.chunk_bytes;
    const dc_u64 len = r.bytes - off < r.chunk_bytes ? r.bytes - off : r.chunk_bytes;
    if (threadIdx.x == 0) {
      const dc_u64 tail = p2p_ce_word(a, q, kCeTail);
      status = wait_until(err, w.timeout_ns, w.rank, own + kCeTail, g + 1, Cmp::Ge,
                          WaitSite{kOpRecvSlotFull, q, tail})
                   ? 0
                   : 1;
      if (status == 0 && ce_mismatch(w, own, q, k, g, r.bytes, false)) status = 1;
    }
    __syncthreads();
    if (status != 0) return;
    const Span sp = block_span(len, r.blocks, b, 16);
    // Local loads, but 16 in flight per thread: few blocks must keep up with the copy engine
    // (8 in flight measured about 20 GB/s per SM on 16 blocks under the incoming copy).
    const unsigned char* slot = (p2p_ce_pulled(k) ? outbox : inbox) + p2p_ce_slot_offset(a, k);
    copy_bytes<kCeCopyUnroll>(Block{}, dst + off + sp.begin, slot + sp.begin, sp.len);
    __syncthreads();  // every thread's loads of the slot have returned
    if (threadIdx.x == 0) {
      fence_acq_rel_sys();
      if (ce_mismatch(w, own, q, k, g, r.bytes, true)) {
        status = 1;
      } else {
        const unsigned long long done =
            atomicAdd(reinterpret_cast<unsigned long long*>(own + kCeCnt + k), 1ull);
        if (done + 1 == r.blocks) {  // the last block out frees the slot
          own[kCeCnt + k] = 0;
          publish(theirs + kCeHead + k, g + 1);
          atomicAdd(reinterpret_cast<unsigned long long*>(own + kCeDrained), 1ull);
        }
      }
    }
    __syncthreads();
    if (status != 0) return;
  }
}


// Receives a copy-engine message: blocks [0, r.blocks) copy it out (ce_copy_out), the last
// block paces the pulled chunks that the host's copy stream moves (ce_pace_recv).
template <int THREADS>
__global__ void __launch_bounds__(THREADS, 1) p2p_ce_recv_kernel(P2PLaunch a) {
  enter_after_previous_kernel();
  const dc_u64 call = agree_recv_call(a, a.recv.peer);
  if (blockIdx.x == a.recv.blocks) {
    if (threadIdx.x == 0) ce_pace_recv(a, call);
  } else {
    ce_copy_out(a, blockIdx.x, call);
  }
  __syncthreads();
  if (threadIdx.x == 0) agree_recv_done(a, a.recv.peer, call, a.recv.blocks + 1);
}


// ---- A launch with two roles and a negotiated large message (p2p.cuh, P2PNegotiated) ----

// Blocks of role side `st` (its copy-engine side `ce`) in p2p_negotiated_kernel: a gated role
// gets enough for either layout (the staged blocks, or the copy-engine blocks and the pacer).
__device__ __forceinline__ dc_u32 negotiated_blocks(const P2PSide& st, const P2PSide& ce) {
  if (st.peer < 0) return 0;
  if (!(st.pull & kSideGated)) return st.blocks;
  return st.blocks > ce.blocks + 1 ? st.blocks : ce.blocks + 1;
}

// Both roles of a launch in which at least one is a negotiated large message, one kernel on
// the caller's stream (docs/PROTOCOL.md, "Which large messages use it"). Blocks take roles as
// in p2p_split_kernel<THREADS, INTERLEAVE>. A gated role's block 0 decides its layout
// (decide_role); every block of the role then waits for the decision and runs it: the staged
// protocol on the staged side's blocks and warps, or the copy-engine layout moved by SMs (the
// sender's pacer in block 0 and its outbox fillers in blocks 1..; the receiver's copying blocks
// and its pacer in the block after them). The role's last block out puts DECISION back to 0.
// The roles never wait on each other: the peer may serve them from two launches in turn (its
// send, then its receive), and every block of this launch is resident at once (at most
// 2 x max_blocks + 2 blocks of THREADS threads).
template <int THREADS, bool INTERLEAVE>
__global__ void __launch_bounds__(THREADS, 1) p2p_negotiated_kernel(P2PNegotiated n) {
  enter_after_previous_kernel();
  const P2PLaunch& a = n.a;
  bool send;
  dc_u32 b;
  const dc_u32 nb[2] = {negotiated_blocks(a.send, n.ce_send), negotiated_blocks(a.recv, n.ce_recv)};
  split_block(nb[0], nb[1], INTERLEAVE, send, b);
  const int i = send ? 0 : 1;
  const P2PSide& st = send ? a.send : a.recv;
  if (b >= nb[i]) return;
  if (!(st.pull & kSideGated)) {
    plain_role(a, send, b, n.threads[i], true);
    return;
  }
  // A gated role numbers and ends its call here, around whichever layout it takes.
  const dc_u64 call = send ? 0 : agree_recv_call(a, st.peer);
  // The copy-engine sides in place of the staged ones, for the copy-engine code.
  __shared__ P2PLaunch ce;
  if (threadIdx.x == 0) {
    ce = a;
    ce.send = n.ce_send;
    ce.recv = n.ce_recv;
    if (b == 0) {
      // The call is checked before its layout is negotiated: a peer whose call differs (say
      // a staged send of another size, which negotiates nothing) is a mismatch at once, not
      // a negotiation that times out. A failed check decides nothing: the role's blocks
      // find DECISION failed and move nothing.
      bool agreed = true;
      if (send) {
        agree_send(a, st.peer, kKindSendRecv, st.bytes);  // a failure aborts: the waits end
      } else {
        AgreeRecv ag = agree_recv(a, st.peer, call, kKindSendRecv, st.bytes);
        agreed = agree_recv_wait(a, ag);
      }
      if (agreed) {
        decide_role(a, st, i);
      } else {
        st_release_sys(own_user_slot(a.w, p2p_ce_word(a, st.peer, kCeDecR)), kDecisionFailed);
      }
    }
  }
  __syncthreads();
  const P2PSide& cs = send ? ce.send : ce.recv;
  const dc_u32 dec_word = send ? kCeDecS : kCeDecR;
  if (gate_open(ce, cs, dec_word, kDecisionCe)) {
    if (send) {
      if (b == 0) {
        if (threadIdx.x < 32) ce_pace_send(ce);
      } else if (b <= cs.blocks) {
        ce_fill(ce, b - 1, cs.blocks);
      }
    } else if (b < cs.blocks) {
      ce_copy_out(ce, b, call);
    } else if (b == cs.blocks && threadIdx.x == 0) {
      ce_pace_recv(ce, call);
    }
  } else if (b < st.blocks) {
    // The staged layout (bulk_send and bulk_recv check the decision themselves).
    plain_role(a, send, b, THREADS, false);
  }
  // Out: once every block of the role has read the decision, the last one clears it.
  __syncthreads();
  if (threadIdx.x == 0) {
    dc_u64* own = own_user_slot(a.w, p2p_ce_word(a, st.peer, 0));
    const dc_u32 out_word = send ? kCeOutS : kCeOutR;
    const unsigned long long out =
        atomicAdd(reinterpret_cast<unsigned long long*>(own + out_word), 1ull);
    if (out + 1 == nb[i]) {
      own[out_word] = 0;
      own[dec_word] = 0;
      if (!send) agree_recv_end(a, st.peer, call);
    }
  }
}

}  // namespace p2p
}  // namespace devcomm
