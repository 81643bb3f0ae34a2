// Part of the send/recv kernels' translation unit: the negotiated kernel. Compiled as one source with
// sendrecv.cu and the other sendrecv_*.cu files, in the order of p2p/kernels.rs's
// SENDRECV_SOURCE (this part uses what the earlier ones define).

namespace devcomm {
namespace p2p {

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
  const dc_u64 call = send ? 0 : agree_recv_begin(a, st.peer, b == 0 && threadIdx.x == 0);
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
