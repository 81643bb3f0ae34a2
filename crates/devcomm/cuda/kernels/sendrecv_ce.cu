// Part of the send/recv kernels' translation unit: the copy-engine kernels. Compiled as one source with
// sendrecv.cu and the other sendrecv_*.cu files, in the order of p2p/kernels.rs's
// SENDRECV_SOURCE (this part uses what the earlier ones define).

namespace devcomm {
namespace p2p {

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
  const dc_u64 call = agree_recv_begin(a, a.recv.peer, blockIdx.x == 0 && threadIdx.x == 0);
  if (blockIdx.x == a.recv.blocks) {
    if (threadIdx.x == 0) ce_pace_recv(a, call);
  } else {
    ce_copy_out(a, blockIdx.x, call);
  }
  __syncthreads();
  if (threadIdx.x == 0) agree_recv_done(a, a.recv.peer, call, a.recv.blocks + 1);
}

}  // namespace p2p
}  // namespace devcomm
