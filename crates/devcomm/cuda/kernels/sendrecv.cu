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
  // The abort mirror's address is loaded before the wait for the previous kernel, so that the
  // low-latency sender's read of the mirror is one load, next to its other first loads.
  const dc_u64 mirror_at = mirror_address(a.w);
  enter_after_previous_kernel();
  DC_TRACE_KERNEL_BEGIN();
  const dc_u32 b = blockIdx.x;
  const ByteSend snd{reinterpret_cast<const unsigned char*>(a.send.buf)};
  const ByteRecv rcv{reinterpret_cast<unsigned char*>(a.recv.buf)};
  if (SEND_THREADS > 0 && threadIdx.x < SEND_THREADS) {
    if (a.send.peer < 0 || b >= a.send.blocks) return;
    DC_TRACE_PHASE_BEGIN(kPhaseSend, a.send.peer);
    if (a.send.low_latency) {
      ll_send(NamedBarrier(1, 0, SEND_THREADS), a, a.send, snd, b, true, mirror_at);
    } else {
      constexpr dc_u32 kWarps = SEND_THREADS / 32;
      if (b == 0 && threadIdx.x < 32 && !announce_call(a, a.send, kKindSendRecv)) return;
      bulk_send(Warp{}, a, a.send, snd, b * kWarps + threadIdx.x / 32, a.send.blocks * kWarps);
    }
    DC_TRACE_PHASE_END(kPhaseSend, a.send.peer, b == 0 ? a.send.bytes : 0);
    DC_TRACE_KERNEL_END(0);
  } else if (RECV_THREADS > 0) {
    if (a.recv.peer < 0 || b >= a.recv.blocks) return;
    DC_TRACE_EVENT_BY(threadIdx.x == SEND_THREADS, kTracePhaseBegin, kPhaseRecv, a.recv.peer, 0, 0);
    const dc_u64 call = agree_recv_begin(a, a.recv.peer, b == 0 && threadIdx.x == SEND_THREADS);
    if (a.recv.low_latency) {
      ll_recv(NamedBarrier(2, SEND_THREADS, RECV_THREADS), a, a.recv, rcv, b, recv_call(a, call),
              true);
    } else {
      constexpr dc_u32 kWarps = RECV_THREADS / 32;
      bulk_recv(Warp{}, a, a.recv, rcv, b * kWarps + (threadIdx.x - SEND_THREADS) / 32,
                a.recv.blocks * kWarps, recv_call(a, call));
      NamedBarrier(2, SEND_THREADS, RECV_THREADS).sync();
      if (threadIdx.x == SEND_THREADS) agree_recv_done(a, a.recv.peer, call, a.recv.blocks);
    }
    DC_TRACE_EVENT_BY(threadIdx.x == SEND_THREADS, kTracePhaseEnd, kPhaseRecv, a.recv.peer, 0,
                      b == 0 ? a.recv.bytes : 0);
    DC_TRACE_EVENT_BY(threadIdx.x == SEND_THREADS, kTraceKernelEnd, 0, -1, 0, 0);
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
                                           bool own_call, dc_u64 mirror_at = kMirrorUnknown) {
  if (threadIdx.x >= threads) return;
  const dc_u32 warps = threads / 32;
  if (send) {
    const ByteSend snd{reinterpret_cast<const unsigned char*>(a.send.buf)};
    if (a.send.low_latency) {
      ll_send(NamedBarrier(1, 0, threads), a, a.send, snd, b, true, mirror_at);
    } else {
      if (own_call && b == 0 && threadIdx.x < 32 && !announce_call(a, a.send, kKindSendRecv)) {
        return;
      }
      bulk_send(Warp{}, a, a.send, snd, b * warps + threadIdx.x / 32, a.send.blocks * warps);
    }
  } else {
    const ByteRecv rcv{reinterpret_cast<unsigned char*>(a.recv.buf)};
    // A role whose kernel numbers the call itself (!own_call) is never low-latency.
    const dc_u64 call = agree_recv_begin(a, a.recv.peer, own_call && b == 0 && threadIdx.x == 0);
    if (a.recv.low_latency) {
      ll_recv(NamedBarrier(2, 0, threads), a, a.recv, rcv, b, recv_call(a, call), true);
    } else {
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
  const dc_u64 mirror_at = mirror_address(a.w);  // before the wait, as p2p_kernel
  enter_after_previous_kernel();
  bool send;
  dc_u32 b;
  split_block(a.send.blocks, a.recv.blocks, INTERLEAVE, send, b);
  if (!send && b >= a.recv.blocks) return;
  DC_TRACE_KERNEL_BEGIN();
  DC_TRACE_PHASE_BEGIN(send ? kPhaseSend : kPhaseRecv, (send ? a.send : a.recv).peer);
  plain_role(a, send, b, THREADS, true, mirror_at);
  DC_TRACE_PHASE_END(send ? kPhaseSend : kPhaseRecv, (send ? a.send : a.recv).peer,
                     b == 0 ? (send ? a.send : a.recv).bytes : 0);
  DC_TRACE_KERNEL_END(0);
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
  DC_TRACE_KERNEL_BEGIN();
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
    const dc_u64 call = agree_recv_begin(a, p, true);
    AgreeRecv ag = agree_recv(a, p, call, kKindBarrier, 0);
    ok = agree_recv_wait(a, ag);
    if (ok) agree_recv_end(a, p, call);
  }
  fence_acq_rel_sys();
  DC_TRACE_KERNEL_END(0);
}

}  // namespace p2p
}  // namespace devcomm
