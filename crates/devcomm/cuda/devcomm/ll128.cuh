// devcomm/ll128.cuh: LL128: 128-byte lines written by eight lanes of a warp
// (docs/PROTOCOL.md, "LL128").
#pragma once

#include "devcomm/agree.cuh"

namespace devcomm {
namespace p2p {

#if defined(__CUDACC__)

// ---- LL128: 128-byte lines (docs/PROTOCOL.md, "LL128") ----
//
// A line is 16 words of 8 bytes; word 15 carries the call number (the flag), the others the
// payload: 15 words for 8-byte units, 14 for 16-byte units (a unit never straddles lines). Eight
// consecutive lanes of a warp move a line, lane l holding words 2l and 2l + 1, with ONE 16-byte
// store each in the same warp instruction; the receiver loads a line the same way and takes it
// when the flag lane sees this call's number. This relies on NVLink and the L2 delivering a
// warp's aligned 128-byte store whole (not promised by the PTX memory model; NCCL's LL128 relies
// on the same on NVLink). DEVCOMM_P2P_LL128=0 turns the protocol off (src/p2p/env.rs).
template <dc_u64 kUnit>
struct Ll128 {
  static_assert(kUnit == 8 || kUnit == 16, "low-latency units are 8 or 16 bytes");
  static constexpr dc_u64 kWords = kUnit == 8 ? 15 : 14;  // payload words per line
  static constexpr dc_u64 kBytes = kWords * 8;              // payload bytes per line
};

// Line groups (4 lines: one per 8 lanes) each warp keeps in flight: 2 was faster than 4
// (docs/PERFORMANCE.md).
constexpr int kLl128Unroll = 2;

__device__ __forceinline__ void ll128_store(dc_u64* p, dc_u64 v0, dc_u64 v1) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v0), "l"(v1) : "memory");
}

__device__ __forceinline__ void ll128_load(const dc_u64* p, dc_u64& v0, dc_u64& v1) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(v0), "=l"(v1)
               : "l"(p)
               : "memory");
}

// The LL128 lines of call `seq` from `sender`, from line `first` on, inside a window's data.
__device__ __forceinline__ dc_u64* ll128_lines(const P2PLaunch& a, char* window_data, int sender,
                                               dc_u64 seq, dc_u64 first) {
  return reinterpret_cast<dc_u64*>(window_data + (dc_u64)sender * a.region_bytes +
                                   p2p_ll128_offset(a) + (seq & 1) * p2p_ll128_parity_bytes(a) +
                                   first * 128);
}

// Calls f(o, n, k) for each mover unit that lane l holds in a line whose first payload byte is
// `off` of a span of `len` bytes: o is the unit's offset in the span, n its bytes (fewer at the
// span's end), k its first word among the lane's two. Units past the end are skipped.
template <dc_u64 kUnit, class F>
__device__ __forceinline__ void ll128_lane_units(dc_u64 off, dc_u64 len, dc_u32 l, F f) {
  constexpr dc_u32 kPerLane = (dc_u32)(16 / kUnit);  // units per lane: 2 or 1
#pragma unroll
  for (dc_u32 k = 0; k < kPerLane; ++k) {
    const dc_u32 word = 2 * l + k;  // with 16-byte units k is 0: the unit is both words
    const dc_u64 o = off + (dc_u64)word * 8;
    if (word < Ll128<kUnit>::kWords && o < len) f(o, len - o < kUnit ? len - o : kUnit, k);
  }
}

// Lane l's payload of a line whose first payload byte is `off` in the span (`len` bytes from
// `begin` of the message): the mover's units, zero past the end.
template <class M>
__device__ __forceinline__ void ll128_pack(const M& m, dc_u64 begin, dc_u64 len, dc_u64 off,
                                           dc_u32 l, dc_u64 (&v)[2]) {
  v[0] = 0;
  v[1] = 0;
  ll128_lane_units<M::kUnit>(off, len, l, [&](dc_u64 o, dc_u64 n, dc_u32 k) {
    dc_u64 u[M::kUnit / 8];
    m.unit(begin + o, n, u);
#pragma unroll
    for (dc_u32 i = 0; i < M::kUnit / 8; ++i) v[k + i] = u[i];
  });
}

// The inverse of ll128_pack: hands lane l's payload of a line to the mover.
template <class M>
__device__ __forceinline__ void ll128_unpack(const M& m, dc_u64 begin, dc_u64 len, dc_u64 off,
                                             dc_u32 l, const dc_u64 (&v)[2]) {
  ll128_lane_units<M::kUnit>(off, len, l, [&](dc_u64 o, dc_u64 n, dc_u32 k) {
    dc_u64 u[M::kUnit / 8];
#pragma unroll
    for (dc_u32 i = 0; i < M::kUnit / 8; ++i) u[i] = v[k + i];
    const dc_u64(&cu)[M::kUnit / 8] = u;  // the receiving movers take their unit as const
    m.unit(begin + o, n, cu);
  });
}

