// Send/recv with network peers: host staging, descriptors to the proxy (devcomm/net_p2p.cuh
// describes the protocol; docs/NETWORK.md, "Send/recv over the network"). Instantiated as
//   devcomm::p2p::p2p_net_kernel<THREADS>
// Block 0 is the send role when there is one; the other block (or block 0 alone) receives. The
// two roles use separate queues (data and credit channels), so each queue has one producer.
#include "devcomm/net_p2p.cuh"

namespace devcomm {
namespace p2p {

// The send role (every thread of the block).
__device__ inline void net_send_role(const NetP2PLaunch& a) {
  const unsigned char* src = reinterpret_cast<const unsigned char*>(a.send_buf);
  const NetCallDesc d{kNetChunkKind, a.send_bytes, 0, 0};
  net_send_call(Block{}, a, a.send_peer, d, 0,
                [&](const Block& g, unsigned char* payload, dc_u64 off, dc_u64 len) {
                  copy_bytes(g, payload, src + off, len);
                });
}

// The receive role (every thread of the block): the header of every chunk is checked before
// its payload is copied out.
__device__ inline void net_recv_role(const NetP2PLaunch& a) {
  unsigned char* dst = reinterpret_cast<unsigned char*>(a.recv_buf);
  const NetCallDesc e{kNetChunkKind, a.recv_bytes, 0, 0};
  net_recv_call(
      Block{}, a, a.recv_peer, e, 0, false, [](const NetCallDesc&) { return true; },
      [&](const Block& g, const unsigned char* payload, dc_u64 off, dc_u64 len) {
        copy_bytes(g, dst + off, payload, len);
      });
}

template <int THREADS>
__global__ void __launch_bounds__(THREADS) p2p_net_kernel(NetP2PLaunch a) {
  enter_after_previous_kernel();
  const bool sends = a.send_peer >= 0;
  if (sends && blockIdx.x == 0) {
    net_send_role(a);
  } else if (a.recv_peer >= 0) {
    net_recv_role(a);
  }
}

}  // namespace p2p
}  // namespace devcomm
