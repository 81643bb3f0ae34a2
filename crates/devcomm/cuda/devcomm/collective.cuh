// devcomm/collective.cuh: all-to-all and all-to-all-v as one fused peer x block kernel over the
// send/recv protocol (devcomm/transfer.cuh), with the user's hooks fused into the copy steps.
// The schedule is docs/COLLECTIVES.md; the host side is src/collective/.
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
#pragma once

#include "devcomm/transfer.cuh"
#include "devcomm/hooks.cuh"
#include "devcomm/net_p2p.cuh"

namespace devcomm {

// Launch arguments of the collective kernel. Rust twin: src/abi/coll_launch.rs.
struct CollLaunch {
  P2PLaunch p;             // @0   the p2p window and staging constants (p.send/p.recv unused)
  dc_u64 in;               // @240 send buffer
  dc_u64 out;              // @248 receive buffer
  dc_u64 send_counts;      // @256 device u64[W]: rows for each peer; 0: every peer gets `rows`
  dc_u64 send_offsets;     // @264 device u64[W]: first row for each peer; 0: packed in rank order
  dc_u64 recv_counts;      // @272 device u64[W] written: rows received from each peer (or 0)
  dc_u64 recv_offsets;     // @280 device u64[W] written: first row of each peer's data (or 0)
  dc_u64 rows;             // @288 kModeUniform: rows per peer
  dc_u64 row_len;          // @296 elements per row (Ctx::cols)
  dc_u64 send_capacity;    // @304 rows in the send buffer
  dc_u64 recv_capacity;    // @312 rows the receive buffer holds
  dc_u64 user;             // @320 user arguments for the hooks
  dc_u64 counters;         // @328 the p2p counters (bulk steps, low-latency calls)
  dc_u64 state;            // @336 device u64[4]: variable calls done, arrivals
  dc_u32 blocks_per_peer;  // @344 B
  dc_u32 net_peers;        // @348 bit q: peer q is tuned as a network peer
  dc_u32 count_slot0;      // @352 first user slot of the count exchange
  dc_u32 mode;             // @356 kModeUniform, kModePeerRows or kModeDeviceCounts
  dc_u64 peer_rows[2][32]; // @360 kModePeerRows: rows sent to / received from each peer
  dc_u32 self_blocks;      // @872 S: blocks of the own chunk's role
  dc_u32 net_links;        // @876 bit q: peer q is reached over the network (NET kernels only)
  NetP2PLaunch net;        // @880 the network staging and queues (NET kernels; roles unused)
  dc_u32 op;               // @1000 what the call is, as both ends compare it: mode + 1, or a
                           //       reduction's step with network peers (reduce/net_plan.rs);
                           //       NVLink agreements carry its low 4 bits, network headers all
  dc_u32 op_pad;           // @1004
};

enum CollMode : dc_u32 { kModeUniform = 0, kModePeerRows = 1, kModeDeviceCounts = 2 };

// The operation an NVLink agreement carries: the low 4 bits of `op` (its field's width).
DC_HOST_DEVICE inline dc_u32 nvl_op(const CollLaunch& a) { return a.op & 15u; }

// The NVLink agreement's payload of a call moving `wire` bytes with a peer: the operation over
// the wire bytes. A reduction's step (op >= 4, reduce/net_plan.rs) also carries the element type
// + 1 and the hook bit of `op` (bits 8-12) in bits 32-35 above the low 32 bits of the wire bytes,
// so that an f32 and an i32 reduction of one size are told apart between NVLink peers too.
DC_HOST_DEVICE inline dc_u64 coll_agree_payload(const CollLaunch& a, dc_u64 wire) {
  const dc_u32 op = nvl_op(a);
  if (op < 4) return coll_payload(op, wire);
  const dc_u64 tag = ((a.op >> 8) & 7u) | (((a.op >> 12) & 1u) << 3);
  return coll_payload(op, (tag << 32) | (wire & 0xffffffffull));
}

static_assert(sizeof(CollLaunch) == 1008, "CollLaunch size");
static_assert(DC_OFFSETOF(CollLaunch, op) == 1000, "CollLaunch.op");
static_assert(DC_OFFSETOF(CollLaunch, net) == 880, "CollLaunch.net");
static_assert(DC_OFFSETOF(CollLaunch, self_blocks) == 872, "CollLaunch.self_blocks");
static_assert(DC_OFFSETOF(CollLaunch, peer_rows) == 360, "CollLaunch.peer_rows");
static_assert(DC_OFFSETOF(CollLaunch, in) == 240, "CollLaunch.in");
static_assert(DC_OFFSETOF(CollLaunch, state) == 336, "CollLaunch.state");
static_assert(DC_OFFSETOF(CollLaunch, blocks_per_peer) == 344, "CollLaunch.blocks_per_peer");
static_assert(DC_OFFSETOF(CollLaunch, count_slot0) == 352, "CollLaunch.count_slot0");

#if defined(__CUDACC__)
namespace coll {

// Tuning constants of the plans and movers (docs/COLLECTIVES.md, "Per-peer tuning"; the
// alternatives tried are in docs/PERFORMANCE.md, "Constants tried and left at their
// defaults"). Both ends derive the same plan from them.
constexpr dc_u64 kLlMax = 128ull << 10;     // NVLink peers: LL lines up to this wire size
                                            // (src/collective/shape.rs, LL_MAX_BYTES)
constexpr dc_u64 kLl128Max = 2ull << 20;    // NVLink peers: LL128 lines up to this wire size
constexpr dc_u64 kLl128Block = 8ull << 10;  // LL128: one block per this many wire bytes
constexpr dc_u64 kBulkBlock = 64ull << 10;  // bulk: one block per this many wire bytes
constexpr dc_u32 kBulkMaxBlocks = 32;       // bulk: at most this many blocks per peer
constexpr dc_u64 kChunkBig = 32ull << 10;   // bulk chunk once each channel has 64 KiB or more
constexpr dc_u64 kChunkSmall = 16ull << 10; // bulk chunk below that
constexpr int kMoveIlp = 4;                 // tiles in flight per thread in the bulk movers
constexpr int kSelfIlp = 4;                 // tiles in flight per thread in the own chunk's copy

// How one (peer, direction) moves: both ends compute it from the same wire size.
struct Plan {
  dc_u64 wire;   // wire bytes (whole tiles)
  dc_u64 chunk;  // bulk bytes per pipeline step
  dc_u32 blocks; // blocks of the role that work (0: nothing to move)
  dc_u32 ll;     // P2PSide::low_latency: 0 staged, 1 LL lines, 2 LL128 lines
};

// The tuning table (docs/COLLECTIVES.md, "Per-peer tuning"). NVLink peers: LL lines up to
// 128 KiB, one block per 8 KiB of payload; LL128 lines up to 2 MiB, one block per 8 KiB; bulk
// with one block per 64 KiB, up to B blocks, 32 KiB chunks once each channel has 64 KiB.
// Network-like peers: LL up to 16 KiB on one block, no LL128 (it needs NVLink's 128-byte
// stores); bulk on at most 2 blocks with the largest chunk the slots hold.
template <int THREADS>
__device__ __forceinline__ Plan plan_for(const P2PLaunch& p, dc_u64 wire, bool net, dc_u32 B) {
  Plan pl{wire, 0, 0, 0};
  if (wire == 0) return pl;
  const dc_u64 ll_cap = (p.ll_parity_bytes - 16ull * p.max_blocks) / 2;
  const dc_u64 ll_max = net ? (16ull << 10) : kLlMax;
  const dc_u64 ll128_cap = (p2p_ll128_parity_bytes(p) / 128 - p.max_blocks) * 112;
  const dc_u64 ll128_max = net ? 0 : kLl128Max;
  const dc_u32 most = B < p.max_blocks ? B : p.max_blocks;
  if (wire <= (ll_max < ll_cap ? ll_max : ll_cap)) {
    const dc_u64 per = (dc_u64)THREADS * 16;
    dc_u64 b = net ? 1 : (wire + per - 1) / per;
    pl.blocks = (dc_u32)(b < most ? b : most);
    pl.ll = 1;
    return pl;
  }
  if (wire <= (ll128_max < ll128_cap ? ll128_max : ll128_cap)) {
    const dc_u64 b = (wire + kLl128Block - 1) / kLl128Block;
    pl.blocks = (dc_u32)(b < most ? b : most);
    pl.ll = 2;
    return pl;
  }
  const dc_u32 bulk_most = most < kBulkMaxBlocks ? most : kBulkMaxBlocks;
  const dc_u32 cap = net ? (most < 2 ? most : 2) : bulk_most;
  dc_u64 b = (wire + kBulkBlock - 1) / kBulkBlock;
  pl.blocks = (dc_u32)(b < cap ? b : cap);
  const dc_u64 channels = (dc_u64)pl.blocks * (THREADS / 32);  // a warp per channel
  dc_u64 chunk = net ? p.slot_stride : (wire / channels >= (64ull << 10) ? kChunkBig : kChunkSmall);
  pl.chunk = chunk < p.slot_stride ? chunk : p.slot_stride;
  return pl;
}

template <class H>
struct Shape {
  using Wire = typename H::Wire;
  static constexpr dc_u64 kElems = 16 / sizeof(Wire);
  static_assert(16 % sizeof(Wire) == 0, "sizeof(Wire) must divide 16");
  static __device__ __forceinline__ dc_u64 wire_bytes(dc_u64 elems) {
    return (elems + kElems - 1) / kElems * 16;
  }
  static __device__ __forceinline__ dc_u32 valid(dc_u64 pos, dc_u64 n) {
    const dc_u64 rem = n - pos;
    return rem >= kElems ? (dc_u32)((1ull << kElems) - 1) : (dc_u32)((1ull << rem) - 1);
  }
};

// Bytes per low-latency unit of hooks H (LL lines carry 8 payload bytes, LL128 lines 14 words of
// 16-byte units or 15 of 8-byte ones). Hooks see whole 16-byte tiles; the copy hooks of elements
// of at most 8 bytes need no hook call, so their movers copy 8-byte
// units themselves and LL128 lines carry 120 payload bytes instead of 112.
template <class H>
struct LlUnit {
  static constexpr dc_u64 kBytes = 16;
};
template <class T>
struct LlUnit<CopyHooks<T>> {
  static constexpr dc_u64 kBytes = sizeof(T) <= 8 ? 8 : 16;
};

// Elements of T (sizeof(T) <= 8) in one 8-byte unit.
template <class T>
constexpr dc_u32 kUnit8Elems = (dc_u32)(8 / sizeof(T));

// The `count` (<= 8 / sizeof(T)) elements of T at p as one 8-byte unit (zero past them): one
// load when the unit is whole and aligned, element by element otherwise.
template <class T>
__device__ __forceinline__ dc_u64 load_unit8(const T* p, dc_u32 count) {
  if (count == kUnit8Elems<T> && (reinterpret_cast<dc_u64>(p) & 7) == 0) {
    return *reinterpret_cast<const dc_u64*>(p);
  }
  union {
    T e[kUnit8Elems<T>];
    dc_u64 u;
  } x;
  x.u = 0;
#pragma unroll
  for (dc_u32 k = 0; k < kUnit8Elems<T>; ++k) {
    if (k < count) x.e[k] = p[k];
  }
  return x.u;
}

// The inverse: writes the unit's first `count` elements to p.
template <class T>
__device__ __forceinline__ void store_unit8(T* p, dc_u32 count, dc_u64 v) {
  if (count == kUnit8Elems<T> && (reinterpret_cast<dc_u64>(p) & 7) == 0) {
    *reinterpret_cast<dc_u64*>(p) = v;
    return;
  }
  union {
    T e[kUnit8Elems<T>];
    dc_u64 u;
  } x;
  x.u = v;
#pragma unroll
  for (dc_u32 k = 0; k < kUnit8Elems<T>; ++k) {
    if (k < count) p[k] = x.e[k];
  }
}

// One chunk seen tile by tile: the Ctx of tile k.
template <class H>
struct ChunkTiles {
  Ctx base;    // in or out, user, rows, cols, peer, rank, world_size
  dc_u64 e0;   // the chunk's first element in the buffer
  dc_u64 n;    // the chunk's elements

