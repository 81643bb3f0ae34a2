// Mixture-of-experts dispatch and combine around two all-to-all-v calls (docs/MOE.md). Rank r
// holds experts [r * local_experts, (r + 1) * local_experts). The JIT appends the
// instantiations (element type) after this text. Every kernel takes one MoeArgs
// (src/moe/args.rs is its twin).
//
//   layout        one block: which ranks each token goes to (once per rank, however many of its
//                 experts live there), its slot among the tokens sent to that rank (token
//                 order), the rows per rank and their offsets (rank order)
//   pack          a warp per 2 KiB part of a token's row: the part into the slot of each rank
//                 it goes to (read once); part 0 also writes the token's expert ids local to
//                 that rank (0xFFFF: another rank's or dropped) and its k weights after the row
//   pack_fp8      the same, a warp per token, with the row quantised to e4m3 (scale amax / 448 per row or per
//                 128 elements, after the codes)
//   [all-to-all-v of the packed rows]
//   positions     a block per local expert: each received row's place in that expert's group
//                 (rows in received order: source rank, then the source's token order)
//   unpack        a warp per part of a received row (read once): its copy per local expert
//                 into the expert-major output (groups padded to `align` rows); part 0 writes
//                 the weight
//   unpack_dequant  the same for FP8 rows, each element e4m3 x scale in f32, rounded to T
//   unpack_fp8    the same for FP8 rows kept as FP8: the codes into out_x, the scales into
//                 out_scales
//   combine_pack  a warp per part of a received row: sum of weight x expert output over its
//                 local experts in ascending expert order, in f32, rounded once to T
//   [all-to-all-v back, in the same row order]
//   combine_final a warp per part of a token: sum over the ranks it went to, in rank order, in f32
//
// The direct path (between NVLink peers; src/comm/moe.rs chooses it) moves the same rows
// without the all-to-all-v: pack writes each row straight into the receiving rank's area at
// [its rank][its token] and signals; positions waits for every rank's signals; combine_pack
// writes each sum straight into the sending rank's area and signals; combine_final waits for
// them. Every position, copy and sum is the one of the all-to-all-v path, in the same order,
// so both give the same bits (see "The direct path" below).
//
// Additions are explicit (__fmul_rn, __fadd_rn: no contraction into FMA), so a host reference
// in the same order gives the same bits, and a token's result depends only on its own routing
// and its experts' outputs, never on the other tokens of the batch. Quantising and
// dequantising are per-element functions of the row (and its block's amax), with correctly
// rounded operations only: src/moe/fp8.rs is their host twin.
#include "devcomm/reduce.cuh"
#include "devcomm/fp8.cuh"

