// Mixture-of-experts dispatch and combine around two all-to-all-v calls (docs/MOE.md). Rank r
// holds experts [r * local_experts, (r + 1) * local_experts). The JIT appends the
// instantiations (element type) after this text. Every kernel takes one MoeArgs
// (src/moe/args.rs is its twin).
//
//   layout        one block: which ranks each token goes to (once per rank, however many of its
//                 experts live there), its slot among the tokens sent to that rank (token
//                 order), the rows per rank and their offsets (rank order)
//   pack          a warp per token: its row into the slot of each rank it goes to (read once)
//                 and, after it, its expert ids local to that rank (0xFFFF: another rank's or
//                 dropped) and its k weights
//   [all-to-all-v of the packed rows]
//   positions     a block per local expert: each received row's place in that expert's group
//                 (rows in received order: source rank, then the source's token order)
//   unpack        a warp per received row (read once): its copy per local expert into the expert-major
//                 output (groups padded to `align` rows) with the weight; the place of each
//                 copy is kept for the combine
//   combine_pack  a warp per received row: sum of weight x expert output over its local experts
//                 in ascending expert order, in f32, rounded once to T
//   [all-to-all-v back, in the same row order]
//   combine_final a warp per token: sum over the ranks it went to, in rank order, in f32
//
// Additions are explicit (__fmul_rn, __fadd_rn: no contraction into FMA), so a host reference
// in the same order gives the same bits, and a token's result depends only on its own routing
// and its experts' outputs, never on the other tokens of the batch.
#include "devcomm/reduce.cuh"

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
};

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