  __device__ __forceinline__ Ctx at(dc_u64 tile) const {
    Ctx c = base;
    c.pos = tile * Shape<H>::kElems;
    c.index = e0 + c.pos;
    c.valid = Shape<H>::valid(c.pos, n);
    return c;
  }
  // The 8-byte unit at wire byte `off` (LlUnit): its first element in the chunk and how many
  // of its elements exist (none in the padding of the chunk's last tile).
  __device__ __forceinline__ dc_u32 unit8(dc_u64 off, dc_u64& pos) const {
    using T = typename H::Wire;
    pos = off / sizeof(T);
    return pos >= n ? 0u : (n - pos < kUnit8Elems<T> ? (dc_u32)(n - pos) : kUnit8Elems<T>);
  }
};

// Sending mover: tiles of one chunk through H::produce.
template <class H>
struct HookSend : ChunkTiles<H> {
  using W = typename H::Wire;
  using ChunkTiles<H>::at;
  static constexpr dc_u64 kUnit = LlUnit<H>::kBytes;
  template <class G>
  __device__ __forceinline__ void chunk(const G& g, char* slot, dc_u64 off, dc_u64 bytes) const {
    constexpr int K = kMoveIlp;
    const dc_u64 t0 = off / 16, nt = bytes / 16, gs = g.size();
    uint4* dst = reinterpret_cast<uint4*>(slot);
    dc_u64 j = g.thread_rank();
    for (; j + (K - 1) * gs < nt; j += K * gs) {  // K tiles in flight per thread
      Tile<W> t[K];
#pragma unroll
      for (int k = 0; k < K; ++k) t[k] = H::produce(at(t0 + j + k * gs));
#pragma unroll
      for (int k = 0; k < K; ++k) dst[j + k * gs] = *reinterpret_cast<const uint4*>(&t[k]);
    }
    for (; j < nt; j += gs) {
      const Tile<W> t = H::produce(at(t0 + j));
      dst[j] = *reinterpret_cast<const uint4*>(&t);
    }
  }
  __device__ __forceinline__ void unit(dc_u64 off, dc_u64, dc_u64 (&v)[kUnit / 8]) const {
    if constexpr (kUnit == 8) {  // copy hooks: the input's bytes
      dc_u64 pos;
      const dc_u32 count = this->unit8(off, pos);
      v[0] = load_unit8(static_cast<const W*>(this->base.in) + this->e0 + pos, count);
    } else {
      const Tile<W> t = H::produce(at(off / 16));
      const uint4 u = *reinterpret_cast<const uint4*>(&t);
      v[0] = ((dc_u64)u.y << 32) | u.x;
      v[1] = ((dc_u64)u.w << 32) | u.z;
    }
  }
};

// Receiving mover: tiles of one chunk through H::consume; `discard` drains without writing.
template <class H>
struct HookRecv : ChunkTiles<H> {
  using W = typename H::Wire;
  using ChunkTiles<H>::at;
  static constexpr dc_u64 kUnit = LlUnit<H>::kBytes;
  bool discard;
  template <class G>
  __device__ __forceinline__ void chunk(const G& g, const char* slot, dc_u64 off, dc_u64 bytes,
                                        bool /*remote*/) const {
    if (discard) return;
    constexpr int K = kMoveIlp;
    const dc_u64 t0 = off / 16, nt = bytes / 16, gs = g.size();
    const uint4* src = reinterpret_cast<const uint4*>(slot);
    dc_u64 j = g.thread_rank();
    for (; j + (K - 1) * gs < nt; j += K * gs) {  // K tiles in flight per thread
      uint4 u[K];
#pragma unroll
      for (int k = 0; k < K; ++k) u[k] = src[j + k * gs];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        H::consume(at(t0 + j + k * gs), *reinterpret_cast<const Tile<W>*>(&u[k]));
      }
    }
    for (; j < nt; j += gs) {
      const uint4 u = src[j];
      H::consume(at(t0 + j), *reinterpret_cast<const Tile<W>*>(&u));
    }
  }
  __device__ __forceinline__ void unit(dc_u64 off, dc_u64, const dc_u64 (&v)[kUnit / 8]) const {
    if (discard) return;
    if constexpr (kUnit == 8) {  // copy hooks: the wire's bytes
      dc_u64 pos;
      const dc_u32 count = this->unit8(off, pos);
      store_unit8(static_cast<W*>(this->base.out) + this->e0 + pos, count, v[0]);
    } else {
      uint4 u;
      u.x = (dc_u32)v[0];
      u.y = (dc_u32)(v[0] >> 32);
      u.z = (dc_u32)v[1];
      u.w = (dc_u32)(v[1] >> 32);
      H::consume(at(off / 16), *reinterpret_cast<const Tile<W>*>(&u));
    }
  }
};

// Counter arrays of the p2p namespace (src/p2p/mod.rs, Counter).
__device__ __forceinline__ dc_u64 counter(const CollLaunch& a, dc_u32 kind, int peer) {
  const dc_u64 W = (dc_u64)a.p.w.world_size, ch = a.p.max_channels, bl = a.p.max_blocks;
  dc_u64 index;
  switch (kind) {
    case 0: index = peer * ch; break;                           // bulk send steps
    case 1: index = (W + peer) * ch; break;                     // bulk recv steps
    case 2: index = 2 * W * ch + peer * bl; break;              // low-latency send calls
    default: index = 2 * W * ch + (W + peer) * bl; break;       // low-latency recv calls
  }
  return a.counters + index * 8;
}

__device__ __forceinline__ dc_u64 count_val_slot(const CollLaunch& a, int sender, dc_u64 seq) {
  return a.count_slot0 + (dc_u64)sender * 4 + (seq & 1) * 2;
}

// Records a bad count (no wait involved): `expected` is the capacity in rows, `seen` what the
// counts need. No abort is raised: the kernel still runs the protocol to the end (a receiver
// drains and discards), so the communicator stays usable. `op` is written last: the host takes
// a record with flag set, abort clear and op = kOpCountOverflow as complete.
__device__ inline void record_count_error(const CollLaunch& a, int peer, dc_u64 capacity,
                                          dc_u64 needed) {
  record_soft_error(error_state(a.p.w), kOpCountOverflow, a.p.w.rank, peer, 0, capacity, needed);
}

// Rows this rank sends to `peer` and the first of them; a range outside the send buffer is an
// error and sends nothing. Every role computes it the same way.
__device__ __forceinline__ void send_range(const CollLaunch& a, int peer, dc_u64& rows,
                                           dc_u64& first, bool report) {
  if (a.mode == kModeUniform) {
    rows = a.rows;
    first = (dc_u64)peer * a.rows;
    return;
  }
  if (a.mode == kModePeerRows) {
    rows = a.peer_rows[0][peer];
    first = 0;
    for (int q = 0; q < peer; ++q) first += a.peer_rows[0][q];
    return;
  }
  const dc_u64* counts = reinterpret_cast<const dc_u64*>(a.send_counts);
  rows = counts[peer];
  if (a.send_offsets != 0) {
    first = reinterpret_cast<const dc_u64*>(a.send_offsets)[peer];
  } else {
    first = 0;
    for (int q = 0; q < peer; ++q) first += counts[q];
  }
  if (first > a.send_capacity || rows > a.send_capacity - first) {
    if (report) record_count_error(a, peer, a.send_capacity, first + rows);
    rows = 0;
    first = 0;
  }
}

// Receive side: the rows from every peer (count exchange), this peer's first row, and whether
// everything fits. Called by all THREADS threads of a block; false if a wait failed.
template <int THREADS>
__device__ bool recv_range(const CollLaunch& a, int peer, dc_u64 seq, dc_u64& rows,
                           dc_u64& first, dc_u64& total, bool& overflow) {
  overflow = false;
  if (a.mode == kModeUniform) {
    rows = a.rows;
    first = (dc_u64)peer * a.rows;
    total = (dc_u64)a.p.w.world_size * a.rows;
    return true;
  }
  if (a.mode == kModePeerRows) {  // the host checked the total against the capacity
    rows = a.peer_rows[1][peer];
    first = 0;
    total = 0;
    for (int q = 0; q < a.p.w.world_size; ++q) {
      if (q == peer) first = total;
      total += a.peer_rows[1][q];
    }
    return true;
  }
  __shared__ dc_u64 counts[32];
  __shared__ int failed;
  const int W = a.p.w.world_size, me = a.p.w.rank;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const int q = (int)threadIdx.x;
  if (q < W) {
    if (q == me) {
      dc_u64 r, f;
      send_range(a, me, r, f, false);
      counts[q] = r;
    } else {
      const dc_u64 vslot = count_val_slot(a, q, seq);
      const bool ok = wait_until(error_state(a.p.w), a.p.w.timeout_ns, me,
                                 own_user_slot(a.p.w, vslot + 1), seq, Cmp::Ge,
                                 WaitSite{kOpCountExchange, q, vslot + 1});
      if (ok) {
        counts[q] = ld_relaxed_sys(own_user_slot(a.p.w, vslot));
      } else {
        failed = 1;
      }
    }
  }
  __syncthreads();
  if (failed) return false;
  total = 0;
  first = 0;
  for (int k = 0; k < W; ++k) {
    if (k == peer) first = total;
    total += counts[k];
  }
  rows = counts[peer];
  overflow = total > a.recv_capacity;
  return true;
}

// Hands this rank's count for `peer` to it: value, then the sequence number with release.
__device__ __forceinline__ void publish_count(const CollLaunch& a, int peer, dc_u64 rows,
                                              dc_u64 seq) {
  const dc_u64 vslot = count_val_slot(a, a.p.w.rank, seq);
  dc_u64* v = peer_user_slot(a.p.w, peer, vslot);
  *reinterpret_cast<volatile dc_u64*>(v) = rows;
  st_release_sys(peer_user_slot(a.p.w, peer, vslot + 1), seq);
}

template <class H>
__device__ __forceinline__ Ctx base_ctx(const CollLaunch& a, int peer, dc_u64 rows, bool send) {
  Ctx c;
  c.in = send ? reinterpret_cast<const void*>(a.in) : nullptr;
  c.out = send ? nullptr : reinterpret_cast<void*>(a.out);
  c.user = reinterpret_cast<const void*>(a.user);
  c.index = 0;
  c.pos = 0;
  c.rows = rows;
  c.cols = a.row_len;
  c.peer = peer;
  c.rank = a.p.w.rank;
  c.world_size = a.p.w.world_size;
  c.valid = 0;
  return c;
}

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
#endif  // __CUDACC__

}  // namespace devcomm