namespace devcomm {
namespace moe {

using devcomm::red::Num;

struct MoeArgs {
  dc_u64 x;             // [tokens, hidden] T
  dc_u64 topk_idx;      // [tokens, k] i64 expert ids (-1: none)
  dc_u64 topk_w;        // [tokens, k] f32
  dc_u64 slot;          // i32 [tokens, world]: slot among the rows sent to each rank, or -1
  dc_u64 send_counts;   // u64 [world]
  dc_u64 send_offsets;  // u64 [world]
  dc_u64 send;          // packed rows to send (row_bytes each)
  dc_u64 recv;          // received rows (row_bytes each)
  dc_u64 recv_counts;   // u64 [world]
  dc_u64 pos;           // u32 [recv_rows, k]: place in the expert group, then (unpack) the output row
  dc_u64 expert_count;  // i64 [local_experts]: rows of each local expert (unpadded)
  dc_u64 out_x;         // [out_rows, hidden] T, expert-major
  dc_u64 out_w;         // f32 [out_rows]: the weight of each output row
  dc_u64 out_scales;    // f32 [out_rows, scales]: each FP8 output row's scales (unpack_fp8 only)
  dc_u64 y;             // [out_rows, hidden] T: the experts' outputs, expert-major
  dc_u64 cback;         // [recv_rows, hidden] T: each received row's weighted sum
  dc_u64 back;          // [send_rows, hidden] T: the sums that came back
  dc_u64 out;           // [tokens, hidden] T: the combined result
  dc_u64 status;        // u64 [4]: bad ids, duplicate ids, rows the output needed beyond out_rows, 0
  dc_u64 tokens;
  dc_u64 out_rows;      // capacity of out_x / y in rows
  dc_u32 hidden;
  dc_u32 k;
  dc_u32 world;
  dc_u32 rank;
  dc_u32 local_experts;
  dc_u32 experts;
  dc_u32 align;
  dc_u32 row_bytes;     // bytes per packed row: hidden elements, ids, weights, padding to 16
  dc_u32 ids_off;       // byte offset of the u16 ids in a packed row
  dc_u32 w_off;         // byte offset of the f32 weights in a packed row
  dc_u32 scales_off;    // byte offset of the f32 scales in a packed FP8 row (after the codes)
  dc_u32 scales;        // scales per FP8 row (0: rows travel as T)
  dc_u32 scale_block;   // elements per scale: hidden (per row) or 128
  dc_u32 out_row_bytes; // bytes of an out_x row: hidden x sizeof(T), or hidden as FP8
  dc_u32 direct;        // 1: the direct path (the fields below); 0: around the all-to-all-v
  dc_u32 pad0;
  dc_u32 pad1;
  dc_u32 pad2;
  dc_u64 cap;           // max_tokens: token slots per rank in an area's rows
  dc_u64 sym;           // this rank's direct area (symmetric memory)
  dc_u64 peers;         // u64 [world]: every rank's direct area as mapped here
  dc_u64 ctr;           // u64 [7]: dispatches done, combines done, four arrival counters, failed
  dc_u64 err;           // DeviceErrorState* (host-mapped)
  dc_u64 mirror;        // u64 in device memory: non-zero once a kernel of the communicator failed
  dc_u64 timeout_ns;    // bound of every wait
  dc_u64 tok_off;       // byte offsets in an area: the tokens words, the rows, the sums
  dc_u64 recv_off;
  dc_u64 back_off;
};

// Threads of the warp-per-part kernels' blocks (the host's THREADS).
enum : int { kThreads = 256 };
enum : dc_u32 { kNone = 0xFFFFu, kBadIds = 0, kDupIds = 1, kOverflow = 2 };
enum : int { kLayoutThreads = 1024, kLayoutWarps = kLayoutThreads / 32 };

// Entry j of token t: its expert id if valid and not a repeat of an earlier entry, else -1
// (counted in status when invalid or repeated, with `count`).
__device__ __forceinline__ long long entry(const MoeArgs& a, dc_u64 t, dc_u32 j, bool count) {
  const long long* idx = reinterpret_cast<const long long*>(a.topk_idx) + t * a.k;
  const long long e = idx[j];
  if (e == -1) return -1;
  dc_u64* status = reinterpret_cast<dc_u64*>(a.status);
  if (e < -1 || e >= (long long)a.experts) {
    if (count) atomicAdd(status + kBadIds, 1ull);
    return -1;
  }
  for (dc_u32 i = 0; i < j; ++i) {
    if (idx[i] == e) {
      if (count) atomicAdd(status + kDupIds, 1ull);
      return -1;
    }
  }
  return e;
}

__device__ __forceinline__ dc_u32 lane_id() { return threadIdx.x & 31u; }

// Entry `lane` of token t as entry() gives it (-1 on lanes k and above), every lane of the warp
// calling: the k ids are loaded at once and a repeat is found by matching the lanes' ids,
// not by loading the earlier entries one after another (a chain of load latencies that
// dominated the pack kernel at decode batch sizes).
__device__ __forceinline__ long long warp_entry(const MoeArgs& a, dc_u64 t, bool count) {
  const dc_u32 lane = lane_id();
  const bool in = lane < a.k;
  const long long raw = in ? reinterpret_cast<const long long*>(a.topk_idx)[t * a.k + lane] : -1;
  // Lanes past k never match a valid id (their keys are negative).
  const long long key = in ? raw : -2 - (long long)lane;
  const unsigned same = __match_any_sync(0xFFFFFFFFu, (unsigned long long)key);
  if (!in || raw == -1) return -1;
  dc_u64* status = reinterpret_cast<dc_u64*>(a.status);
  if (raw < -1 || raw >= (long long)a.experts) {
    if (count) atomicAdd(status + kBadIds, 1ull);
    return -1;
  }
  if ((same & ((1u << lane) - 1u)) != 0) {
    if (count) atomicAdd(status + kDupIds, 1ull);
    return -1;
  }
  return raw;
}

// Elements per lane step: 16 bytes.
template <class T>
struct Vec {
  static constexpr int kN = 16 / (int)sizeof(T);
  union {
    uint4 u;
    T v[kN];
  };
};


// Counts `bit` over the threads of a block of kLayoutThreads, in thread order: returns how many
// threads before this one set it and adds the block's total to *run after every thread has
// read *run (every thread calls it; `warp_sum` is kLayoutWarps words of shared memory). The
// ranks are warp ballots, then a scan of the warps' counts by warp 0.
template <class C>
__device__ __forceinline__ C block_rank(bool bit, dc_u32* warp_sum, C* run) {
  const dc_u32 tid = threadIdx.x, warp = tid / 32, lane = lane_id();
  const dc_u32 ballot = __ballot_sync(0xFFFFFFFFu, bit);
  const dc_u32 before = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_sum[warp] = __popc(ballot);
  __syncthreads();
  if (warp == 0) {
    const dc_u32 v = lane < kLayoutWarps ? warp_sum[lane] : 0;
    dc_u32 incl = v;
    for (int d = 1; d < 32; d <<= 1) {
      const dc_u32 o = __shfl_up_sync(0xFFFFFFFFu, incl, d);
      if ((int)lane >= d) incl += o;
    }
    if (lane < kLayoutWarps) warp_sum[lane] = incl - v;
  }
  __syncthreads();
  const C rank = *run + warp_sum[warp] + before;
  __syncthreads();
  if (tid == kLayoutThreads - 1) *run = rank + (bit ? 1 : 0);
  __syncthreads();
  return rank;
}

// One block of kLayoutThreads.
extern "C" __global__ void __launch_bounds__(kLayoutThreads) moe_layout(MoeArgs a) {
  __shared__ dc_u32 warp_sum[kLayoutWarps];
  __shared__ dc_u64 run[64];
  const dc_u32 tid = threadIdx.x;
  for (dc_u32 r = tid; r < a.world; r += blockDim.x) run[r] = 0;
  __syncthreads();
  int* slot = reinterpret_cast<int*>(a.slot);
  for (dc_u64 base = 0; base < a.tokens; base += kLayoutThreads) {
    const dc_u64 t = base + tid;
    dc_u64 mask = 0;
    if (t < a.tokens) {
      for (dc_u32 j = 0; j < a.k; ++j) {
        const long long e = entry(a, t, j, true);
        if (e >= 0) mask |= 1ull << (e / a.local_experts);
      }
    }
    for (dc_u32 r = 0; r < a.world; ++r) {
      const bool bit = (mask >> r) & 1ull;
      const dc_u64 at = block_rank(bit, warp_sum, &run[r]);
      if (t < a.tokens) slot[t * a.world + r] = bit ? (int)at : -1;
    }
  }
  if (tid == 0) {
    dc_u64* counts = reinterpret_cast<dc_u64*>(a.send_counts);
    dc_u64* offsets = reinterpret_cast<dc_u64*>(a.send_offsets);
    dc_u64 at = 0;
    for (dc_u32 r = 0; r < a.world; ++r) {
      counts[r] = run[r];
      offsets[r] = at;
      at += run[r];
    }
  }
}

// Copies the 16-byte units [lo, hi) from src to each of dst[0..n) with the lanes of a warp:
// the source is read once, kUnroll 16-byte loads in flight per lane before the stores (a
// copy is bound by load latency otherwise).
enum : int { kUnroll = 4 };
__device__ __forceinline__ void warp_copy_to(char* const* dst, dc_u32 n, const char* src, dc_u32 lo, dc_u32 units) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  const dc_u32 step = 32 * kUnroll;
  for (dc_u32 base = lo; base < units; base += step) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const dc_u32 i = base + u * 32 + lane_id();
      if (i < units) v[u] = s[i];
    }
    for (dc_u32 d = 0; d < n; ++d) {
      uint4* out = reinterpret_cast<uint4*>(dst[d]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const dc_u32 i = base + u * 32 + lane_id();
        if (i < units) out[i] = v[u];
      }
    }
  }
}

