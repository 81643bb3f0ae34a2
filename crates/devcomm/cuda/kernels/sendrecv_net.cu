// Send/recv with network peers: host staging, descriptors to the proxy (devcomm/net_p2p.cuh
// describes the protocol; docs/NETWORK.md, "Send/recv over the network"). Instantiated as
//   devcomm::p2p::p2p_net_kernel<THREADS>
// Block 0 is the send role when there is one; the other block (or block 0 alone) receives. The
// two roles use separate queues (data and credit channels), so each queue has one producer.
#include "devcomm/net_p2p.cuh"

namespace devcomm {
namespace p2p {

// The send role (every thread of the block). Counters [peer][0..2): chunks sent, calls sent;
// advanced only when the call completed (a failed call aborts the communicator anyway).
__device__ inline void net_send_role(const NetP2PLaunch& a) {
  const Block g;
  const int peer = a.send_peer;
  dc_u64* ctr = reinterpret_cast<dc_u64*>(a.counters) + 4ull * peer;
  const dc_u64 sent = ctr[0];
  const dc_u64 call = ctr[1] + 1;
  const dc_u64 n = (a.send_bytes + a.slot_bytes - 1) / a.slot_bytes;
  const unsigned char* src = reinterpret_cast<const unsigned char*>(a.send_buf);
  unsigned char* staging = reinterpret_cast<unsigned char*>(a.staging);
  for (dc_u64 i = 0; i < n; ++i) {
    const dc_u64 j = sent + i;
    const dc_u64 slot = j % a.slots;
    bool ok = true;
    if (g.thread_rank() == 0 && j >= a.slots) ok = net_wait_free(a, peer, j - a.slots + 1, slot);
    if (g.any(!ok)) return;
    const dc_u64 off = i * a.slot_bytes;
    const dc_u64 len = a.send_bytes - off < a.slot_bytes ? a.send_bytes - off : a.slot_bytes;
    const dc_u64 out = net_outbox(a, peer, slot);
    copy_bytes(g, staging + out + kNetHeaderBytes, src + off, len);
    if (g.thread_rank() == 0) {
      volatile NetChunkHeader* h = reinterpret_cast<volatile NetChunkHeader*>(staging + out);
      h->kind = kNetChunkKind;
      h->chunk = static_cast<dc_u32>(i);
      h->call = call;
      h->bytes = a.send_bytes;
    }
    // net_submit syncs the block and fences before the descriptor is published.
    const dc_u64 seq = net_put_signal(g, a.q, peer, kNetChannelData, a.key, out,
                                      net_inbox(a, static_cast<int>(a.q.rank), slot),
                                      kNetHeaderBytes + len, a.key, 2ull * a.q.rank, j + 1);
    if (g.any(g.thread_rank() == 0 && seq == 0)) return;
  }
  // Every chunk taken (or the call refused) before the call ends.
  bool ok = true;
  if (g.thread_rank() == 0) ok = net_wait_free(a, peer, sent + n, (sent + n) % a.slots);
  if (g.any(!ok)) return;
  if (g.thread_rank() == 0) {
    ctr[0] = sent + n;
    ctr[1] = call;
  }
}

// The receive role (every thread of the block). Counters [peer][2..4): chunks received, calls
// received. The header of every chunk is checked before its payload is copied out.
__device__ inline void net_recv_role(const NetP2PLaunch& a) {
  const Block g;
  const int peer = a.recv_peer;
  dc_u64* ctr = reinterpret_cast<dc_u64*>(a.counters) + 4ull * peer;
  const dc_u64 received = ctr[2];
  const dc_u64 call = ctr[3] + 1;
  const dc_u64 n = (a.recv_bytes + a.slot_bytes - 1) / a.slot_bytes;
  unsigned char* dst = reinterpret_cast<unsigned char*>(a.recv_buf);
  const unsigned char* staging = reinterpret_cast<const unsigned char*>(a.staging);
  const dc_i32 rank = static_cast<dc_i32>(a.q.rank);
  for (dc_u64 i = 0; i < n; ++i) {
    const dc_u64 j = received + i;
    const dc_u64 slot = j % a.slots;
    const dc_u64 in = net_inbox(a, peer, slot);
    bool ok = true;
    if (g.thread_rank() == 0) {
      ok = wait_until(net_errors(a), a.q.timeout_ns, rank, net_word(a, 2ull * peer), j + 1,
                      Cmp::Ge, WaitSite{kOpRecvSlotFull, peer, slot});
      if (ok) {
        const volatile NetChunkHeader* h =
            reinterpret_cast<const volatile NetChunkHeader*>(staging + in);
        const dc_u32 field = net_header_differs(h, call, a.recv_bytes, i);
        if (field != 0) {
          const dc_u64 local = field == kNetFieldBytes ? a.recv_bytes
                               : field == kNetFieldCall ? call
                                                        : kNetChunkKind;
          const dc_u64 remote = field == kNetFieldBytes ? h->bytes
                                : field == kNetFieldCall ? h->call
                                                         : h->kind;
          net_refuse(a, peer, field, local, remote);
          ok = false;
        }
      }
    }
    if (g.any(!ok)) return;  // any() orders thread 0's acquire before the copy below
    const dc_u64 off = i * a.slot_bytes;
    const dc_u64 len = a.recv_bytes - off < a.slot_bytes ? a.recv_bytes - off : a.slot_bytes;
    copy_bytes(g, dst + off, staging + in + kNetHeaderBytes, len);
    // net_submit syncs the block and fences: the slot is read before it is handed back.
    const dc_u64 seq = net_signal(g, a.q, peer, kNetChannelCredit, a.key, 2ull * a.q.rank + 1, j + 1);
    if (g.any(g.thread_rank() == 0 && seq == 0)) return;
  }
  if (g.thread_rank() == 0) {
    ctr[2] = received + n;
    ctr[3] = call;
  }
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
