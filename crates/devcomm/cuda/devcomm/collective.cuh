// devcomm/collective.cuh: the device functions of the all-to-all and all-to-all-v kernel
// (kernels/collective.cu): its launch argument (CollLaunch, the ABI with the Rust twin
// src/abi/coll_launch.rs), the per-peer plans, and the movers that fuse the user's hooks into
// the copy steps of the send/recv protocol (devcomm/transfer.cuh): chunk tiles, the count
// exchange's slots and ranges. The schedule is docs/COLLECTIVES.md; the host side is
// src/collective/; the roles and the kernel are in kernels/collective.cu.
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

}  // namespace coll
#endif  // __CUDACC__

}  // namespace devcomm