__device__ __forceinline__ dc_u64 global_warp() { return ((dc_u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; }
__device__ __forceinline__ dc_u64 warp_count() { return ((dc_u64)gridDim.x * blockDim.x) / 32; }

// A row of T is worked on in parts of kPartUnits 16-byte units (2 KiB: one round of
// warp_copy_to), a warp per (row, part): a warp that walked a whole row would wait a load
// latency per part in turn, and few rows (decode batches) would leave most of the GPU idle.
// Row-wide work (the routing words, a weight) is done by part 0.
enum : dc_u32 { kPartUnits = 32 * kUnroll };

__device__ __forceinline__ dc_u32 parts_of(dc_u32 units) { return (units + kPartUnits - 1) / kPartUnits; }

// The units [lo, hi) of part `part` of a row of `units` units.
__device__ __forceinline__ dc_u32 part_end(dc_u32 part, dc_u32 units) {
  const dc_u32 hi = (part + 1) * kPartUnits;
  return hi < units ? hi : units;
}

// ---- The direct path ---------------------------------------------------------------------
// Each rank's direct area (symmetric memory, the same layout on every rank):
//   signals  u64 [2 x world] at 0: [src] the number of src's last dispatch whose rows are all
//            written here, [world + src] of its last combine whose sums are (the last block of
//            src's pack or combine_pack launch writes them)
//   tokens   u64 [2][world] at tok_off: the tokens of src's dispatch, by dispatch parity
//   rows     [2][world][cap] packed rows at recv_off: src's token t at [parity][src][t]; a
//            token's row is written only to the ranks it goes to, its ids and weights to every
//            rank (all 0xFFFF where it does not go), so a receiver tells the two apart
//   sums     [2][world][cap] rows of T at back_off: rank r's sum for this rank's token t at
//            [combine parity][r][t]
// Calls are numbered on the device: ctr[kDispatches] and ctr[kCombines] count the calls done,
// and the last block of a call's last kernel advances its count (so graph replays number their
// calls too). A launch's last block is the one that finds all the others arrived on its
// arrival counter; so launches size their grids to the work, rank by rank. A rank writes call
// n's rows only after its own call n - 1 received every rank's rows, which every rank sent
// after finishing everything queued before its call n - 1 (call n - 2's combines, which read
// its rows, included): so the parity's rows (and sums) are no longer read by anyone when they
// are overwritten, with no wait for it. ctr[kFailed] is set when a wait of this layer gives up
// (a timeout, or an abort raised by the host, which leaves the abort mirror as it is); every
// later direct kernel of the layer then does nothing and publishes nothing.
enum : dc_u32 {
  kDispatches = 0,
  kCombines = 1,
  kArriveDispatch = 2,
  kArriveCombine = 3,
  kArrivePack = 4,
  kArriveCombinePack = 5,
  kFailed = 6,
};

__device__ __forceinline__ dc_u64 calls_done(const MoeArgs& a, dc_u32 which) {
  return reinterpret_cast<const dc_u64*>(a.ctr)[which];
}

// Rank r's direct area as mapped here.
__device__ __forceinline__ char* area(const MoeArgs& a, dc_u32 r) {
  return reinterpret_cast<char*>(reinterpret_cast<const dc_u64*>(a.peers)[r]);
}

__device__ __forceinline__ dc_u64* tokens_words(const MoeArgs& a, char* at, dc_u64 n) {
  return reinterpret_cast<dc_u64*>(at + a.tok_off) + (n & 1u) * a.world;
}

__device__ __forceinline__ char* rows_of(const MoeArgs& a, char* at, dc_u64 n) {
  return at + a.recv_off + (n & 1u) * a.world * a.cap * a.row_bytes;
}

__device__ __forceinline__ char* sums_of(const MoeArgs& a, char* at, dc_u64 m, dc_u32 hidden_bytes) {
  return at + a.back_off + (m & 1u) * a.world * a.cap * hidden_bytes;
}

// Whether a kernel of the communicator has failed (the abort mirror), or a wait of this layer
// gave up (ctr[kFailed]): a direct kernel then does nothing, publishes nothing.
__device__ __forceinline__ bool failed_before(const MoeArgs& a) {
  if (reinterpret_cast<const volatile dc_u64*>(a.ctr)[kFailed] != 0) return true;
  return a.mirror != 0 && *reinterpret_cast<const volatile dc_u64*>(a.mirror) != 0;
}

// failed_before as thread 0 reads it, for the whole block (every thread calls; the block syncs).
__device__ bool block_failed(const MoeArgs& a) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = failed_before(a) ? 1 : 0;
  __syncthreads();
  return failed != 0;
}

// Every block, once its work is written: the launch's last block to arrive (on arrival counter
// `arrive`) writes n into word `slot` of every rank's area, after `tokens`, when given, into
// every rank's tokens word of dispatch n. Each block's fence orders its own stores (to peers'
// memory among them) before its arrival, at system scope; the last block's release carries
// them all to the ranks that acquire the word.
__device__ __forceinline__ void signal_all(const MoeArgs& a, dc_u32 arrive, dc_u32 slot, const dc_u64* tokens,
                                           dc_u64 n) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  dc_u64* c = reinterpret_cast<dc_u64*>(a.ctr);
  fence_acq_rel_sys();
  if (atomicAdd(reinterpret_cast<unsigned long long*>(c + arrive), 1ull) != gridDim.x - 1) return;
  c[arrive] = 0;
  fence_acq_rel_sys();
  if (tokens != nullptr) {
    for (dc_u32 r = 0; r < a.world; ++r) tokens_words(a, area(a, r), n)[a.rank] = *tokens;
  }
  for (dc_u32 r = 0; r < a.world; ++r) st_release_sys(reinterpret_cast<dc_u64*>(area(a, r)) + slot, n);
}

// Waits (thread 0 of the block, the block then syncs) until word `first + r` of this rank's
// area reaches `expected` for every rank r; false on timeout or abort (recorded, and the layer
// marked failed: nothing may be read or published then, by this kernel or a later one).
__device__ bool arrived_all(const MoeArgs& a, dc_u32 first, dc_u64 expected, dc_u32 op) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = failed_before(a) ? 0 : 1;
    const dc_u64* words = reinterpret_cast<const dc_u64*>(a.sym);
    for (dc_u32 r = 0; r < a.world && ok; ++r) {
      const WaitSite site{op, (dc_i32)r, first + r};
      ok = wait_until(reinterpret_cast<DeviceErrorState*>(a.err), a.timeout_ns, (dc_i32)a.rank,
                      words + first + r, expected, Cmp::Ge, site) ? 1 : 0;
    }
    if (!ok) reinterpret_cast<volatile dc_u64*>(a.ctr)[kFailed] = 1;
  }
  __syncthreads();
  return ok != 0;
}

// Every block, at the end of a call's last kernel: the last block to arrive sets the count of
// calls done (`which`) to n.
__device__ __forceinline__ void advance(const MoeArgs& a, dc_u32 arrive, dc_u32 which, dc_u64 n) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  dc_u64* c = reinterpret_cast<dc_u64*>(a.ctr);
  __threadfence();
  if (atomicAdd(reinterpret_cast<unsigned long long*>(c + arrive), 1ull) == gridDim.x - 1) {
    c[arrive] = 0;
    c[which] = n;
  }
}

enum : int { kMaxWorld = 64 };

// The args of a kernel that reads dispatch n's received rows: `recv_counts` then points to
// `prefix` (shared memory, world + 1 words: the rows of rank r are [prefix[r], prefix[r + 1])
// in received order), and on the direct path `recv` into this rank's area (the rows of src
// sit at [src][t]). Every thread calls; the block syncs.
__device__ __forceinline__ MoeArgs received_view(MoeArgs a, dc_u64 n, dc_u64* prefix) {
  if (a.direct) {
    char* me = reinterpret_cast<char*>(a.sym);
    a.recv = reinterpret_cast<dc_u64>(rows_of(a, me, n));
    a.recv_counts = reinterpret_cast<dc_u64>(tokens_words(a, me, n));
  }
  const dc_u64* counts = reinterpret_cast<const dc_u64*>(a.recv_counts);
  for (dc_u32 r = threadIdx.x; r < a.world; r += blockDim.x) prefix[r + 1] = counts[r];
  __syncthreads();
  if (threadIdx.x == 0) {
    prefix[0] = 0;
    for (dc_u32 r = 1; r <= a.world; ++r) prefix[r] += prefix[r - 1];
  }
  __syncthreads();
  a.recv_counts = reinterpret_cast<dc_u64>(prefix);
  return a;
}