// Copies `bytes` (a multiple of 16) from src to each of dst[0..n) with the lanes of a warp:
// the source is read once, kUnroll 16-byte loads in flight per lane before the stores (a
// copy is bound by load latency otherwise).
enum : int { kUnroll = 4 };
__device__ __forceinline__ void warp_copy_to(char* const* dst, dc_u32 n, const char* src, dc_u32 bytes) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  const dc_u32 units = bytes / 16, step = 32 * kUnroll;
  for (dc_u32 base = 0; base < units; base += step) {
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

template <class T>
__global__ void moe_pack(MoeArgs a) {
  const int* slot = reinterpret_cast<const int*>(a.slot);
  const dc_u64* offsets = reinterpret_cast<const dc_u64*>(a.send_offsets);
  const float* w = reinterpret_cast<const float*>(a.topk_w);
  const dc_u32 hidden_bytes = a.hidden * (dc_u32)sizeof(T);
  for (dc_u64 t = global_warp(); t < a.tokens; t += warp_count()) {
    // The token's row goes to each rank of its experts, read once.
    char* rows[64];
    dc_u32 n = 0;
    for (dc_u32 r = 0; r < a.world; ++r) {
      const int s = slot[t * a.world + r];
      if (s >= 0) rows[n++] = reinterpret_cast<char*>(a.send) + (offsets[r] + (dc_u64)s) * a.row_bytes;
    }
    warp_copy_to(rows, n, reinterpret_cast<const char*>(a.x) + t * hidden_bytes, hidden_bytes);
    // After it, per destination: the token's ids local to that rank and its k weights.
    for (dc_u32 p = lane_id(); p < a.world * a.k; p += 32) {
      const dc_u32 r = p / a.k, j = p % a.k;
      const int s = slot[t * a.world + r];
      if (s < 0) continue;
      char* row = reinterpret_cast<char*>(a.send) + (offsets[r] + (dc_u64)s) * a.row_bytes;
      const long long e = entry(a, t, j, false);
      const bool here = e >= 0 && (dc_u32)(e / a.local_experts) == r;
      reinterpret_cast<unsigned short*>(row + a.ids_off)[j] =
          here ? (unsigned short)(e - (long long)r * a.local_experts) : (unsigned short)kNone;
      reinterpret_cast<float*>(row + a.w_off)[j] = w[t * a.k + j];
    }
  }
}

// Rows received, packed in rank order.
__device__ __forceinline__ dc_u64 received(const MoeArgs& a) {
  const dc_u64* c = reinterpret_cast<const dc_u64*>(a.recv_counts);
  dc_u64 n = 0;
  for (dc_u32 r = 0; r < a.world; ++r) n += c[r];
  return n;
}

__device__ __forceinline__ const unsigned short* row_ids(const MoeArgs& a, dc_u64 i) {
  return reinterpret_cast<const unsigned short*>(reinterpret_cast<const char*>(a.recv) + i * a.row_bytes + a.ids_off);
}

// Block le (kLayoutThreads threads) numbers the received rows that go to local expert le.
extern "C" __global__ void __launch_bounds__(kLayoutThreads) moe_positions(MoeArgs a) {
  __shared__ dc_u32 warp_sum[kLayoutWarps];
  __shared__ dc_u64 run;
  const dc_u32 le = blockIdx.x, tid = threadIdx.x;
  if (tid == 0) run = 0;
  __syncthreads();
  const dc_u64 rows = received(a);
  dc_u32* pos = reinterpret_cast<dc_u32*>(a.pos);
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
}

// First output row of each local expert's group (groups padded to `align`) into `base`
// (local_experts + 1 entries, the last the rows needed); the block syncs. The counts are read
// by all threads at once (one serial pass over global memory would cost a load latency per
// expert), then summed in shared memory by thread 0.
__device__ __forceinline__ void group_bases(const MoeArgs& a, dc_u64* base) {
  const long long* count = reinterpret_cast<const long long*>(a.expert_count);
  for (dc_u32 e = threadIdx.x; e < a.local_experts; e += blockDim.x) {
    base[e + 1] = ((dc_u64)count[e] + a.align - 1) / a.align * a.align;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    base[0] = 0;
    for (dc_u32 e = 1; e <= a.local_experts; ++e) base[e] += base[e - 1];
  }
  __syncthreads();
}

enum : int { kMaxLocalExperts = 1024 };

template <class T>
__global__ void moe_unpack(MoeArgs a) {
  __shared__ dc_u64 base[kMaxLocalExperts + 1];
  group_bases(a, base);
  const dc_u64 needed = base[a.local_experts];
  if (needed > a.out_rows) {
    // Nothing written: the caller's output is too small (status says how many rows it needs).
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicMax(reinterpret_cast<dc_u64*>(a.status) + kOverflow, needed);
    return;
  }
  const dc_u64 rows = received(a);
  const dc_u32 hidden_bytes = a.hidden * (dc_u32)sizeof(T);
  dc_u32* pos = reinterpret_cast<dc_u32*>(a.pos);
  for (dc_u64 i = global_warp(); i < rows; i += warp_count()) {
    const char* row = reinterpret_cast<const char*>(a.recv) + i * a.row_bytes;
    const unsigned short* ids = reinterpret_cast<const unsigned short*>(row + a.ids_off);
    const float* w = reinterpret_cast<const float*>(row + a.w_off);
    // The row's copy per local expert, read once.
    char* dsts[32];
    dc_u32 n = 0;
    for (dc_u32 j = 0; j < a.k; ++j) {
      const dc_u32 le = ids[j];
      if (le == kNone) continue;
      const dc_u64 dst = base[le] + pos[i * a.k + j];
      dsts[n++] = reinterpret_cast<char*>(a.out_x) + dst * hidden_bytes;
    }
    warp_copy_to(dsts, n, row, hidden_bytes);
    __syncwarp();
    for (dc_u32 j = lane_id(); j < a.k; j += 32) {
      const dc_u32 le = ids[j];
      if (le == kNone) continue;
      const dc_u64 dst = base[le] + pos[i * a.k + j];
      reinterpret_cast<float*>(a.out_w)[dst] = w[j];
      pos[i * a.k + j] = (dc_u32)dst;
    }
  }
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

// Whether this rank's dispatch output overflowed: it wrote nothing, and its experts'
// contributions come back as zeros (Moe::check reports it).
__device__ __forceinline__ bool overflowed(const MoeArgs& a) {
  return reinterpret_cast<const volatile dc_u64*>(a.status)[kOverflow] != 0;
}

// out[v] = round_T(sum over q < n, in order, of w[q] x src[q][v]) (w: nullptr for weights of
// 1, sums of rounded partials), for v < vecs 16-byte vectors, by the lanes of a warp. The
// sources' addresses are known before the loop and up to kQ x kV vectors are in flight per
// lane, so that a row's loads do not wait on each other (a warp per row or token otherwise
// waits a load latency per vector and source; a 128-token combine took 152 us against its
// dispatch's 73 on 2 H200s so).
template <class T>
__device__ __forceinline__ void warp_weighted_sum(uint4* __restrict__ out, const uint4* const* src,
                                                  const float* w, dc_u32 n, dc_u32 vecs) {
  using N = Num<T>;
  constexpr int kN = Vec<T>::kN;
  constexpr int kV = 2, kQ = 4;
  for (dc_u32 v0 = lane_id(); v0 < vecs; v0 += 32 * kV) {
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

template <class T>
__global__ void moe_combine_pack(MoeArgs a) {
  const bool none = overflowed(a);
  const dc_u64 rows = received(a);
  const dc_u32 vecs = a.hidden / Vec<T>::kN;
  const dc_u32* pos = reinterpret_cast<const dc_u32*>(a.pos);
  const uint4* ys = reinterpret_cast<const uint4*>(a.y);
  for (dc_u64 i = global_warp(); i < rows; i += warp_count()) {
    const char* row = reinterpret_cast<const char*>(a.recv) + i * a.row_bytes;
    const unsigned short* ids = reinterpret_cast<const unsigned short*>(row + a.ids_off);
    const float* w = reinterpret_cast<const float*>(row + a.w_off);
    // The row's local entries in ascending expert order (k is small: a selection each time):
    // the outputs to read and their weights.
    const uint4* src[32];
    float wt[32];
    dc_u32 n = 0;
    for (dc_u32 le = 0; n < a.k && !none;) {
      dc_u32 next = kNone, at = 0;
      for (dc_u32 j = 0; j < a.k; ++j) {
        if (ids[j] != kNone && ids[j] >= le && ids[j] < next) {
          next = ids[j];
          at = j;
        }
      }
      if (next == kNone) break;
      src[n] = ys + (dc_u64)pos[i * a.k + at] * vecs;
      wt[n++] = w[at];
      le = next + 1;
    }
    warp_weighted_sum<T>(reinterpret_cast<uint4*>(a.cback) + i * vecs, src, wt, n, vecs);
  }
}

template <class T>
__global__ void moe_combine_final(MoeArgs a) {
  const dc_u32 vecs = a.hidden / Vec<T>::kN;
  const int* slot = reinterpret_cast<const int*>(a.slot);
  const dc_u64* offsets = reinterpret_cast<const dc_u64*>(a.send_offsets);
  const uint4* back = reinterpret_cast<const uint4*>(a.back);
  for (dc_u64 t = global_warp(); t < a.tokens; t += warp_count()) {
    // The ranks' sums of this token, in rank order.
    const uint4* src[64];
    dc_u32 n = 0;
    for (dc_u32 r = 0; r < a.world; ++r) {
      const int s = slot[t * a.world + r];
      if (s >= 0) src[n++] = back + (offsets[r] + (dc_u64)s) * vecs;
    }
    warp_weighted_sum<T>(reinterpret_cast<uint4*>(a.out) + t * vecs, src, nullptr, n, vecs);
  }
}

}  // namespace moe
}  // namespace devcomm
