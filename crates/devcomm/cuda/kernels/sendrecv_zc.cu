// Part of the send/recv kernels' translation unit: the zero-copy kernels. Compiled as one source with
// sendrecv.cu and the other sendrecv_*.cu files, in the order of p2p/kernels.rs's
// SENDRECV_SOURCE (this part uses what the earlier ones define).

namespace devcomm {
namespace p2p {

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
  const dc_u64 call = agree_recv_begin(z.p, r.peer, lane == 0);
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

}  // namespace p2p
}  // namespace devcomm