// Rows received (after received_view).
__device__ __forceinline__ dc_u64 received(const MoeArgs& a) {
  return reinterpret_cast<const dc_u64*>(a.recv_counts)[a.world];
}

// The place among the received rows of received row i (rank order, then token order):
// i itself when they are packed, [src][t] on the direct path.
__device__ __forceinline__ dc_u64 recv_index(const MoeArgs& a, dc_u64 i) {
  if (!a.direct) return i;
  const dc_u64* prefix = reinterpret_cast<const dc_u64*>(a.recv_counts);
  dc_u32 r = 0;
  while (r + 1 < a.world && i >= prefix[r + 1]) ++r;
  return (dc_u64)r * a.cap + (i - prefix[r]);
}

__device__ __forceinline__ const char* recv_row(const MoeArgs& a, dc_u64 i) {
  return reinterpret_cast<const char*>(a.recv) + recv_index(a, i) * a.row_bytes;
}

// Direct path: the ranks of a token's experts (a bit a rank) from the lanes' entries `e`
// (warp_entry); every lane gets the bits.
__device__ __forceinline__ dc_u64 token_ranks(const MoeArgs& a, long long e) {
  dc_u64 bits = e >= 0 ? 1ull << (e / a.local_experts) : 0ull;
  for (int o = 16; o > 0; o >>= 1) bits |= __shfl_xor_sync(0xFFFFFFFFu, bits, o);
  return bits;
}

// Token t's row in rank r's area (direct path, dispatch n).
__device__ __forceinline__ char* direct_row(const MoeArgs& a, dc_u32 r, dc_u64 t, dc_u64 n) {
  return rows_of(a, area(a, r), n) + ((dc_u64)a.rank * a.cap + t) * a.row_bytes;
}

// Token t's packed rows, one per rank it goes to (at most world), into rows; returns how many.
// On the direct path (dispatch n) the rows are in the ranks' areas, and the ranks are kept in
// slot (t itself for a rank it goes to, -1 for the others).
// `e`: the lanes' entries of the token (warp_entry).
__device__ __forceinline__ dc_u32 token_rows(const MoeArgs& a, dc_u64 t, char** rows, dc_u64 n_call, long long e) {
  int* slot = reinterpret_cast<int*>(a.slot);
  dc_u32 n = 0;
  if (a.direct) {
    const dc_u64 bits = token_ranks(a, e);
    for (dc_u32 r = lane_id(); r < a.world; r += 32) slot[t * a.world + r] = (bits >> r) & 1u ? (int)t : -1;
    for (dc_u32 r = 0; r < a.world; ++r) {
      if ((bits >> r) & 1u) rows[n++] = direct_row(a, r, t, n_call);
    }
    return n;
  }
  const dc_u64* offsets = reinterpret_cast<const dc_u64*>(a.send_offsets);
  for (dc_u32 r = 0; r < a.world; ++r) {
    const int s = slot[t * a.world + r];
    if (s >= 0) rows[n++] = reinterpret_cast<char*>(a.send) + (offsets[r] + (dc_u64)s) * a.row_bytes;
  }
  return n;
}

// Into each packed row of token t (the lanes of a warp; every lane calls, `e` the lanes'
// entries): its expert ids local to that row's rank (0xFFFF: another rank's or dropped) and
// its k weights. On the direct path every rank gets them (all 0xFFFF where the token does not
// go), so that no stale ids stay in its slot.
__device__ __forceinline__ void pack_routing(const MoeArgs& a, dc_u64 t, dc_u64 n_call, long long e_lane) {
  const int* slot = reinterpret_cast<const int*>(a.slot);
  const dc_u64* offsets = reinterpret_cast<const dc_u64*>(a.send_offsets);
  const float* w = reinterpret_cast<const float*>(a.topk_w);
  const dc_u32 total = a.world * a.k;
  for (dc_u32 first = 0; first < total; first += 32) {
    const dc_u32 p = first + lane_id(), r = p / a.k, j = p % a.k;
    const long long e = __shfl_sync(0xFFFFFFFFu, e_lane, (int)j);
    if (p >= total) continue;
    char* row;
    if (a.direct) {
      row = direct_row(a, r, t, n_call);
    } else {
      const int s = slot[t * a.world + r];
      if (s < 0) continue;
      row = reinterpret_cast<char*>(a.send) + (offsets[r] + (dc_u64)s) * a.row_bytes;
    }
    const bool here = e >= 0 && (dc_u32)(e / a.local_experts) == r;
    reinterpret_cast<unsigned short*>(row + a.ids_off)[j] =
        here ? (unsigned short)(e - (long long)r * a.local_experts) : (unsigned short)kNone;
    reinterpret_cast<float*>(row + a.w_off)[j] = w[t * a.k + j];
  }
}

// The dispatch's number (the count of dispatches done + 1) for the direct path's kernels.
__device__ __forceinline__ dc_u64 this_dispatch(const MoeArgs& a) {
  return a.direct ? calls_done(a, kDispatches) + 1 : 0;
}

// The end of a pack kernel: on the direct path the launch's last block signals every rank
// (with this rank's tokens).
__device__ __forceinline__ void pack_done(const MoeArgs& a, dc_u64 n) {
  if (a.direct) signal_all(a, kArrivePack, a.rank, &a.tokens, n);
}

template <class T>
__global__ void moe_pack(MoeArgs a) {
  const dc_u32 hidden_bytes = a.hidden * (dc_u32)sizeof(T), units = hidden_bytes / 16;
  const dc_u32 parts = parts_of(units);
  const dc_u64 n_call = this_dispatch(a);
  if (a.direct && block_failed(a)) return;
  for (dc_u64 item = global_warp(); item < a.tokens * parts; item += warp_count()) {
    // A part of the token's row goes to each rank of its experts, read once.
    const dc_u64 t = item / parts;
    const dc_u32 part = (dc_u32)(item % parts);
    char* rows[64];
    // Part 0 counts the token's bad and repeated ids (the all-to-all-v path's layout did).
    const long long e = warp_entry(a, t, a.direct && part == 0);
    const dc_u32 n = token_rows(a, t, rows, n_call, e);
    warp_copy_to(rows, n, reinterpret_cast<const char*>(a.x) + t * hidden_bytes, part * kPartUnits,
                 part_end(part, units));
    if (part == 0) pack_routing(a, t, n_call, e);
  }
  pack_done(a, n_call);
}

// ---- FP8 on the wire --------------------------------------------------------------------
// A lane quantises kChunk consecutive elements at a time (16 or 32 bytes of T in, 8 bytes of
// e4m3 out); a 128-element block is 16 chunks, half a warp.
enum : dc_u32 { kChunk = 8, kBlockChunks = 128 / kChunk };
// The FP8 kernels work a row in parts of kPartChunks chunks (1,024 elements: eight blocks of
// 128), a warp per (row, part), as the others do (the per-row scale's pack excepted: its amax
// spans the row).
enum : dc_u32 { kPartChunks = 128 };

