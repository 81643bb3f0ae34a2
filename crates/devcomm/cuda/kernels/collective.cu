// kernels/collective.cu: all-to-all and all-to-all-v as one fused peer x block kernel over the
// send/recv protocol, with the user's hooks fused into the copy steps (the device functions are
// devcomm/collective.cuh). The schedule is docs/COLLECTIVES.md; the host side is
// src/collective/, which appends this file to the hooks' source and instantiates
//   devcomm::coll::coll_kernel<HOOKS, THREADS, MIXED, NET>
//
// Grid: 2 (W - 1) x B + S blocks of THREADS threads, B = blocks_per_peer, S = self_blocks.
// Roles r in [0, 2W - 1):
//   r in [0, W - 1):        send to peer (rank + 1 + r) % W
//   r in [W - 1, 2W - 2):   receive from peer (rank - 1 - (r - W + 1)) mod W
//   r = 2W - 2:             this rank's own chunk (produce then consume, no wire)
// take the blocks in turn (docs/COLLECTIVES.md "The schedule"): with S >= B
// block i < (2W - 1) B serves role i mod (2W - 1), and the own chunk's further S - B blocks come
// last; with S < B the peer roles take blocks [0, 2(W-1) B) in turn, the own chunk the rest.
// Each (peer, direction) gets a plan from its wire size and its peer's tuning class (NVLink or
// network-like); blocks of a role beyond its plan's count return at once (seed 001's masking).
// Both ends compute the same plan from the same count, so counters and spans agree.
//
// Network peers (NET kernels, bit q of net_links): the role's block 0 moves the peer's chunk
// through the host staging and the proxy (devcomm/net_p2p.cuh, docs/NETWORK.md), its other
// blocks return at once. Every call sends at least one chunk, whose header carries what the
// call is (checked before anything is written) and, for all-to-all-v, the count: the
// receiving block publishes it into this rank's own count slot, where the NVLink peers' counts
// arrive, so that every role's prefix sum sees all of them.
//
// Modes: kModeUniform (all-to-all: `rows` for every peer), kModePeerRows (send/recv with hooks:
// host-given rows per peer in `peer_rows`, chunks packed in rank order), kModeDeviceCounts
// (all-to-all-v). All-to-all-v: counts are rows, read from device memory. Each sender
// publishes its count to the receiver's signal pad (a value slot and a sequence slot per
// parity); every receiving block waits for all counts, prefix-sums them into receive offsets,
// and checks the total against the receive capacity. On overflow the receiver still drains
// every peer's data (so no peer waits on it) but writes nothing and records the error; the
// communicator stays usable.
#include "devcomm/collective.cuh"