// LL128 send of span `sp` by the warps of `g`.
template <class G, class M>
__device__ __forceinline__ void ll128_send_span(const G& g, const P2PLaunch& a, const P2PSide& s,
                                                const M& m, const Span& sp, dc_u64 seq) {
  using L = Ll128<M::kUnit>;
  constexpr dc_u64 kGroup = 4 * kLl128Unroll;  // lines a warp moves per step
  const dc_u64 nlines = (sp.len + L::kBytes - 1) / L::kBytes;
  dc_u64* lines = ll128_lines(a, static_cast<char*>(get_nvlink_address(a.w, s.peer)), a.w.rank,
                              seq, sp.begin / L::kBytes);
  const dc_u32 lane = g.thread_rank() & 31u, l = lane & 7u;
  const dc_u64 warps = g.size() / 32, first = g.thread_rank() / 32 * 4 + lane / 8;
  // Line j of step `base` for group u: the warps take consecutive quads of lines, so every warp
  // has work even when the span is short.
  for (dc_u64 base = 0; base < nlines; base += warps * kGroup) {
    dc_u64 v[kLl128Unroll][2];
#pragma unroll
    for (int u = 0; u < kLl128Unroll; ++u) {
      const dc_u64 j = base + u * warps * 4 + first;
      if (j < nlines) ll128_pack(m, sp.begin, sp.len, j * L::kBytes, l, v[u]);
      if (l == 7) v[u][1] = seq;
    }
    __syncwarp();  // the eight stores of a line leave in one instruction
#pragma unroll
    for (int u = 0; u < kLl128Unroll; ++u) {
      const dc_u64 j = base + u * warps * 4 + first;
      if (j < nlines) ll128_store(lines + j * 16 + 2 * l, v[u][0], v[u][1]);
    }
  }
}

// LL128 receive of span `sp` by the warps of `g`; false on timeout, abort or a call that does
// not match the sender's (agree.cuh: lane 0 of each warp polls the descriptor with the first
// lines and no lane unpacks a line before it matched).
template <class G, class M>
__device__ __forceinline__ bool ll128_recv_span(const G& g, const P2PLaunch& a, const P2PSide& r,
                                                const M& m, const Span& sp, dc_u64 seq,
                                                AgreeRecv& ag) {
  using L = Ll128<M::kUnit>;
  constexpr dc_u64 kGroup = 4 * kLl128Unroll;
  const dc_u64 nlines = (sp.len + L::kBytes - 1) / L::kBytes;
  const dc_u64* lines = ll128_lines(a, reinterpret_cast<char*>(a.w.data), r.peer, seq,
                                    sp.begin / L::kBytes);
  const dc_u32 lane = g.thread_rank() & 31u, l = lane & 7u;
  const dc_u64 warps = g.size() / 32, first = g.thread_rank() / 32 * 4 + lane / 8;
  DeviceErrorState* err = error_state(a.w);
  PollClock clock;
  for (dc_u64 base = 0; base < nlines; base += warps * kGroup) {  // as in ll128_send_span
    dc_u64 v[kLl128Unroll][2];
    // Every lane reloads its part of the group's lines until each line's flag lane saw this
    // call in the same load instruction as the rest of its line.
    for (;;) {
      // The eight loads of a line leave in one instruction: a lane that diverged before (a
      // traced block's thread 0 records events alone) could read its words of an older line.
      __syncwarp();
      bool ready = true;
      dc_u64 stale = seq;
      const dc_u64 d = ag.agreed ? 0 : ld_relaxed_sys(ag.desc);
#pragma unroll
      for (int u = 0; u < kLl128Unroll; ++u) {
        const dc_u64 j = base + u * warps * 4 + first;
        if (j < nlines) {
          ll128_load(lines + j * 16 + 2 * l, v[u][0], v[u][1]);
          if (l == 7 && v[u][1] != seq) {
            if (ready) stale = v[u][1];
            ready = false;
          }
        }
      }
      if (!ag.agreed) {  // every lane looks at lane 0's load; lane 0 records a mismatch
        const bool same = ag.look(a, __shfl_sync(0xffffffffu, d, 0), lane == 0);
        if (!same) return false;
      }
      const dc_u32 waiting = __ballot_sync(0xffffffffu, !ready || !ag.agreed);
      if (waiting == 0) break;
      const int first = __ffs(waiting) - 1;
      stale = __shfl_sync(0xffffffffu, stale, first);
      int stop = 0;
      if (lane == 0) {
        stop = !clock.tick(a, err, r.peer, sp.begin / L::kBytes + base, seq, stale);
      }
      if (__shfl_sync(0xffffffffu, stop, 0)) return false;
    }
#pragma unroll
    for (int u = 0; u < kLl128Unroll; ++u) {
      const dc_u64 j = base + u * warps * 4 + first;
      if (j < nlines) ll128_unpack(m, sp.begin, sp.len, j * L::kBytes, l, v[u]);
    }
  }
  return true;
}

#endif  // __CUDACC__

}  // namespace p2p
}  // namespace devcomm