// Chunk c of a row of T (16-byte aligned) as floats (exact).
template <class T>
__device__ __forceinline__ void load_chunk(const char* row, dc_u32 c, float (&v)[kChunk]) {
  constexpr int kN = Vec<T>::kN, kU = (int)kChunk / kN;
  const uint4* p = reinterpret_cast<const uint4*>(row) + (dc_u64)c * kU;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    Vec<T> x;
    x.u = p[u];
#pragma unroll
    for (int e = 0; e < kN; ++e) v[u * kN + e] = (float)Num<T>::load(x.v[e]);
  }
}

// v rounded to T (to nearest even) as chunk c of a row of T.
template <class T>
__device__ __forceinline__ void store_chunk(char* row, dc_u32 c, const float (&v)[kChunk]) {
  constexpr int kN = Vec<T>::kN, kU = (int)kChunk / kN;
  uint4* p = reinterpret_cast<uint4*>(row) + (dc_u64)c * kU;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    Vec<T> x;
#pragma unroll
    for (int e = 0; e < kN; ++e) x.v[e] = Num<T>::store(v[u * kN + e]);
    p[u] = x.u;
  }
}

// The larger of m and the largest |v| over v's finite elements (NaN and infinities left out:
// NaN quantises to NaN, an infinity saturates to 448).
__device__ __forceinline__ float finite_amax(const float (&v)[kChunk], float m) {
#pragma unroll
  for (int e = 0; e < (int)kChunk; ++e) {
    const float x = fabsf(v[e]);
    if (x <= 3.40282347e38f) m = fmaxf(m, x);
  }
  return m;
}