namespace devcomm {
namespace coll {

// Bulk channel of this thread: each warp moves one channel's chunks (several warps per channel
// were slower, docs/PERFORMANCE.md); f(group, channel, channels).
template <int THREADS, class F>
__device__ __forceinline__ void bulk_channel(dc_u32 b, dc_u32 blocks, F f) {
  constexpr dc_u32 kPerBlock = THREADS / 32;
  f(Warp{}, b * kPerBlock + threadIdx.x / 32, blocks * kPerBlock);
}

// A network peer's send role (block 0 of the role; docs/NETWORK.md): the chunk through H::produce
// into the outbox slots, at least one chunk per call (its header tells the receiver the call
// and, for all-to-all-v, the count).
template <class H>
__device__ void net_send_role(const CollLaunch& a, int peer) {
  dc_u64 rows, first;
  send_range(a, peer, rows, first, threadIdx.x == 0);
  const dc_u64 n = rows * a.row_len;
  const HookSend<H> m{{base_ctx<H>(a, peer, rows, true), first * a.row_len, n}};
  const NetCallDesc d{kNetCollKind, Shape<H>::wire_bytes(n), a.op,
                      a.mode == kModeDeviceCounts ? rows : 0};
  net_send_call(Block{}, a.net, peer, d, 1,
                [&](const Block& g, unsigned char* payload, dc_u64 off, dc_u64 len) {
                  m.chunk(g, reinterpret_cast<char*>(payload), off, len);
                });
}

// A network peer's receive role (block 0 of the role): chunk 0's header is checked first (the
// operation, and the wire size where this rank knows it); an all-to-all-v takes the count from
// it, publishes it into its own count slot (where an NVLink sender would have written it) and
// then checks the wire size against the rows it implies. The chunks go through H::consume
// (discarded on an overflow, as for NVLink peers).
template <class H, int THREADS>
__device__ void net_recv_role(const CollLaunch& a, int peer, dc_u64 seq) {
  const bool counts = a.mode == kModeDeviceCounts;
  dc_u64 rows = 0, first = 0, total = 0;
  bool overflow = false;
  NetCallDesc e{kNetCollKind, 0, a.op, 0};
  if (!counts) {  // these modes know their rows without waiting
    recv_range<THREADS>(a, peer, seq, rows, first, total, overflow);
    e.bytes = Shape<H>::wire_bytes(rows * a.row_len);
  }
  auto start = [&](const NetCallDesc& got) {
    if (counts) {
      if (threadIdx.x == 0) {
        const dc_u64 vslot = count_val_slot(a, peer, seq);
        *reinterpret_cast<volatile dc_u64*>(own_user_slot(a.p.w, vslot)) = got.rows;
        st_release_sys(own_user_slot(a.p.w, vslot + 1), seq);
      }
      if (!recv_range<THREADS>(a, peer, seq, rows, first, total, overflow)) return false;
      const dc_u64 wire = Shape<H>::wire_bytes(rows * a.row_len);
      if (wire != got.bytes) {  // another row length on the sender
        if (threadIdx.x == 0) net_refuse(a.net, peer, kFieldCollBytes, wire, got.bytes);
        return false;
      }
    }
    if (threadIdx.x == 0) {
      if (a.recv_counts != 0) reinterpret_cast<dc_u64*>(a.recv_counts)[peer] = rows;
      if (a.recv_offsets != 0) reinterpret_cast<dc_u64*>(a.recv_offsets)[peer] = first;
    }
    return true;
  };
  net_recv_call(Block{}, a.net, peer, e, 1, counts, start,
                [&](const Block& g, const unsigned char* payload, dc_u64 off, dc_u64 len) {
                  const HookRecv<H> m{
                      {base_ctx<H>(a, peer, rows, false), first * a.row_len, rows * a.row_len},
                      overflow};
                  m.chunk(g, reinterpret_cast<const char*>(payload), off, len, false);
                });
}

// Send/recv with hooks (kModePeerRows) has no call with a peer it moves no rows with: both
// ends know the rows from the host, skip the role alike, and leave its counters as they were,
// so ranks outside the call need not make it.
__device__ __forceinline__ bool peer_rows_skip(const CollLaunch& a, int dir, int peer) {
  return a.mode == kModePeerRows && a.peer_rows[dir][peer] == 0;
}

template <class H, int THREADS, bool MIXED, bool NET>
__device__ void send_role(const CollLaunch& a, int peer, dc_u32 b, dc_u64 seq) {
  if (peer_rows_skip(a, 0, peer)) return;
  if (NET && ((a.net_links >> peer) & 1u)) {
    if (b == 0) net_send_role<H>(a, peer);
    return;
  }
  dc_u64 rows, first;
  send_range(a, peer, rows, first, b == 0 && threadIdx.x == 0);
  if (a.mode == kModeDeviceCounts && b == 0 && threadIdx.x == 0) publish_count(a, peer, rows, seq);
  const dc_u64 n = rows * a.row_len;
  // Every call tells the peer what it is (devcomm/agree.cuh), even when it sends nothing.
  if (b == 0 && threadIdx.x == 0) {
    p2p::agree_send(a.p, peer, kKindCollective, coll_agree_payload(a, Shape<H>::wire_bytes(n)));
  }
  const bool net = MIXED && ((a.net_peers >> peer) & 1u);
  const Plan pl = plan_for<THREADS>(a.p, Shape<H>::wire_bytes(n), net, a.blocks_per_peer);
  if (b >= pl.blocks) return;
  const HookSend<H> m{{base_ctx<H>(a, peer, rows, true), first * a.row_len, n}};
  const P2PSide s{0, pl.wire, counter(a, 0, peer), counter(a, 2, peer), pl.chunk, peer,
                  pl.blocks, pl.ll, 0};  // receivers never pull (docs/PERFORMANCE.md)
  if (pl.ll) {
    p2p::ll_send(Block{}, a.p, s, m, b, false);
  } else {
    bulk_channel<THREADS>(b, pl.blocks, [&](const auto& g, dc_u32 c, dc_u32 n) {
      p2p::bulk_send(g, a.p, s, m, c, n);
    });
  }
}

// The receiving role checks the sender's descriptor (devcomm/agree.cuh) before it writes: an
// all-to-all-v its operation before the count exchange (so that a peer in another collective
// is named at once, not after the exchange's timeout; its sizes follow from the counts), the
// other modes operation and wire size in the movers. Its blocks end the call together.
template <class H, int THREADS, bool MIXED, bool NET>
__device__ void recv_role(const CollLaunch& a, int peer, dc_u32 b, dc_u64 seq) {
  if (peer_rows_skip(a, 1, peer)) return;
  if (NET && ((a.net_links >> peer) & 1u)) {
    if (b == 0) net_recv_role<H, THREADS>(a, peer, seq);
    return;
  }
  const dc_u64 call = p2p::agree_recv_begin(a.p, peer, b == 0 && threadIdx.x == 0);
  const dc_u32 op = nvl_op(a);
  if (a.mode == kModeDeviceCounts) {
    __shared__ int agreed;
    if (threadIdx.x == 0) {
      p2p::AgreeRecv ag = p2p::agree_recv(a.p, peer, call, kKindCollective, coll_payload(op, 0));
      ag.mask = kCollOpMask;
      agreed = p2p::agree_recv_wait(a.p, ag);
    }
    __syncthreads();
    if (!agreed) return;
  }
  dc_u64 rows, first, total;
  bool overflow;
  if (!recv_range<THREADS>(a, peer, seq, rows, first, total, overflow)) return;
  if (b == 0 && threadIdx.x == 0) {
    if (a.recv_counts != 0) reinterpret_cast<dc_u64*>(a.recv_counts)[peer] = rows;
    if (a.recv_offsets != 0) reinterpret_cast<dc_u64*>(a.recv_offsets)[peer] = first;
  }
  const dc_u64 n = rows * a.row_len;
  const bool net = MIXED && ((a.net_peers >> peer) & 1u);
  const Plan pl = plan_for<THREADS>(a.p, Shape<H>::wire_bytes(n), net, a.blocks_per_peer);
  const dc_u32 nblocks = pl.blocks > 0 ? pl.blocks : 1;  // block 0 checks even an empty chunk
  // The blocks that end the call: those that work, or for all-to-all-v every block of the
  // role, since each read the call number for the check above (a block that read it after the
  // last one out advanced it would wait for the next call's descriptor).
  const dc_u32 counted = a.mode == kModeDeviceCounts ? a.blocks_per_peer : nblocks;
  if (b >= counted) return;
  const p2p::AgreeRecv ag =
      a.mode == kModeDeviceCounts
          ? p2p::agree_none()
          : p2p::agree_recv(a.p, peer, call, kKindCollective,
                            coll_agree_payload(a, Shape<H>::wire_bytes(n)));
  const HookRecv<H> m{{base_ctx<H>(a, peer, rows, false), first * a.row_len, n}, overflow};
  const P2PSide r{0, pl.wire, counter(a, 1, peer), counter(a, 3, peer), pl.chunk, peer,
                  pl.blocks, pl.ll, 0};
  if (b >= nblocks) {
    // An all-to-all-v block beyond the plan: nothing to move, only the end of the call.
  } else if (pl.blocks == 0) {
    if (threadIdx.x == 0 && !ag.agreed) {
      p2p::AgreeRecv check = ag;
      p2p::agree_recv_wait(a.p, check);
    }
  } else if (pl.ll) {
    p2p::ll_recv(Block{}, a.p, r, m, b, ag, false);
  } else {
    bulk_channel<THREADS>(b, pl.blocks, [&](const auto& g, dc_u32 c, dc_u32 n) {
      p2p::bulk_recv(g, a.p, r, m, c, n, ag);
    });
  }
  __syncthreads();
  if (threadIdx.x == 0) p2p::agree_recv_done(a.p, peer, call, counted);
}

// This rank's own chunk: produce then consume, tile by tile, no wire.
template <class H, int THREADS>
__device__ void self_role(const CollLaunch& a, dc_u32 b, dc_u64 seq) {
  const int me = a.p.w.rank;
  dc_u64 rows, first, total, srows, sfirst;
  bool overflow;
  if (!recv_range<THREADS>(a, me, seq, rows, first, total, overflow)) return;
  // The overflowing receiver records the error once, from its own chunk's block 0.
  if (b == 0 && threadIdx.x == 0) {
    if (a.recv_counts != 0) reinterpret_cast<dc_u64*>(a.recv_counts)[me] = rows;
    if (a.recv_offsets != 0) reinterpret_cast<dc_u64*>(a.recv_offsets)[me] = first;
    if (overflow) record_count_error(a, -1, a.recv_capacity, total);
  }
  send_range(a, me, srows, sfirst, b == 0 && threadIdx.x == 0);
  if (overflow) return;
  const dc_u64 n = rows * a.row_len;
  const dc_u64 tiles = (n + Shape<H>::kElems - 1) / Shape<H>::kElems;
  const ChunkTiles<H> src{base_ctx<H>(a, me, rows, true), sfirst * a.row_len, n};
  const ChunkTiles<H> dst{base_ctx<H>(a, me, rows, false), first * a.row_len, n};
  // K tiles in flight per thread: their loads are all issued before the first store.
  constexpr int K = kSelfIlp;
  const dc_u64 stride = (dc_u64)a.self_blocks * THREADS;
  dc_u64 t = (dc_u64)b * THREADS + threadIdx.x;
  for (; t + (K - 1) * stride < tiles; t += K * stride) {
    Tile<typename H::Wire> v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = H::produce(src.at(t + k * stride));
#pragma unroll
    for (int k = 0; k < K; ++k) H::consume(dst.at(t + k * stride), v[k]);
  }
  for (; t < tiles; t += stride) H::consume(dst.at(t), H::produce(src.at(t)));
}

// The collective kernel (see the top of this file). Instantiated by the JIT as
// devcomm::coll::coll_kernel<Hooks, THREADS, MIXED, NET>; MIXED = false when every peer has the
// same tuning class, which compiles the per-peer class lookups away; NET = true when some peer
// is reached over the network (its roles take the network path; NVLink-only jobs compile it
// away).
template <class H, int THREADS, bool MIXED, bool NET>
__device__ __forceinline__ void coll_body(const CollLaunch& a, dc_u64 seq) {
  const int W = a.p.w.world_size, me = a.p.w.rank;
  const dc_u32 B = a.blocks_per_peer, roles = 2 * (dc_u32)(W - 1);
  dc_u32 role, b;
  const dc_u32 in_turn = a.self_blocks >= B ? roles + 1 : roles;
  if (blockIdx.x >= in_turn * B) {  // the own chunk's blocks beyond the ones in turn
    role = roles;
    b = blockIdx.x - roles * B;
  } else if (in_turn > roles) {  // every role in turn, own chunk too
    role = blockIdx.x % in_turn;
    b = blockIdx.x / in_turn;
  } else {
    role = blockIdx.x % roles;
    b = blockIdx.x / roles;
  }
  // Traced: one phase per block, its role's (the own chunk's copy is a stage).
  const int peer = role == roles ? me
                   : role < (dc_u32)(W - 1) ? (me + 1 + (int)role) % W
                                            : (me + W - 1 - ((int)role - (W - 1))) % W;
  const unsigned short phase = role == roles ? kPhaseStage
                               : role < (dc_u32)(W - 1) ? kPhaseSend
                                                        : kPhaseRecv;
  DC_TRACE_KERNEL_BEGIN();
  DC_TRACE_PHASE_BEGIN(phase, peer);
  if (role == roles) {
    self_role<H, THREADS>(a, b, seq);
  } else if (role < (dc_u32)(W - 1)) {
    send_role<H, THREADS, MIXED, NET>(a, peer, b, seq);
  } else {
    recv_role<H, THREADS, MIXED, NET>(a, peer, b, seq);
  }
  DC_TRACE_PHASE_END(phase, peer, 0);
  DC_TRACE_KERNEL_END(0);
  (void)phase;
}

template <class H, int THREADS, bool MIXED, bool NET = false>
__global__ void __launch_bounds__(THREADS, 1) coll_kernel(CollLaunch a) {
  enter_after_previous_kernel();
  if (a.mode != kModeDeviceCounts) {  // counts known on the host: no exchange, no call numbers
    coll_body<H, THREADS, MIXED, NET>(a, 0);
    return;
  }
  dc_u64* state = reinterpret_cast<dc_u64*>(a.state);
  // Changed only by the last block of the previous launch: ordered by the kernel boundary.
  const dc_u64 seq = state[0] + 1;
  coll_body<H, THREADS, MIXED, NET>(a, seq);
  // Every block arrives; the last one advances the call number.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long prev =
        atomicAdd(reinterpret_cast<unsigned long long*>(&state[1]), 1ull);
    if (prev == gridDim.x - 1) {
      state[1] = 0;
      state[0] = seq;
    }
  }
}

}  // namespace coll
}  // namespace devcomm
