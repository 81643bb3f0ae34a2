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

}  // namespace p2p
}  // namespace devcomm