// The max of v over groups of `width` lanes (a power of two up to 32; every lane calls).
__device__ __forceinline__ float group_max(float v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// A block's scale (amax / 448; 1 for a block of zeros, never 0) and the factor its elements
// are multiplied by before encoding (448 / amax, at most FLT_MAX so that a tiny amax keeps
// 0 x inv = 0).
__device__ __forceinline__ void block_scale(float amax, float* scale, float* inv) {
  *scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
  *inv = amax > 0.0f ? fminf(__fdiv_rn(448.0f, amax), 3.40282347e38f) : 1.0f;
}

// e4m3(v[e] x inv) for each element, element 0 in the lowest byte.
__device__ __forceinline__ uint2 quantise_chunk(const float (&v)[kChunk], float inv) {
  unsigned w[2] = {0u, 0u};
#pragma unroll
  for (int e = 0; e < (int)kChunk; ++e) {
    w[e / 4] |= (unsigned)devcomm::fp8::e4m3_from_f32(__fmul_rn(v[e], inv)) << (8 * (e % 4));
  }
  return make_uint2(w[0], w[1]);
}

// Stores chunk c's codes q into each of rows[0..n).
__device__ __forceinline__ void store_codes(char* const* rows, dc_u32 n, dc_u32 c, uint2 q) {
  for (dc_u32 d = 0; d < n; ++d) reinterpret_cast<uint2*>(rows[d])[c] = q;
}

// Stores scale number b into each of rows[0..n) (after the codes).
__device__ __forceinline__ void store_scale(const MoeArgs& a, char* const* rows, dc_u32 n, dc_u32 b, float s) {
  for (dc_u32 d = 0; d < n; ++d) reinterpret_cast<float*>(rows[d] + a.scales_off)[b] = s;
}

// moe_pack with the row quantised: per row, a warp per token, a pass for the amax (a warp max)
// and one to encode; per 128 elements, a warp per part of a token, one pass, each half warp a
// block (its max over 16 lanes).
template <class T>
__global__ void moe_pack_fp8(MoeArgs a) {
  const dc_u32 hidden_bytes = a.hidden * (dc_u32)sizeof(T);
  const dc_u32 chunks = a.hidden / kChunk;
  const bool per_row = a.scale_block == a.hidden;
  const dc_u32 parts = per_row ? 1u : (chunks + kPartChunks - 1) / kPartChunks;
  const dc_u32 lane = lane_id();
  const dc_u64 n_call = this_dispatch(a);
  if (a.direct && block_failed(a)) return;
  for (dc_u64 item = global_warp(); item < a.tokens * parts; item += warp_count()) {
    const dc_u64 t = item / parts;
    const dc_u32 part = (dc_u32)(item % parts);
    char* rows[64];
    const long long e = warp_entry(a, t, a.direct && part == 0);
    const dc_u32 n = token_rows(a, t, rows, n_call, e);
    const char* x = reinterpret_cast<const char*>(a.x) + t * hidden_bytes;
    float v[kChunk];
    if (per_row) {
      float m = 0.0f;
      for (dc_u32 c = lane; c < chunks; c += 32) {
        load_chunk<T>(x, c, v);
        m = finite_amax(v, m);
      }
      float scale, inv;
      block_scale(group_max(m, 32), &scale, &inv);
      for (dc_u32 c = lane; c < chunks; c += 32) {
        load_chunk<T>(x, c, v);
        store_codes(rows, n, c, quantise_chunk(v, inv));
      }
      if (lane == 0) store_scale(a, rows, n, 0, scale);
    } else {
      // chunks is a multiple of 16 (hidden of 128s), and so is a part's first chunk: a half
      // warp is wholly in or out.
      const dc_u32 last = min((part + 1) * kPartChunks, chunks);
      for (dc_u32 base = part * kPartChunks; base < last; base += 32) {
        const dc_u32 c = base + lane;
        const bool in = c < last;
        float m = 0.0f;
        if (in) {
          load_chunk<T>(x, c, v);
          m = finite_amax(v, 0.0f);
        }
        float scale, inv;
        block_scale(group_max(m, (int)kBlockChunks), &scale, &inv);
        if (!in) continue;
        store_codes(rows, n, c, quantise_chunk(v, inv));
        if (c % kBlockChunks == 0) store_scale(a, rows, n, c / kBlockChunks, scale);
      }
    }
    if (part == 0) pack_routing(a, t, n_call, e);
  }
  pack_done(a, n_call);
}


__device__ __forceinline__ const unsigned short* row_ids(const MoeArgs& a, dc_u64 i) {
  return reinterpret_cast<const unsigned short*>(recv_row(a, i) + a.ids_off);
}

// Block b (kLayoutThreads threads) numbers the received rows that go to local experts b,
// b + gridDim.x, ... (a block per expert unless the layer's SM budget caps the grid). On the
// direct path it first waits for every rank's rows.
extern "C" __global__ void __launch_bounds__(kLayoutThreads) moe_positions(MoeArgs args) {
  __shared__ dc_u32 warp_sum[kLayoutWarps];
  __shared__ dc_u64 run;
  const dc_u32 tid = threadIdx.x;
  const dc_u64 n_call = this_dispatch(args);
  if (args.direct && !arrived_all(args, 0, n_call, kOpMoeDispatch)) return;
  __shared__ dc_u64 prefix[kMaxWorld + 1];
  const MoeArgs a = received_view(args, n_call, prefix);
  const dc_u64 rows = received(a);
  dc_u32* pos = reinterpret_cast<dc_u32*>(a.pos);
  for (dc_u32 le = blockIdx.x; le < a.local_experts; le += gridDim.x) {
    if (tid == 0) run = 0;
    __syncthreads();
    for (dc_u64 base = 0; base < rows; base += kLayoutThreads) {
      const dc_u64 i = base + tid;
      int m = -1;
      if (i < rows) {
        const unsigned short* ids = row_ids(a, i);
        for (dc_u32 j = 0; j < a.k; ++j) {
          if (ids[j] == le) m = (int)j;
        }
      }
      const dc_u64 at = block_rank(m >= 0, warp_sum, &run);
      if (m >= 0) pos[i * a.k + (dc_u32)m] = (dc_u32)at;
    }
    if (tid == 0) reinterpret_cast<long long*>(a.expert_count)[le] = (long long)run;
    __syncthreads();
  }
}

// First output row of each local expert's group (groups padded to `align`) into `base`
// (local_experts + 1 entries, the last the rows needed); the block syncs. The counts are read
// by all threads at once (one serial pass over global memory would cost a load latency per
// expert), then summed in shared memory by warp 0, 32 at a time (a scan by shuffles; one
// thread adding 128 of them took a few microseconds in every block of every kernel).
__device__ __forceinline__ void group_bases(const MoeArgs& a, dc_u64* base) {
  const long long* count = reinterpret_cast<const long long*>(a.expert_count);
  for (dc_u32 e = threadIdx.x; e < a.local_experts; e += blockDim.x) {
    base[e + 1] = ((dc_u64)count[e] + a.align - 1) / a.align * a.align;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const dc_u32 lane = threadIdx.x;
    dc_u64 carry = 0;
    for (dc_u32 first = 1; first <= a.local_experts; first += 32) {
      const dc_u32 e = first + lane;
      dc_u64 v = e <= a.local_experts ? base[e] : 0;
      for (int d = 1; d < 32; d <<= 1) {
        const dc_u64 o = __shfl_up_sync(0xFFFFFFFFu, v, d);
        if ((int)lane >= d) v += o;
      }
      if (e <= a.local_experts) base[e] = carry + v;
      carry += __shfl_sync(0xFFFFFFFFu, v, 31);
    }
    if (lane == 0) base[0] = 0;
  }
  __syncthreads();
}

enum : int { kMaxLocalExperts = 1024 };

// The unpack kernels' start: the groups' first rows into `base` (shared, local_experts + 1),
// and whether they fit the output; when not, nothing is written and status says how many
// rows the output needs.
__device__ __forceinline__ bool unpack_fits(const MoeArgs& a, dc_u64* base) {
  if (a.direct && block_failed(a)) return false;
  group_bases(a, base);
  const dc_u64 needed = base[a.local_experts];
  if (needed <= a.out_rows) return true;
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicMax(reinterpret_cast<dc_u64*>(a.status) + kOverflow, needed);
  return false;
}

// Received row i's output rows, one per local expert it chose (at most k), into out; returns
// how many (every lane of the warp gets all of them).
__device__ __forceinline__ dc_u32 row_outputs(const MoeArgs& a, dc_u64 i, const dc_u64* base, dc_u64* out) {
  // Lane j loads entry j (its local expert and place); the others take them by shuffles.
  const dc_u32 lane = lane_id();
  dc_u64 mine = ~0ull;
  if (lane < a.k) {
    const dc_u32 le = row_ids(a, i)[lane];
    if (le != kNone) mine = base[le] + reinterpret_cast<const dc_u32*>(a.pos)[i * a.k + lane];
  }
  dc_u32 n = 0;
  for (dc_u32 j = 0; j < a.k; ++j) {
    const dc_u64 o = __shfl_sync(0xFFFFFFFFu, mine, (int)j);
    if (o != ~0ull) out[n++] = o;
  }
  return n;
}

// Received row i's weight into each of its output rows (the lanes of a warp, once a row; pos
// keeps the place in the group, which the combine adds to the group's first row).
__device__ __forceinline__ void unpack_finish(const MoeArgs& a, dc_u64 i, const dc_u64* base) {
  const char* row = recv_row(a, i);
  const unsigned short* ids = reinterpret_cast<const unsigned short*>(row + a.ids_off);
  const float* w = reinterpret_cast<const float*>(row + a.w_off);
  const dc_u32* pos = reinterpret_cast<const dc_u32*>(a.pos);
  for (dc_u32 j = lane_id(); j < a.k; j += 32) {
    const dc_u32 le = ids[j];
    if (le == kNone) continue;
    reinterpret_cast<float*>(a.out_w)[base[le] + pos[i * a.k + j]] = w[j];
  }
}

// Received row i's copies as addresses in out_x (rows of out_row_bytes) into dsts; returns
// how many, and their output rows in out.
__device__ __forceinline__ dc_u32 row_destinations(const MoeArgs& a, dc_u64 i, const dc_u64* base,
                                                   dc_u64* out, char** dsts) {
  const dc_u32 n = row_outputs(a, i, base, out);
  for (dc_u32 d = 0; d < n; ++d) dsts[d] = reinterpret_cast<char*>(a.out_x) + out[d] * a.out_row_bytes;
  return n;
}

// The end of an unpack kernel: on the direct path the dispatch is done (its number advances).
__device__ __forceinline__ void unpack_done(const MoeArgs& a, dc_u64 n_call) {
  if (a.direct) advance(a, kArriveDispatch, kDispatches, n_call);
}

// The FP8 unpack kernels' walk over this dispatch's received rows, a warp per (row, part), a
// row in `parts_of_row(a)` parts: for each row that goes to local experts here,
// `part_of(a, i, part, n, out, dsts)` writes the part into the row's n copies (output rows
// `out`, at `dsts`), then part 0 writes the row's weights. Nothing is written when the output
// is too small (unpack_fits); the launch's end advances the dispatch count on the direct path.
template <class Parts, class PartOf>
__device__ __forceinline__ void unpack_rows(const MoeArgs& args, Parts parts_of_row, PartOf part_of) {
  __shared__ dc_u64 base[kMaxLocalExperts + 1];
  __shared__ dc_u64 prefix[kMaxWorld + 1];
  const dc_u64 n_call = this_dispatch(args);
  const MoeArgs a = received_view(args, n_call, prefix);
  const dc_u64 rows = unpack_fits(a, base) ? received(a) : 0;
  const dc_u32 parts = parts_of_row(a);
  for (dc_u64 item = global_warp(); item < rows * parts; item += warp_count()) {
    const dc_u64 i = item / parts;
    const dc_u32 part = (dc_u32)(item % parts);
    dc_u64 out[32];
    char* dsts[32];
    const dc_u32 n = row_destinations(a, i, base, out, dsts);
    if (n == 0) continue;  // a direct row that only carries other ranks' ids
    part_of(a, i, part, n, out, dsts);
    if (part == 0) unpack_finish(a, i, base);
  }
  unpack_done(a, n_call);
}

// Rows as they are: unpack_rows's walk written out (this kernel is the dispatch's measured hot
// path, docs/PERFORMANCE.md, and through unpack_rows it compiles to other code; the FP8
// kernels compile to the same code either way).
template <class T>
__global__ void moe_unpack(MoeArgs args) {
  __shared__ dc_u64 base[kMaxLocalExperts + 1];
  __shared__ dc_u64 prefix[kMaxWorld + 1];
  const dc_u64 n_call = this_dispatch(args);
  const MoeArgs a = received_view(args, n_call, prefix);
  if (unpack_fits(a, base)) {
    const dc_u64 rows = received(a);
    const dc_u32 units = a.hidden * (dc_u32)sizeof(T) / 16, parts = parts_of(units);
    for (dc_u64 item = global_warp(); item < rows * parts; item += warp_count()) {
      // A part of the row's copy per local expert, read once.
      const dc_u64 i = item / parts;
      const dc_u32 part = (dc_u32)(item % parts);
      dc_u64 out[32];
      char* dsts[32];
      const dc_u32 n = row_destinations(a, i, base, out, dsts);
      if (n == 0) continue;  // a direct row that only carries other ranks' ids
      warp_copy_to(dsts, n, recv_row(a, i), part * kPartUnits, part_end(part, units));
      if (part == 0) unpack_finish(a, i, base);
    }
  }
  unpack_done(a, n_call);
}

// FP8 rows dequantised: element = e4m3 x its block's scale in f32, rounded to T, into each
// copy (the row read once), a warp per part of a row.
template <class T>
__global__ void moe_unpack_dequant(MoeArgs args) {
  unpack_rows(
      args, [](const MoeArgs& a) { return (a.hidden / kChunk + kPartChunks - 1) / kPartChunks; },
      [](const MoeArgs& a, dc_u64 i, dc_u32 part, dc_u32 n, const dc_u64*, char* const* dsts) {
        const dc_u32 chunks = a.hidden / kChunk, per_scale = a.scale_block / kChunk;
        const char* row = recv_row(a, i);
        const float* scales = reinterpret_cast<const float*>(row + a.scales_off);
        const dc_u32 last = min((part + 1) * kPartChunks, chunks);
        for (dc_u32 c = part * kPartChunks + lane_id(); c < last; c += 32) {
          const uint2 q = reinterpret_cast<const uint2*>(row)[c];
          const float s = scales[c / per_scale];
          float v[kChunk];
#pragma unroll
          for (int e = 0; e < (int)kChunk; ++e) {
            const unsigned word = e < 4 ? q.x : q.y;
            v[e] = __fmul_rn(devcomm::fp8::e4m3_to_f32((unsigned char)(word >> (8 * (e % 4)))), s);
          }
          for (dc_u32 d = 0; d < n; ++d) store_chunk<T>(dsts[d], c, v);
        }
      });
}

// FP8 rows kept as FP8: the codes into out_x (hidden bytes a row), the scales into out_scales
// (scales a row), for each copy (the row read once), a warp per 2 KiB part of the codes (part 0
// also the scales).
template <class T>
__global__ void moe_unpack_fp8(MoeArgs args) {
  unpack_rows(
      args, [](const MoeArgs& a) { return parts_of(a.hidden / 16); },
      [](const MoeArgs& a, dc_u64 i, dc_u32 part, dc_u32 n, const dc_u64* out, char* const* dsts) {
        const char* row = recv_row(a, i);
        warp_copy_to(dsts, n, row, part * kPartUnits, part_end(part, a.hidden / 16));
        if (part != 0) return;
        const float* scales = reinterpret_cast<const float*>(row + a.scales_off);
        float* out_scales = reinterpret_cast<float*>(a.out_scales);
        for (dc_u32 p = lane_id(); p < n * a.scales; p += 32) {
          const dc_u32 d = p / a.scales, b = p % a.scales;
          out_scales[out[d] * a.scales + b] = scales[b];
        }
      });
}

// Whether this rank's dispatch output overflowed: it wrote nothing, and its experts'
// contributions come back as zeros (Moe::check reports it).
__device__ __forceinline__ bool overflowed(const MoeArgs& a) {
  return reinterpret_cast<const volatile dc_u64*>(a.status)[kOverflow] != 0;
}

// out[v] = round_T(sum over q < n, in order, of w[q] x src[q][v]) (w: nullptr for weights of
// 1, sums of rounded partials), for lo <= v < vecs 16-byte vectors, by the lanes of a warp. The
// sources' addresses are known before the loop and up to kQ x kV vectors are in flight per
// lane, so that a row's loads do not wait on each other (a warp per row or token otherwise
// waits a load latency per vector and source; a 128-token combine took 152 us against its
// dispatch's 73 on 2 H200s so).
template <class T>
__device__ __forceinline__ void warp_weighted_sum(uint4* __restrict__ out, const uint4* const* src,
                                                  const float* w, dc_u32 n, dc_u32 lo, dc_u32 vecs) {
  using N = Num<T>;
  constexpr int kN = Vec<T>::kN;
  constexpr int kV = 2, kQ = 4;
  for (dc_u32 v0 = lo + lane_id(); v0 < vecs; v0 += 32 * kV) {
    float acc[kV][kN];
#pragma unroll
    for (int u = 0; u < kV; ++u) {
#pragma unroll
      for (int e = 0; e < kN; ++e) acc[u][e] = 0.0f;
    }
    for (dc_u32 q0 = 0; q0 < n; q0 += kQ) {
      // kQ sources' vectors in flight, then added in order.
      Vec<T> y[kQ][kV];
#pragma unroll
      for (int dq = 0; dq < kQ; ++dq) {
#pragma unroll
        for (int u = 0; u < kV; ++u) {
          const dc_u32 v = v0 + u * 32;
          if (q0 + dq < n && v < vecs) y[dq][u].u = src[q0 + dq][v];
        }
      }
#pragma unroll
      for (int dq = 0; dq < kQ; ++dq) {
        const dc_u32 q = q0 + dq;
        if (q >= n) break;
#pragma unroll
        for (int u = 0; u < kV; ++u) {
#pragma unroll
          for (int e = 0; e < kN; ++e) {
            const float x = (float)N::load(y[dq][u].v[e]);
            const float p = w ? __fmul_rn(w[q], x) : x;
            acc[u][e] = q == 0 ? p : __fadd_rn(acc[u][e], p);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kV; ++u) {
      const dc_u32 v = v0 + u * 32;
      if (v >= vecs) continue;
      Vec<T> r;
#pragma unroll
      for (int e = 0; e < kN; ++e) r.v[e] = N::store(acc[u][e]);
      out[v] = r.u;
    }
  }
}

// On the direct path each sum goes straight into the sending rank's area (combine m, at
// [this rank][token]), and the launch's last block then signals every rank.
template <class T>
__device__ __forceinline__ void combine_pack(MoeArgs args) {
  __shared__ dc_u64 base[kMaxLocalExperts + 1];
  const dc_u64 n_call = args.direct ? calls_done(args, kDispatches) : 0;
  const dc_u64 m_call = args.direct ? calls_done(args, kCombines) + 1 : 0;
  if (args.direct && block_failed(args)) return;
  __shared__ dc_u64 prefix[kMaxWorld + 1];
  const MoeArgs a = received_view(args, n_call, prefix);
  const bool none = overflowed(a);
  group_bases(a, base);
  const dc_u64 rows = received(a);
  const dc_u32 vecs = a.hidden / Vec<T>::kN, hidden_bytes = vecs * 16u, parts = parts_of(vecs);
  const dc_u32* pos = reinterpret_cast<const dc_u32*>(a.pos);
  const uint4* ys = reinterpret_cast<const uint4*>(a.y);
  for (dc_u64 item = global_warp(); item < rows * parts; item += warp_count()) {
    // A part of the row's sum.
    const dc_u64 i = item / parts;
    const dc_u32 part = (dc_u32)(item % parts);
    const dc_u64 at = recv_index(a, i);
    const char* row = reinterpret_cast<const char*>(a.recv) + at * a.row_bytes;
    // Lane j loads entry j: its local expert, weight and output row (all at once).
    const dc_u32 lane = lane_id();
    dc_u32 id = kNone;
    float wj = 0.0f;
    dc_u64 yj = 0;
    if (lane < a.k) {
      id = reinterpret_cast<const unsigned short*>(row + a.ids_off)[lane];
      if (id != kNone) {
        wj = reinterpret_cast<const float*>(row + a.w_off)[lane];
        yj = reinterpret_cast<dc_u64>(ys + (base[id] + pos[i * a.k + lane]) * vecs);
      }
    }
    // A row with no expert here only carries another rank's ids (the direct path): not sent here.
    const unsigned valid = __ballot_sync(0xFFFFFFFFu, id != kNone);
    if (valid == 0) continue;
    // The entries in ascending expert order (a row's local experts are distinct): entry j's
    // place is the number of smaller ones; the outputs to read and their weights in that order.
    dc_u32 order = 0;
    for (dc_u32 q = 0; q < a.k; ++q) order += __shfl_sync(0xFFFFFFFFu, id, (int)q) < id ? 1u : 0u;
    const uint4* src[32];
    float wt[32];
    const dc_u32 n = none ? 0u : (dc_u32)__popc(valid);
    for (dc_u32 q = 0; q < n; ++q) {
      const int from = __ffs(__ballot_sync(0xFFFFFFFFu, id != kNone && order == q)) - 1;
      src[q] = reinterpret_cast<const uint4*>(__shfl_sync(0xFFFFFFFFu, yj, from));
      wt[q] = __shfl_sync(0xFFFFFFFFu, wj, from);
    }
    uint4* dst = reinterpret_cast<uint4*>(a.cback) + i * vecs;
    if (a.direct) {
      const dc_u32 src_rank = (dc_u32)(at / a.cap);
      char* sums = sums_of(a, area(a, src_rank), m_call, hidden_bytes);
      dst = reinterpret_cast<uint4*>(sums + ((dc_u64)a.rank * a.cap + at % a.cap) * hidden_bytes);
    }
    warp_weighted_sum<T>(dst, src, wt, n, part * kPartUnits, part_end(part, vecs));
  }
  if (a.direct) signal_all(a, kArriveCombinePack, a.world + a.rank, nullptr, m_call);
}

// Two builds of one kernel. Unbounded it takes about 95 registers, so two blocks fit an SM;
// the lean build is held to 64 (four blocks an SM, a little spilled), for calls whose
// blocks then fit the GPU at once (`moe::combine_pack_kernel`): a 128-token call on 4
// ranks ran 448 blocks in two waves. Larger calls stride anyway and pay for the spills.
template <class T>
__global__ void __launch_bounds__(kThreads) moe_combine_pack(MoeArgs args) {
  combine_pack<T>(args);
}

template <class T>
__global__ void __launch_bounds__(kThreads, 4) moe_combine_pack_lean(MoeArgs args) {
  combine_pack<T>(args);
}

// On the direct path it first waits for every rank's sums of combine m, in this rank's area.
template <class T>
__global__ void moe_combine_final(MoeArgs a) {
  const dc_u32 vecs = a.hidden / Vec<T>::kN, parts = parts_of(vecs);
  const int* slot = reinterpret_cast<const int*>(a.slot);
  const dc_u64* offsets = reinterpret_cast<const dc_u64*>(a.send_offsets);
  const uint4* back = reinterpret_cast<const uint4*>(a.back);
  const dc_u64 m_call = a.direct ? calls_done(a, kCombines) + 1 : 0;
  const bool ok = !a.direct || arrived_all(a, a.world, m_call, kOpMoeCombine);
  if (a.direct) back = reinterpret_cast<const uint4*>(sums_of(a, reinterpret_cast<char*>(a.sym), m_call, vecs * 16u));
  for (dc_u64 item = global_warp(); ok && item < a.tokens * parts; item += warp_count()) {
    const dc_u64 t = item / parts;
    const dc_u32 part = (dc_u32)(item % parts);
    // The ranks' sums of this token, in rank order: lane r (and r + 32) loads rank r's slot
    // and where its sum is; the warp walks the ranks present.
    const dc_u32 lane = lane_id();
    dc_u64 at[2] = {0, 0};
    bool here[2] = {false, false};
    for (int h = 0; h < 2; ++h) {
      const dc_u32 r = lane + 32u * (dc_u32)h;
      if (r >= a.world) continue;
      const int s = slot[t * a.world + r];
      here[h] = s >= 0;
      if (here[h]) at[h] = a.direct ? (dc_u64)r * a.cap + t : offsets[r] + (dc_u64)s;
    }
    dc_u64 ranks = (dc_u64)__ballot_sync(0xFFFFFFFFu, here[0]) | ((dc_u64)__ballot_sync(0xFFFFFFFFu, here[1]) << 32);
    const uint4* src[64];
    dc_u32 n = 0;
    while (ranks != 0) {
      const int r = __ffsll((long long)ranks) - 1;
      ranks &= ranks - 1;
      const dc_u64 lo = __shfl_sync(0xFFFFFFFFu, at[0], r & 31), hi = __shfl_sync(0xFFFFFFFFu, at[1], r & 31);
      src[n++] = back + (r < 32 ? lo : hi) * vecs;
    }
    warp_weighted_sum<T>(reinterpret_cast<uint4*>(a.out) + t * vecs, src, nullptr, n, part * kPartUnits,
                         part_end(part, vecs));
  }
  if (a.direct) advance(a, kArriveCombine, kCombines, m_call);
}

}  // namespace moe
}  // namespace devcomm
