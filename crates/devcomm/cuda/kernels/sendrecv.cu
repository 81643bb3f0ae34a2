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

// The grid has max(send.blocks, recv.blocks) blocks; a role's surplus blocks return at once.
// Bulk channel numbering: warp w of block b is channel b * warps + w, the same on both ranks
// because both take blocks and threads from the message size (src/p2p/config.rs).
template <int SEND_THREADS, int RECV_THREADS>
__global__ void __launch_bounds__(SEND_THREADS + RECV_THREADS, 1) p2p_kernel(P2PLaunch a) {
  const dc_u32 b = blockIdx.x;
  const ByteSend snd{reinterpret_cast<const unsigned char*>(a.send.buf)};
  const ByteRecv rcv{reinterpret_cast<unsigned char*>(a.recv.buf)};
  if (SEND_THREADS > 0 && threadIdx.x < SEND_THREADS) {
    if (a.send.peer < 0 || b >= a.send.blocks) return;
    if (a.send.low_latency) {
      ll_send(NamedBarrier(1, 0, SEND_THREADS), a, a.send, snd, b);
    } else {
      constexpr dc_u32 kWarps = SEND_THREADS / 32;
      bulk_send(Warp{}, a, a.send, snd, b * kWarps + threadIdx.x / 32, a.send.blocks * kWarps);
    }
  } else if (RECV_THREADS > 0) {
    if (a.recv.peer < 0 || b >= a.recv.blocks) return;
    if (a.recv.low_latency) {
      ll_recv(NamedBarrier(2, SEND_THREADS, RECV_THREADS), a, a.recv, rcv, b);
    } else {
      constexpr dc_u32 kWarps = RECV_THREADS / 32;
      bulk_recv(Warp{}, a, a.recv, rcv, b * kWarps + (threadIdx.x - SEND_THREADS) / 32,
                a.recv.blocks * kWarps);
    }
  }
}

// Both directions with the roles in separate blocks: blocks [0, send.blocks) send, the next
// recv.blocks receive, each with all THREADS threads. Used when both roles have the same thread
// count and DEVCOMM_P2P_SPLIT is not 0 (docs/PERFORMANCE.md compares it with p2p_kernel).
template <int THREADS>
__global__ void __launch_bounds__(THREADS, 1) p2p_split_kernel(P2PLaunch a) {
  constexpr dc_u32 kWarps = THREADS / 32;
  const ByteSend snd{reinterpret_cast<const unsigned char*>(a.send.buf)};
  const ByteRecv rcv{reinterpret_cast<unsigned char*>(a.recv.buf)};
  if (blockIdx.x < a.send.blocks) {
    const dc_u32 b = blockIdx.x;
    if (a.send.low_latency) {
      ll_send(NamedBarrier(1, 0, THREADS), a, a.send, snd, b);
    } else {
      bulk_send(Warp{}, a, a.send, snd, b * kWarps + threadIdx.x / 32, a.send.blocks * kWarps);
    }
  } else {
    const dc_u32 b = blockIdx.x - a.send.blocks;
    if (b >= a.recv.blocks) return;
    if (a.recv.low_latency) {
      ll_recv(NamedBarrier(2, 0, THREADS), a, a.recv, rcv, b);
    } else {
      bulk_recv(Warp{}, a, a.recv, rcv, b * kWarps + threadIdx.x / 32, a.recv.blocks * kWarps);
    }
  }
}

// ---- Zero-copy into a registered destination (docs/PROTOCOL.md, "Zero-copy") ----

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
    const dc_u64 ready_slot = zc_desc_slot(z, s.peer, kZcReady);
    const dc_u64* desc = own_user_slot(w, ready_slot);
    status = wait_until(error_state(w), w.timeout_ns, w.rank, desc, seq, Cmp::Ge,
                        WaitSite{kOpZcReady, s.peer, ready_slot})
                 ? 0
                 : 2;
    if (status == 0) {
      // After the acquire of READY: the descriptor the receiver wrote before it is visible.
      const dc_u64 mine[3] = {z.send_reg, z.send_offset, s.bytes};
      for (dc_u32 f = 0; f < 3; ++f) {
        const dc_u64 theirs = ld_relaxed_sys(desc + 1 + f);
        if (theirs != mine[f]) {
          status = 1;
          if (b == 0) {
            record_soft_error(error_state(w), kOpZcMismatch, w.rank, s.peer, f, mine[f], theirs);
          }
          break;
        }
      }
    }
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
    for (dc_u32 i = threadIdx.x; i < z.p.max_blocks; i += blockDim.x) {
      st_release_sys(peer_user_slot(w, s.peer, zc_done_slot(z, w.rank, i)), 2 * seq + 1);
    }
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
  if (lane == 0) {
    // Stream order: every earlier kernel of this stream, including any reader of the
    // destination, has finished, so the sender may overwrite it from now on.
    dc_u64* desc = peer_user_slot(w, r.peer, zc_desc_slot(z, w.rank, 0));
    st_relaxed_sys(desc + kZcReg, z.recv_reg);
    st_relaxed_sys(desc + kZcOffset, z.recv_offset);
    st_relaxed_sys(desc + kZcBytes, r.bytes);
    publish(desc + kZcReady, seq);
  }
  bool ok = true, refused = false;
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
  }
}

// One launch for a zero-copy send, receive or both: blocks [0, send.blocks) send, one more block
// receives (its first warp), so both directions at once cannot deadlock.
template <int THREADS>
__global__ void __launch_bounds__(THREADS, 1) p2p_zc_kernel(ZcLaunch z) {
  const dc_u32 send_blocks = z.p.send.peer >= 0 ? z.p.send.blocks : 0;
  if (blockIdx.x < send_blocks) {
    zc_send(z, blockIdx.x);
  } else if (z.p.recv.peer >= 0 && threadIdx.x < 32) {
    zc_recv(z);
  }
}

}  // namespace p2p
}  // namespace devcomm
