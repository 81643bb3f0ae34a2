// The reduction kernels (docs/COLLECTIVES.md, "Reductions"): one-shot over flag-in-data lines
// and the two-shot (pipelined in rounds) through the reduce window. The JIT appends the
// instantiations (element type, operation, epilogue hook) after this text.
#include "devcomm/reduce.cuh"
#include "devcomm/ll128.cuh"

namespace devcomm {
namespace red {

// Where the two-shot's blocks write to (or read from) every rank in turn, rank me starts with
// rank me + 1, so that at each step every rank talks to another rank instead of all of them to
// rank 0, then rank 1, ... (each link busy instead of one link for all). 4 H200s, bf16
// all-reduce: 4 MiB 48.3 -> 39.2 us, 16 MiB 148.8 -> 113.3 (with the push below;
// docs/PERFORMANCE.md). The one-shot keeps rank order: staggering its line stores made it
// slower (reduce-scatter 1 MiB 17.2 -> 19.9 us).
// The rank of step i (0 <= i < world) of a two-shot loop over every rank.
__device__ __forceinline__ int turn(int i, int me, int world) {
  return (me + 1 + i) % world;
}

// Elements of shard q that exist (all-reduce: the last shards may be short or empty).
__device__ __forceinline__ dc_u64 shard_len(const ReduceLaunch& a, int q) {
  const dc_u64 first = (dc_u64)q * a.shard;
  if (first >= a.total) return 0;
  return a.total - first < a.shard ? a.total - first : a.shard;
}

// ---- One-shot on LL128 lines --------------------------------------------------------------
//
// Call seq (per-block counters, equal in every block) uses line parity seq & 1. Every rank
// writes its payload into every peer's window (the region of this sender) as 128-byte lines
// (ll128.cuh's format: payload words 0-14, the call's sequence number in word 15, each line
// moved by 8 lanes with one 16-byte access each: 128 bytes on the wire per 120 of payload),
// then reads every rank's lines in rank order (its own data from its input) and reduces them.
// Line i of a sender's payload holds its 8-byte words 15 i .. 15 i + 14. Block b owns lines
// [l0, l1) of every sender; a warp takes 4 lines at a time (lanes 8 j .. 8 j + 7: line j of
// the 4) and polls until all 4 have come, so that its lanes stay together around the shuffles.
// Before writing parity seq & 1 a block waits until every receiver block has released call
// seq - 2 (kFree, any block may have read any line then); after reading it releases the lines
// of call seq in every sender. The call agreement (reduce.cuh): announced first; each warp
// with lines checks every peer's announcement (local loads: peers push it) before it writes
// any output. (16-byte lines carrying 8 bytes each, the first form, were slower from 128 KiB:
// docs/PERFORMANCE.md, "LL128 lines for the one-shot".)

// Whether every live line of the warp's 4 (this lane's: `line`, 8 lanes a line) carries `seq`,
// polled until it does; v0, v1: this lane's two words. Warp-collective (every lane calls it
// with the same peer); false on every lane on a timeout (recorded once) or an abort. The loop's
// control flow is warp-uniform (the clock is lane 0's, shuffled), so that the eight loads of a
// line leave in one instruction: a lane that ran apart could read its words of an older line.
__device__ inline bool ll128_warp_wait(const DeviceWindow& w, const dc_u64* line, bool live,
                                       dc_u64 seq, int peer, dc_u64 index, dc_u64& v0,
                                       dc_u64& v1) {
  const dc_u32 lane = linear_thread_index() & 31u;
  const dc_u32 flag_lane = lane | 7u;
  DeviceErrorState* err = error_state(w);
  dc_u64 start = 0, next_abort = 0;
  v0 = v1 = 0;
  for (dc_u32 polls = 1;; ++polls) {
    __syncwarp();
    if (live) p2p::ll128_load(line, v0, v1);
    const dc_u64 flag = __shfl_sync(0xffffffffu, v1, (int)flag_lane);
    const bool ready = !live || flag == seq;
    if (__all_sync(0xffffffffu, ready)) return true;
    if (polls % kAbortCheckPolls != 0) continue;
    const dc_u64 now = __shfl_sync(0xffffffffu, globaltimer_ns(), 0);
    if (start == 0) {
      start = now;
      next_abort = now + kAbortCheckNs;
    }
    bool stop = false;
    if (now >= next_abort) {
      stop = abort_raised(err);
      next_abort = now + kAbortCheckNs;
    }
    if (now - start >= w.timeout_ns) {
      // The lowest lane of the first line that has not come records it.
      const unsigned waiting = __ballot_sync(0xffffffffu, !ready);
      if (waiting != 0 && lane == (dc_u32)(__ffs(waiting) - 1)) {
        record_wait_failure(err, w.rank, WaitSite{kOpRecvSlotFull, peer, index}, seq, flag,
                            now - start);
      }
      stop = true;
    }
    if (__any_sync(0xffffffffu, stop)) return false;
  }
}

// LL128 lines of `bytes` of payload (15 words of 8 bytes a line).
__device__ __forceinline__ dc_u64 lines_of(dc_u64 bytes) {
  constexpr dc_u64 kWords = p2p::Ll128<8>::kWords;
  return ((bytes + 7) / 8 + kWords - 1) / kWords;
}

// Calls f(o, n, k) for word k (0, 1) of lane l's share of line i (words 2 l and 2 l + 1) of a
// `payload`-byte span: o its byte offset, n its bytes (ll128.cuh's lane units of 8 bytes; the
// flag word and words past the payload are skipped).
template <class F>
__device__ __forceinline__ void line_words(dc_u64 i, dc_u32 l, dc_u64 payload, F f) {
  p2p::ll128_lane_units<8>(i * p2p::Ll128<8>::kBytes, payload, l, f);
}

// Calls the hook on the n / row_len rows at `rows` (in the window), one row group of
// RowThreads<H> threads per row (reduce.cuh, "Epilogue hooks"): the block's groups take the
// rows in turn. `dest` is where the first of them will be written in this rank's output, `row0`
// its row index there; `user`, `row_len`, `rank` and `world` as the hook's RowCtx carries them.
// Every caller passes its whole block (kThreads threads; a Block, nothing narrower), so that a
// row has the same shape, and its row_sum the same order, on every algorithm.
template <class H, class T>
__device__ __forceinline__ void epilogue_rows_at(const Block& g, dc_u64 user, dc_u64 row_len,
                                                 int rank, int world, T* rows, T* dest,
                                                 dc_u64 row0, dc_u64 n) {
  constexpr dc_u32 kLanes = RowThreads<H>::value;
  const dc_u32 group = g.thread_rank() / kLanes, groups = g.size() / kLanes;
  for (dc_u64 r = group; r < n / row_len; r += groups) {
    RowCtx c{reinterpret_cast<const void*>(user), row0 + r, row_len, rank, world,
             g.thread_rank() % kLanes, kLanes, dest + r * row_len};
    H::epilogue(c, reinterpret_cast<typename H::T*>(rows + r * row_len));
  }
}

template <class H, class T>
__device__ __forceinline__ void epilogue_rows(const Block& g, const ReduceLaunch& a, T* rows,
                                              T* dest, dc_u64 row0, dc_u64 n) {
  epilogue_rows_at<H>(g, a.user, a.row_len, a.w.rank, a.w.world_size, rows, dest, row0, n);
}

// Pick<c, A, B>::type: A when c, else B.
template <bool C, class A, class B> struct Pick { using type = A; };
template <class A, class B> struct Pick<false, A, B> { using type = B; };

// Where each line's words lie in a payload (the `words(i, l, f)` of line_words):
// PlainLines, the payload's bytes in turn (line i: bytes 120 i .. 120 i + 119); RowLines (the
// hooked one-shot), every row of `row_bytes` starting a line of its own (`per_row` lines a
// row: line i holds bytes 120 (i % per_row) .. of row i / per_row), so that a block owns whole
// rows and whole lines at once.
struct PlainLines {
  dc_u64 payload;
  template <class F>
  __device__ __forceinline__ void words(dc_u64 i, dc_u32 l, F f) const {
    line_words(i, l, payload, f);
  }
};

struct RowLines {
  dc_u64 row_bytes;
  dc_u32 per_row;
  template <class F>
  __device__ __forceinline__ void words(dc_u64 i, dc_u32 l, F f) const {
    const dc_u32 r = (dc_u32)i / per_row, j = (dc_u32)i - r * per_row;
    const dc_u64 base = (dc_u64)r * row_bytes;
    p2p::ll128_lane_units<8>((dc_u64)j * p2p::Ll128<8>::kBytes, row_bytes, l,
                             [&](dc_u64 o, dc_u64 n, dc_u32 k) { f(base + o, n, k); });
  }
};

// The line area of `sender` in the window of rank `owner` (as mapped here) for call seq.
__device__ __forceinline__ dc_u64* line_area(const ReduceLaunch& a, int owner, int sender,
                                             dc_u64 seq) {
  char* base = owner == a.w.rank ? reinterpret_cast<char*>(a.w.data)
                                 : static_cast<char*>(get_nvlink_address(a.w, owner));
  return reinterpret_cast<dc_u64*>(base + a.ll_offset + (dc_u64)sender * 2 * a.ll_sender_bytes +
                                   (seq & 1) * a.ll_sender_bytes);
}

// Group g (whole warps) writes lines [l0, l1) of the payload at src (its words where map `m`
// says) as lines of call seq at dst, 8 lanes a line. Every lane runs every pass (the bounds
// are the group's), so the warp can converge before its stores.
template <class G, class M>
__device__ __forceinline__ void push_lines(const G& g, dc_u64* dst, const unsigned char* src,
                                           const M& m, dc_u64 l0, dc_u64 l1, dc_u64 seq) {
  const dc_u32 l = g.thread_rank() & 7u;
  for (dc_u64 base = l0; base < l1; base += g.size() / 8) {
    const dc_u64 i = base + g.thread_rank() / 8;
    const bool live = i < l1;
    dc_u64 v[2] = {0, 0};
    if (live) {
      m.words(i, l, [&](dc_u64 o, dc_u64 n, dc_u32 k) { v[k] = load8(src + o, n); });
      if (l == 7) v[1] = seq;  // the flag word
    }
    __syncwarp();  // the eight stores of a line leave in one instruction (LL128's guarantee)
    if (live) p2p::ll128_store(dst + i * 16 + 2 * l, v[0], v[1]);
  }
}

// Before writing the lines of call seq (parity seq & 1): every receiver's every block (of the
// kLineMaxBlocks a line call may have) has released call seq - 2 (kFree). False on a timeout
// or abort.
template <class G>
__device__ __forceinline__ bool lines_free(const G& g, const ReduceLaunch& a, dc_u64 seq) {
  const int world = a.w.world_size, me = a.w.rank;
  bool ok = true;
  if (seq > 2) {
    for (dc_u32 k = g.thread_rank(); k < (dc_u32)world * kLineMaxBlocks; k += g.size()) {
      const int q = (int)(k / kLineMaxBlocks);
      if (q != me) {
        ok = ok && wait_slot(a.w, slot_of(kFree, world, q, k % kLineMaxBlocks), seq - 2, q);
      }
    }
  }
  return !g.any(!ok);
}

// The end of a line call: block b releases the lines of call seq in every sender and takes the
// call's sequence and number (block 0 also for the blocks not in the launch: their kFree slots
// with relaxed stores, as they read nothing; every line a later call writes was read by a block
// of this launch, which released it, and a writer waits on every slot).
template <class G>
__device__ __forceinline__ void lines_release(const G& g, const ReduceLaunch& a, dc_u32 b,
                                              dc_u64 seq, const Agree& ag) {
  const int world = a.w.world_size, me = a.w.rank;
  dc_u64* counters = reinterpret_cast<dc_u64*>(a.counters);
  for (dc_u32 k = g.thread_rank(); k < (dc_u32)world * kMaxBlocks; k += g.size()) {
    const int p = (int)(k / kMaxBlocks);
    const dc_u32 i = k % kMaxBlocks;
    if (i == b || (b == 0 && i >= a.blocks)) {
      agree_refresh(a, ag, b, p, i);
      if (p != me && i < kLineMaxBlocks) {
        dc_u64* slot = peer_user_slot(a.w, p, slot_of(kFree, world, me, i));
        if (i == b) {
          st_release_sys(slot, seq);
        } else {
          st_relaxed_sys(slot, seq);
        }
      }
      if (p == 0) {
        counters[i] = seq;
        counters[2 * kMaxBlocks + i] = ag.call;
      }
    }
  }
}

// A lane's share of one line in the reduce loops: its two words' offsets and bytes in the
// payload (line_words; n = 0: no word there), and the accumulators of their elements.
template <class T>
struct LaneLine {
  static constexpr int kE = (int)(8 / sizeof(T));
  dc_u64 at[2], n[2];
  typename Num<T>::Acc acc[2][kE];

  template <class M>
  __device__ __forceinline__ LaneLine(dc_u64 i, const M& map) {
    at[0] = at[1] = n[0] = n[1] = 0;
    map.words(i, linear_thread_index() & 7u, [&](dc_u64 o, dc_u64 m, dc_u32 k) {
      at[k] = o;
      n[k] = m;
    });
  }

  // Folds rank p's words (ranks in order from 0).
  template <int OP>
  __device__ __forceinline__ void add(int p, const dc_u64 (&x)[2]) {
#pragma unroll
    for (dc_u32 k = 0; k < 2; ++k) {
      Word<T> w;
      w.u = x[k];
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        acc[k][e] = p == 0 ? Num<T>::load(w.v[e]) : combine<OP, T>(acc[k][e], Num<T>::load(w.v[e]));
      }
    }
  }

  // Word k of the result over `world` ranks.
  template <int OP>
  __device__ __forceinline__ dc_u64 result(dc_u32 k, int world) const {
    Word<T> r;
#pragma unroll
    for (int e = 0; e < kE; ++e) r.v[e] = finish<OP, T>(acc[k][e], world);
    return r.u;
  }
};

// Warp-collective: hands every rank's words of this lane's line (i, `live`) to f(p, x) in rank
// order: this rank's from `mine`, each peer's from its lines of call seq in this window
// (`base` lines into its area). False on every lane on a timeout or abort.
template <class T, class F>
__device__ __forceinline__ bool each_rank_line(const ReduceLaunch& a, dc_u64 seq, dc_u64 base,
                                               dc_u64 i, bool live, const LaneLine<T>& ln,
                                               const unsigned char* mine, F f) {
  const int world = a.w.world_size, me = a.w.rank;
  const dc_u32 l = linear_thread_index() & 7u;
  for (int p = 0; p < world; ++p) {
    dc_u64 x[2] = {0, 0};
    if (p == me) {
#pragma unroll
      for (dc_u32 k = 0; k < 2; ++k) {
        if (live && ln.n[k] > 0) x[k] = load8(mine + ln.at[k], ln.n[k]);
      }
    } else if (!ll128_warp_wait(a.w, line_area(a, me, p, seq) + (base + i) * 16 + 2 * l, live,
                                seq, p, base + i, x[0], x[1])) {
      return false;
    }
    f(p, x);
  }
  return true;
}

// The epilogue (H, hooked all-reduce and reduce-scatter): every row starts a line of its own
// (RowLines), block b pushes and reduces whole rows [r0, r1) of the payload, reduces them into
// its own window (this rank's own line area, which no peer writes), runs the hook on them (a
// row group per row; RowCtx::dest is the row in the output, still as it was), then copies them
// into the output. In place, a block overwrites only rows it has pushed itself. Every rank runs
// the hook on every row.
template <class T, int OP, class H>
__global__ void __launch_bounds__(kThreads) one_shot_kernel(ReduceLaunch a) {
  enter_after_previous_kernel();
  constexpr bool kHooked = HasEpilogue<H>::value;
  using Map = typename Pick<kHooked, RowLines, PlainLines>::type;
  const Block g;
  const dc_u32 b = blockIdx.x;
  const int world = a.w.world_size, me = a.w.rank;
  const dc_u64 seq = reinterpret_cast<const dc_u64*>(a.counters)[b] + 1;
  DC_TRACE_KERNEL_BEGIN();
  const Agree ag = agree_begin(a, b, sizeof(T), kHooked);
  agree_announce(g, a, b, ag);
  const dc_u64 payload = a.shard * sizeof(T);  // bytes each rank sends each peer
  dc_u64 l0, l1, r0 = 0, r1 = 0;
  Map map;
  if constexpr (kHooked) {
    static_assert(sizeof(typename H::T) == sizeof(T), "the hook's T is not the element type");
    map = RowLines{a.row_len * sizeof(T), (dc_u32)lines_of(a.row_len * sizeof(T))};
    block_piece(a.shard / a.row_len, a.blocks, 1, b, r0, r1);
    l0 = r0 * map.per_row;
    l1 = r1 * map.per_row;
  } else {
    map = PlainLines{payload};
    block_piece(lines_of(payload), a.blocks, 1, b, l0, l1);
  }
  if (!lines_free(g, a, seq)) return;
  DC_TRACE_PHASE_BEGIN(kPhaseStage, -1);
  const unsigned char* in = reinterpret_cast<const unsigned char*>(a.in);
  for (int q = 0; q < world; ++q) {
    if (q == me) continue;
    const unsigned char* src = in + (a.mode == kReduceScatter ? (dc_u64)q * payload : 0);
    push_lines(g, line_area(a, q, me, seq), src, map, l0, l1, seq);
  }
  DC_TRACE_PHASE_END(kPhaseStage, -1, (world - 1) * 128 * (l1 - l0));
  DC_TRACE_PHASE_BEGIN(kPhaseReduce, -1);
  unsigned char* out = reinterpret_cast<unsigned char*>(a.out);
  // Hooked: the reduced rows go to the own line area first.
  unsigned char* to = kHooked ? reinterpret_cast<unsigned char*>(line_area(a, me, me, seq)) : out;
  const unsigned char* mine = in + (a.mode == kReduceScatter ? (dc_u64)me * payload : 0);
  const dc_u32 warp = g.thread_rank() / 32, warps = g.size() / 32;
  bool ok = true;
  // Warp-uniform from here: the first line of the warp's 4 decides.
  if (l0 + 4 * warp < l1) ok = agree_all(Warp{}, a, b, ag);
  for (dc_u64 first = l0 + 4 * warp; ok && first < l1; first += 4 * (dc_u64)warps) {
    const dc_u64 i = first + (g.thread_rank() & 31u) / 8;
    const bool live = i < l1;
    LaneLine<T> ln(i, map);
    ok = each_rank_line(a, seq, 0, i, live, ln, mine, [&](int p, const dc_u64 (&x)[2]) {
      if (a.mode != kAllGather) {
        ln.template add<OP>(p, x);
        return;
      }
      for (dc_u32 k = 0; k < 2; ++k) {
        if (live && ln.n[k] > 0) store8(out + (dc_u64)p * payload + ln.at[k], x[k], ln.n[k]);
      }
    });
    if (!ok || !live || a.mode == kAllGather) continue;
#pragma unroll
    for (dc_u32 k = 0; k < 2; ++k) {
      if (ln.n[k] > 0) store8(to + ln.at[k], ln.template result<OP>(k, world), ln.n[k]);
    }
  }
  if (g.any(!ok)) return;  // barrier: every line of this block has been read
  DC_TRACE_PHASE_END(kPhaseReduce, -1, 120 * (l1 - l0));
  lines_release(g, a, b, seq, ag);
  if constexpr (kHooked) {
    // The block's rows are in `to` (the barrier above); nothing but this block touches them.
    DC_TRACE_PHASE_BEGIN(kPhaseWriteOut, -1);
    T* rows = reinterpret_cast<T*>(to) + r0 * a.row_len;
    T* dest = reinterpret_cast<T*>(out) + r0 * a.row_len;
    const dc_u64 n = (r1 - r0) * a.row_len;
    epilogue_rows<H>(g, a, rows, dest, r0, n);
    g.sync();
    if (n > 0) copy_elems<T>(g, dest, rows, n);
    DC_TRACE_PHASE_END(kPhaseWriteOut, -1, n * sizeof(T));
  }
  DC_TRACE_KERNEL_END((world - 1) * 128 * (l1 - l0));
}

// ---- Two-shot all-reduce on LL128 lines -----------------------------------------------------
//
// Shard q is elements [q S, (q + 1) S) (S = a.shard). Every rank sends shard q of its input to
// rank q as lines (the first `span` lines of its area there, span = the lines of a whole
// shard); rank q reduces its shard in rank order, writes it to its output and sends it to every
// peer as lines (lines span.. of its area there); every rank copies the peers' reduced shards
// from its window into its output. Each rank sends and receives 2 (W - 1) / W of the buffer
// instead of the one-shot's W - 1 times it, with no signal but the lines' flags. Blocks own the
// same lines [l0, l1) of every shard; the lines' sequence, parity, kFree and agreement are the
// one-shot's (both may follow each other in any order).
template <class T, int OP>
__global__ void __launch_bounds__(kThreads) line_two_shot_kernel(ReduceLaunch a) {
  enter_after_previous_kernel();
  const Block g;
  const dc_u32 b = blockIdx.x;
  const int world = a.w.world_size, me = a.w.rank;
  const dc_u64 seq = reinterpret_cast<const dc_u64*>(a.counters)[b] + 1;
  DC_TRACE_KERNEL_BEGIN();
  const Agree ag = agree_begin(a, b, sizeof(T), false);
  agree_announce(g, a, b, ag);
  constexpr dc_u64 es = sizeof(T);
  const dc_u64 span = lines_of(a.shard * es);
  dc_u64 l0, l1;
  block_piece(span, a.blocks, 1, b, l0, l1);
  auto bytes_of = [&](int q) -> dc_u64 { return shard_len(a, q) * es; };
  auto start_of = [&](int q) -> dc_u64 { return (dc_u64)q * a.shard * es; };
  auto end_of = [&](int q) -> dc_u64 {  // the block's lines of shard q end here
    const dc_u64 n = lines_of(bytes_of(q));
    return l1 < n ? l1 : n;
  };
  if (!lines_free(g, a, seq)) return;
  // 1. This rank's data of shard q into rank q's window.
  DC_TRACE_PHASE_BEGIN(kPhaseStage, -1);
  const unsigned char* in = reinterpret_cast<const unsigned char*>(a.in);
  for (int t = 0; t < world; ++t) {
    const int q = turn(t, me, world);
    if (q != me) {
      push_lines(g, line_area(a, q, me, seq), in + start_of(q), PlainLines{bytes_of(q)}, l0,
                 end_of(q), seq);
    }
  }
  DC_TRACE_PHASE_END(kPhaseStage, -1, (world - 1) * 128 * (l1 - l0));
  g.sync();  // in place: the block's reads of the other shards' input end before it writes them
  // 2. Reduce shard `me` in rank order, write it out and send it to every peer.
  DC_TRACE_PHASE_BEGIN(kPhaseReduce, -1);
  unsigned char* out = reinterpret_cast<unsigned char*>(a.out);
  const dc_u32 l = g.thread_rank() & 7u;
  const dc_u32 warp = g.thread_rank() / 32, warps = g.size() / 32;
  const dc_u64 mine = bytes_of(me), mine_end = end_of(me);
  bool ok = true;
  if (l0 + 4 * warp < l1) ok = agree_all(Warp{}, a, b, ag);
  for (dc_u64 first = l0 + 4 * warp; ok && first < l1; first += 4 * (dc_u64)warps) {
    const dc_u64 i = first + (g.thread_rank() & 31u) / 8;
    const bool live = i < mine_end;
    LaneLine<T> ln(i, PlainLines{mine});
    ok = each_rank_line(a, seq, 0, i, live, ln, in + start_of(me),
                        [&](int p, const dc_u64 (&x)[2]) { ln.template add<OP>(p, x); });
    if (!ok) continue;  // warp-uniform: every lane stays for the stores below
    dc_u64 v[2] = {0, 0};
    if (live) {
#pragma unroll
      for (dc_u32 k = 0; k < 2; ++k) {
        const dc_u64 r = ln.template result<OP>(k, world);
        if (ln.n[k] > 0) store8(out + start_of(me) + ln.at[k], r, ln.n[k]);
        v[k] = ln.n[k] > 0 ? r : 0;
      }
      if (l == 7) v[1] = seq;  // the flag word
    }
    for (int t = 0; t < world; ++t) {
      const int q = turn(t, me, world);
      __syncwarp();  // the eight stores of a line leave in one instruction (LL128's guarantee)
      if (q != me && live) {
        p2p::ll128_store(line_area(a, q, me, seq) + (span + i) * 16 + 2 * l, v[0], v[1]);
      }
    }
  }
  DC_TRACE_PHASE_END(kPhaseReduce, -1, 120 * (l1 - l0));
  // 3. The peers' reduced shards from this window into the output.
  DC_TRACE_PHASE_BEGIN(kPhaseWriteOut, -1);
  for (int t = 0; ok && t < world; ++t) {
    const int p = turn(t, me, world);
    if (p == me) continue;
    const dc_u64 bytes = bytes_of(p), end = end_of(p);
    for (dc_u64 first = l0 + 4 * warp; ok && first < l1; first += 4 * (dc_u64)warps) {
      const dc_u64 i = first + (g.thread_rank() & 31u) / 8;
      const bool live = i < end;
      Word<T> x[2];
      ok = ll128_warp_wait(a.w, line_area(a, me, p, seq) + (span + i) * 16 + 2 * l, live, seq, p,
                           span + i, x[0].u, x[1].u);
      if (!ok || !live) continue;
      line_words(i, l, bytes, [&](dc_u64 o, dc_u64 n, dc_u32 k) {
        store8(out + start_of(p) + o, x[k].u, n);
      });
    }
  }
  DC_TRACE_PHASE_END(kPhaseWriteOut, -1, 120 * (l1 - l0) * (world - 1));
  if (g.any(!ok)) return;  // barrier: every line of this block has been read
  lines_release(g, a, b, seq, ag);
  DC_TRACE_KERNEL_END(2 * (world - 1) * 128 * (l1 - l0));
}

// ---- Two-shot, in rounds -------------------------------------------------------------------
//
// Round k (sequence s = first + k, the same in every block) uses half s & 1 of the two-shot
// area, which holds `world` shard slots of `chunk` elements. Element j of shard q's round lies
// at index q * shard + k * chunk + j of the whole buffer. Block b owns piece [lo, hi) of the
// round (the same in every shard and on every rank):
//   1. wait until every rank's every block is done with round s - 2 (kDone; the half is then
//      free), stage this rank's data of the piece (all-gather: its own shard only), publish
//      kReady (all-gather: kReduced);
//   2. (all-reduce, reduce-scatter) wait for kReady of block b of every rank, reduce shard
//      `me` from every rank's data in rank order; all-reduce: write the result into the
//      own window (then the epilogue hook, a row group per row) and publish kReduced;
//      reduce-scatter: write the output and publish kDone;
//   3. (all-reduce, all-gather) wait for kReduced of block b of every rank, copy every rank's
//      reduced shard piece into the output, publish kDone.
// The call agreement (reduce.cuh): announced first; checked by the block after the first
// round's staging, before it reads a peer's window or writes the output.
// The pushed form (an all-reduce's Plan::pushed, kTwoShotPushed) changes three things: block b
// takes span b of every round (waits from a call's third round on block b of every rank
// only); it stages round k + 1 right after reducing round k; and step 2 writes the reduced
// piece, in the same pass, into the output and into result slot `me` of every peer's window
// (a half holds `world` result slots after its `world` staging slots, so a round holds half
// the elements) and publishes kPushed; step 3 then copies every peer's piece from the own
// window's result slots once every peer published kPushed. NVLink then carries stores only:
// mixing the pulls of step 3 with the next round's stores was slower (docs/PERFORMANCE.md,
// "The staged two-shot: 64 blocks, pushed results").
// Blocks beyond this launch's count read nothing: block 0 advances their counters and kDone
// slots at the end, and waits on them only ask for what a previous call left.
//
// Step 1 pushes this rank's data of shard q into rank q's window (shard slot `me` there), so
// that step 2 reduces from its own window with local loads (NVLink stores need no round trip;
// remote loads do: docs/PERFORMANCE.md, "Two-shot: push"). The reduced shard goes into the own
// slot, where step 3 reads it. Pushing before the call agreement writes only peers' two-shot
// areas, never their outputs: a mismatched call is refused on every rank before anything is
// read from them.

// Waits (block) until every rank's every block has published kDone >= target, where blocks
// not in this launch only need to have reached `before` (what the previous call left).
template <class G>
__device__ __forceinline__ bool wait_all_done(const G& g, const ReduceLaunch& a, dc_u64 target,
                                              dc_u64 before) {
  bool ok = true;
  const int world = a.w.world_size;
  for (dc_u32 k = g.thread_rank(); k < (dc_u32)world * kMaxBlocks; k += g.size()) {
    const dc_u32 i = k % kMaxBlocks;
    const dc_u64 t = i < a.blocks ? target : (target < before ? target : before);
    if (t > 0) ok = ok && wait_slot(a.w, slot_of(kDone, world, (int)(k / kMaxBlocks), i), t, (int)(k / kMaxBlocks));
  }
  return !g.any(!ok);
}

// Publishes `value` in slot (kind, me, b) of every rank's pad (itself included), after the
// block's writes: g.sync, then each publishing thread fences and releases.
template <class G>
__device__ __forceinline__ void publish(const G& g, const ReduceLaunch& a, Slot kind, dc_u32 b,
                                        dc_u64 value) {
  g.sync();
  const int world = a.w.world_size;
  for (dc_u32 p = g.thread_rank(); p < (dc_u32)world; p += g.size()) {
    fence_acq_rel_sys();
    st_release_sys(peer_user_slot(a.w, (int)p, slot_of(kind, world, a.w.rank, b)), value);
  }
}

// Waits (block) for slot (kind, p, b) >= value of every rank p.
template <class G>
__device__ __forceinline__ bool wait_every_rank(const G& g, const ReduceLaunch& a, Slot kind,
                                                dc_u32 b, dc_u64 value) {
  bool ok = true;
  const int world = a.w.world_size;
  for (dc_u32 p = g.thread_rank(); p < (dc_u32)world; p += g.size()) {
    ok = ok && wait_slot(a.w, slot_of(kind, world, (int)p, b), value, (int)p);
  }
  return !g.any(!ok);
}

// [lo, hi) clipped to shard q's elements of round k: the count from lo (0 if none).
__device__ __forceinline__ dc_u64 clip(const ReduceLaunch& a, int q, dc_u64 k, dc_u64 lo,
                                       dc_u64 hi) {
  const dc_u64 len = shard_len(a, q), at = k * a.chunk;
  if (at + lo >= len) return 0;
  const dc_u64 end = at + hi < len ? at + hi : len;
  return end - (at + lo);
}

template <class T, int OP, class H>
__global__ void __launch_bounds__(kThreads) two_shot_kernel(ReduceLaunch a) {
  enter_after_previous_kernel();
  const Block g;
  const dc_u32 b = blockIdx.x;
  const int world = a.w.world_size, me = a.w.rank;
  dc_u64* counters = reinterpret_cast<dc_u64*>(a.counters) + kMaxBlocks;
  const dc_u64 before = counters[b];
  // The pushed form (kTwoShotPushed, all-reduce): own pieces, overlap, pushed results.
  const bool pushed = (a.flags & kTwoShotPushed) != 0 && a.mode == kAllReduce;
  DC_TRACE_KERNEL_BEGIN();
  const Agree ag = agree_begin(a, b, sizeof(T), HasEpilogue<H>::value);
  agree_announce(g, a, b, ag);
  const T* in = reinterpret_cast<const T*>(a.in);
  T* out = reinterpret_cast<T*>(a.out);
  // Block b's piece [lo, hi) of round k: pushed, the same span of every round (the last
  // round's tail is cut by clip), so that block b only ever touches span b of a half and
  // needs only its own peers' blocks to be done with a half; otherwise round k's elements
  // split over the blocks.
  auto piece = [&](dc_u64 k, dc_u64& lo, dc_u64& hi) {
    const dc_u64 m = a.shard - k * a.chunk < a.chunk ? a.shard - k * a.chunk : a.chunk;
    block_piece(pushed ? a.chunk : m, a.blocks, a.unit, b, lo, hi);
  };
  // The window of rank p: shard slot q of round s's half.
  auto slot = [&](dc_u64 s, int p, int q) {
    return reinterpret_cast<T*>(static_cast<char*>(get_nvlink_address(a.w, p)) + a.pipe_offset +
                                (s & 1) * a.half_bytes) +
           (dc_u64)q * a.chunk;
  };
  // Pushed: the result slot of shard q in rank p's half, after the `world` staging slots.
  auto result = [&](dc_u64 s, int p, int q) { return slot(s, p, world + q); };
  // Before round k writes its half: every rank is done with round k - 2 there (the first two
  // rounds of a call: every block, for the blocks of the call before may have had other
  // pieces; later ones, pushed: block b of every rank).
  auto half_free = [&](dc_u64 k) -> bool {
    const dc_u64 s = before + k + 1;
    if (pushed && k >= 2) return wait_every_rank(g, a, kDone, b, s - 2);
    return wait_all_done(g, a, s >= 2 ? s - 2 : 0, before);
  };
  // 1. Stage round k: this rank's data into rank q's window, the slot of this rank; publish
  // kReady (all-gather: kReduced).
  auto stage = [&](dc_u64 k) -> bool {
    const dc_u64 s = before + k + 1;
    dc_u64 lo, hi;
    piece(k, lo, hi);
    DC_TRACE_WAIT_BEGIN(-1, (dc_u32)s);
    if (!half_free(k)) return false;
    DC_TRACE_WAIT_END(-1, (dc_u32)s);
    DC_TRACE_PHASE_BEGIN(kPhaseStage, -1);
    for (int i = 0; i < world; ++i) {
      const int q = turn(i, me, world);
      if (a.mode == kAllGather && q != me) continue;
      const dc_u64 n = clip(a, q, k, lo, hi);
      const T* src = a.mode == kAllGather ? in + k * a.chunk + lo
                                          : in + (dc_u64)q * a.shard + k * a.chunk + lo;
      if (n > 0) copy_elems<T>(g, slot(s, q, me) + lo, src, n);
    }
    DC_TRACE_PHASE_END(kPhaseStage, -1, (hi - lo) * sizeof(T) * (a.mode == kAllGather ? 1 : world));
    publish(g, a, a.mode == kAllGather ? kReduced : kReady, b, s);
    return true;
  };
  // 2. (all-reduce, reduce-scatter) Reduce this rank's shard of round k from every rank's
  // data in rank order: all-reduce into the own window (then the epilogue hook, a row group
  // per row), publish kReduced; reduce-scatter into the output, publish kDone.
  auto reduce = [&](dc_u64 k) -> bool {
    const dc_u64 s = before + k + 1;
    dc_u64 lo, hi;
    piece(k, lo, hi);
    DC_TRACE_WAIT_BEGIN(-1, (dc_u32)s);
    if (!wait_every_rank(g, a, kReady, b, s)) return false;
    DC_TRACE_WAIT_END(-1, (dc_u32)s);
    DC_TRACE_PHASE_BEGIN(kPhaseReduce, -1);
    const dc_u64 n = clip(a, me, k, lo, hi);
    // Where the reduced piece goes first: the own window (all-reduce: peers read it there;
    // hooked reduce-scatter: the hook rewrites it there), or straight to the output.
    // Pushed: the own result slot when hooked, else straight to the output and into result
    // slot `me` of every peer's window in the same pass.
    constexpr bool kHooked = HasEpilogue<H>::value;
    T* const to_out = out + (a.mode == kAllReduce ? (dc_u64)me * a.shard : 0) + k * a.chunk + lo;
    T* dst = pushed ? (kHooked ? result(s, me, me) + lo : to_out)
                    : (a.mode == kAllReduce || kHooked ? slot(s, me, me) + lo : to_out);
    // Rank p's data of this shard: pushed into the own window (slot p).
    auto part = [&](int p) -> const T* { return slot(s, me, p) + lo; };
    // Destination i of the pushed pass: dst first (a reduce_wide without 16-byte alignment
    // reduces into it and copies from it), then the peers from me + 1 on.
    auto pushed_to = [&](int i) -> T* {
      return i == 0 ? dst : result(s, turn(i - 1, me, world), me) + lo;
    };
    if (n > 0) {
      if (pushed && !kHooked) {
        reduce_wide<T, OP>(g, part, world, pushed_to, world, n);
      } else {
        reduce_elems<T, OP>(g, dst, part, world, n);
      }
    }
    if constexpr (kHooked) {
      static_assert(sizeof(typename H::T) == sizeof(T), "the hook's T is not the element type");
      g.sync();
      epilogue_rows<H>(g, a, dst, to_out, (to_out - out) / a.row_len, n);
      if (a.mode == kReduceScatter || pushed) {
        g.sync();
        if (n > 0) copy_elems<T>(g, to_out, dst, n);
        for (int i = 1; pushed && i < world && n > 0; ++i) copy_elems<T>(g, pushed_to(i), dst, n);
      }
    }
    DC_TRACE_PHASE_END(kPhaseReduce, -1, n * sizeof(T) * world);
    publish(g, a, pushed ? kPushed : a.mode == kAllReduce ? kReduced : kDone, b, s);
    return true;
  };
  // 3. (all-reduce, all-gather) Copy every rank's reduced shard piece of round k into the
  // output; publish kDone. Pushed (all-reduce): every peer's piece from its result slot in
  // the own window, once every peer published kPushed (the own piece is in the output).
  auto gather = [&](dc_u64 k) -> bool {
    const dc_u64 s = before + k + 1;
    dc_u64 lo, hi;
    piece(k, lo, hi);
    DC_TRACE_WAIT_BEGIN(-1, (dc_u32)s);
    if (!wait_every_rank(g, a, pushed ? kPushed : kReduced, b, s)) return false;
    DC_TRACE_WAIT_END(-1, (dc_u32)s);
    DC_TRACE_PHASE_BEGIN(kPhaseWriteOut, -1);
    for (int i = 0; i < world; ++i) {
      const int q = turn(i, me, world);
      if (pushed && q == me) continue;
      const dc_u64 n = clip(a, q, k, lo, hi);
      const T* from = pushed ? result(s, me, q) : slot(s, q, q);
      if (n > 0) copy_elems<T>(g, out + (dc_u64)q * a.shard + k * a.chunk + lo, from + lo, n);
    }
    DC_TRACE_PHASE_END(kPhaseWriteOut, -1, (hi - lo) * sizeof(T) * world);
    publish(g, a, kDone, b, s);
    return true;
  };
  // Round k stages, reduces, then gathers. Pushed, round k + 1 is staged between round
  // k's reduction and its gather, so that this block's stores of the next round cross the
  // links while the peers reduce this one.
  if (a.rounds > 0 && !stage(0)) return;
  if (!agree_all(g, a, b, ag)) return;
  for (dc_u64 k = 0; k < a.rounds; ++k) {
    const bool next = k + 1 < a.rounds;
    if (a.mode != kAllGather && !reduce(k)) return;
    if (pushed && next && !stage(k + 1)) return;
    if (a.mode != kReduceScatter && !gather(k)) return;
    if (!pushed && next && !stage(k + 1)) return;
  }
  // Every thread read counters[b] before the first barrier above; blocks not in this launch
  // read nothing, so their counters and kDone slots may jump to the end of this call.
  g.sync();
  const dc_u64 last = before + a.rounds;
  for (dc_u32 k = g.thread_rank(); k < (dc_u32)world * kMaxBlocks; k += g.size()) {
    const int p = (int)(k / kMaxBlocks);
    const dc_u32 i = k % kMaxBlocks;
    if (i == b || (b == 0 && i >= a.blocks)) agree_refresh(a, ag, b, p, i);
    if (i == b) {
      if (p == 0) counters[i] = last;
      if (p == 0) counters[kMaxBlocks + i] = ag.call;
    } else if (b == 0 && i >= a.blocks) {
      // A block not in the launch read nothing: a relaxed store (a later call's first rounds
      // also wait on the kDone of the blocks that did read, released by them).
      st_relaxed_sys(peer_user_slot(a.w, p, slot_of(kDone, world, me, i)), last);
      if (p == 0) counters[i] = last;
      if (p == 0) counters[kMaxBlocks + i] = ag.call;
    }
  }
  DC_TRACE_KERNEL_END(0);  // the bytes are in the phases' ends
}

// ---- Zero-copy, on pool buffers -------------------------------------------------------------
//
// The input (and for the two-shot and the all-gather the output) lies in the communicator's
// memory pool at the same segment and offset on every rank, so every rank reaches every other
// rank's buffer through its mapping (a.in_peers / a.out_peers) and nothing is staged:
//   1. every block announces the call (agreement word, reduce.cuh) and its layout word
//      (kZcLayout) to every peer, then waits for every peer's block b to have done the same
//      and compares both: the peer has entered the call, so its buffers hold this call's data
//      (the kernels before it on its stream are done) and it is not reading or writing them
//      for an earlier call;
//   2. all-reduce one-shot: block b reduces its piece of the whole buffer reading every rank's
//      input in rank order and writes this rank's output;
//      all-reduce two-shot: block b reduces its piece of shard `me` from every rank's input and
//      writes it into every rank's output (each element of shard q is read and then written by
//      one thread of rank q only, so input and output may be the same buffer);
//      reduce-scatter: block b reduces its piece of shard `me` of every rank's input into this
//      rank's output;
//      all-gather: block b writes its piece of this rank's input into shard `me` of every
//      rank's output;
//   3. block b publishes kZcDone (release: its loads are done and its stores visible) and waits
//      for every peer's block b: no rank leaves the call while a peer may still read its input
//      or write its output.
// Two exchanges of one word per block and peer, against the staged two-shot's three per round
// and the one-shot's flag in every 8 bytes. Hooked (epilogue) calls reduce into the own
// window's two-shot area, run the hook on the rows there (RowCtx::dest is the output as it
// was), then write the rows out.

// Rank p's copy of a pool buffer (the segment base of p as mapped here + offset), as T.
template <class T>
__device__ __forceinline__ T* pool_ptr(dc_u64 table, dc_u64 offset, int p) {
  return reinterpret_cast<T*>(reinterpret_cast<const dc_u64*>(table)[p] + offset);
}

// Whether every peer's block b announced this call with this descriptor and layout (group g,
// peer p by thread p; every thread of g calls it).
template <class G>
__device__ __forceinline__ bool zc_enter(const G& g, const ReduceLaunch& a, dc_u32 b,
                                         const Agree& ag) {
  const int world = a.w.world_size, me = a.w.rank;
  const dc_u64 word = call_word(ag.call, kKindReduceLayout, a.layout);
  for (dc_u32 p = g.thread_rank(); p < (dc_u32)world; p += g.size()) {
    if ((int)p != me) st_relaxed_sys(peer_user_slot(a.w, (int)p, slot_of(kZcLayout, world, me, b)), word);
  }
  agree_announce(g, a, b, ag);
  bool ok = true;
  for (dc_u32 p = g.thread_rank(); p < (dc_u32)world; p += g.size()) {
    if ((int)p == me) continue;
    ok = ok && agree_check(a, b, ag, (int)p) && layout_check(a, b, ag, (int)p);
  }
  return !g.any(!ok);
}

// A hooked call's rows go to the window's two-shot area first, so it is one round of the
// two-shot sequence (two_shot_kernel): half s & 1, once every rank is done with round s - 2,
// and it publishes kDone of round s at its end, so that both kinds of call may follow each
// other in any order.
template <class T, int OP, class H>
__global__ void __launch_bounds__(kThreads) zero_copy_kernel(ReduceLaunch a) {
  enter_after_previous_kernel();
  const Block g;
  const dc_u32 b = blockIdx.x;
  const int world = a.w.world_size, me = a.w.rank;
  dc_u64* counters = reinterpret_cast<dc_u64*>(a.counters);
  constexpr bool kHooked = HasEpilogue<H>::value;
  const dc_u32 algo = a.zc & 3u;
  constexpr bool round = kHooked;
  dc_u64* seq = counters + kMaxBlocks;
  const dc_u64 before = seq[b], s = before + 1;
  DC_TRACE_KERNEL_BEGIN();
  const Agree ag = agree_begin(a, b, sizeof(T), kHooked);
  // Rank p's half of the window's two-shot area for round s.
  auto area = [&](int p) -> char* {
    return static_cast<char*>(get_nvlink_address(a.w, p)) + a.pipe_offset + (s & 1) * a.half_bytes;
  };
  if (round) {
    DC_TRACE_WAIT_BEGIN(-1, (dc_u32)s);
    if (!wait_all_done(g, a, s >= 2 ? s - 2 : 0, before)) return;
    DC_TRACE_WAIT_END(-1, (dc_u32)s);
  }
  const T* in = reinterpret_cast<const T*>(a.in);
  T* out = reinterpret_cast<T*>(a.out);
  // This rank's part: the whole buffer (one-shot), shard `me` (two-shot, reduce-scatter), or
  // its input (all-gather); `at` is where it starts in the whole buffer.
  const bool one_shot = a.mode == kAllReduce && algo == kZcOneShot;
  const bool spread = a.mode == kAllReduce && algo == kZcTwoShot;
  auto part_len = [&](int q) -> dc_u64 {
    return one_shot ? a.total : a.mode == kAllReduce ? shard_len(a, q) : a.count;
  };
  auto part_at = [&](int q) -> dc_u64 {
    return one_shot ? 0 : a.mode == kAllReduce ? (dc_u64)q * a.shard : (dc_u64)q * a.count;
  };
  const dc_u64 at = part_at(me);
  dc_u64 lo, hi;
  block_piece(part_len(me), a.blocks, a.unit, b, lo, hi);
  const dc_u64 n = hi - lo;
  DC_TRACE_WAIT_BEGIN(-1, (dc_u32)ag.call);
  if (!zc_enter(g, a, b, ag)) return;
  DC_TRACE_WAIT_END(-1, (dc_u32)ag.call);
  // Rank q's copy of the output at index i of the whole buffer (spread, all-gather).
  auto out_of = [&](int q) -> T* { return pool_ptr<T>(a.out_peers, a.out_offset, q); };
  DC_TRACE_PHASE_BEGIN(a.mode == kAllGather ? kPhaseWriteOut : kPhaseReduce, -1);
  if (a.mode == kAllGather) {
    for (int i = 0; i < world && n > 0; ++i) {
      T* dst = out_of(turn(i, me, world)) + at + lo;
      if (dst != in + lo) copy_elems<T>(g, dst, in + lo, n);
    }
  } else if (n > 0) {
    // Every rank's input of this piece, in rank order.
    auto src = [&](int p) -> const T* {
      return pool_ptr<T>(a.in_peers, a.in_offset, p) + at + lo;
    };
    // Where the result goes: this rank's output (one-shot, reduce-scatter) or every rank's
    // (two-shot, starting with the next rank so that every link is busy); hooked, first the
    // own window's two-shot area at the piece's place in this rank's part (the plan keeps a
    // part within half the area).
    T* const mine = out + (spread ? at : 0) + lo;
    if constexpr (kHooked) {
      static_assert(sizeof(typename H::T) == sizeof(T), "the hook's T is not the element type");
      T* rows = reinterpret_cast<T*>(area(me)) + lo;
      reduce_wide<T, OP>(g, src, world, [&](int) { return rows; }, 1, n);
      g.sync();
      epilogue_rows<H>(g, a, rows, mine, ((spread ? at : 0) + lo) / a.row_len, n);
      g.sync();
      if (spread) {
        for (int i = 0; i < world; ++i) {
          T* dst = out_of(turn(i, me, world)) + at + lo;
          if (dst != rows) copy_elems<T>(g, dst, rows, n);
        }
      } else {
        copy_elems<T>(g, mine, rows, n);
      }
    } else if (spread) {
      reduce_wide<T, OP>(g, src, world,
                         [&](int i) { return out_of(turn(i, me, world)) + at + lo; }, world, n);
    } else {
      reduce_wide<T, OP>(g, src, world, [&](int) { return mine; }, 1, n);
    }
  }
  DC_TRACE_PHASE_END(a.mode == kAllGather ? kPhaseWriteOut : kPhaseReduce, -1, n * sizeof(T) * world);
  // Done with every rank's buffers; wait until every peer's block b is too.
  publish(g, a, kZcDone, b, ag.call);
  DC_TRACE_WAIT_BEGIN(-1, (dc_u32)ag.call);
  if (!wait_every_rank(g, a, kZcDone, b, ag.call)) return;
  DC_TRACE_WAIT_END(-1, (dc_u32)ag.call);
  if (round) publish(g, a, kDone, b, s);
  // Every thread read the counters before the barriers above; blocks not in this launch take
  // this call's number and round too (the agreement numbers calls per block; a round's kDone
  // of a block that read nothing may jump, by a relaxed store, as in two_shot_kernel).
  g.sync();
  for (dc_u32 k = g.thread_rank(); k < (dc_u32)world * kMaxBlocks; k += g.size()) {
    const int p = (int)(k / kMaxBlocks);
    const dc_u32 i = k % kMaxBlocks;
    if (i != b && !(b == 0 && i >= a.blocks)) continue;
    agree_refresh(a, ag, b, p, i);
    if (round && i != b) st_relaxed_sys(peer_user_slot(a.w, p, slot_of(kDone, world, me, i)), s);
    if (p == 0) {
      if (round) seq[i] = s;
      counters[2 * kMaxBlocks + i] = ag.call;
    }
  }
  DC_TRACE_KERNEL_END(0);
}

// ---- Steps of the reductions with network peers ---------------------------------------------
//
// With a network link in the job the reductions run as all-to-alls of the collective kernel
// (NVLink and network peers in one launch; src/comm/net_reduce.rs, docs/NETWORK.md) around
// this kernel's local steps:
//   kStepCopy:   piece p (p < pieces) of `count` elements goes from in + p * in_stride to
//                out + p * out_stride (staging into and out of the scratch);
//   kStepReduce: out[i] = in[0 * in_stride + i] op in[1 * in_stride + i] ... in rank order
//                (pieces = world copies of this rank's shard), for i < count; hooked, the
//                epilogue then runs on out's rows with RowCtx::dest = dest + i, row index
//                row0 + i / row_len, and kStepReduceToDest copies the hooked rows to dest.
// Nothing is written once the communicator is aborted (a failed or refused all-to-all before
// this step left the scratch without the peers' data). Arguments: NetStep (reduce.cuh).

template <class T, int OP, class H>
__global__ void __launch_bounds__(kThreads) net_step_kernel(NetStep a) {
  enter_after_previous_kernel();
  const Block g;
  __shared__ int aborted;
  if (threadIdx.x == 0) {
    aborted = abort_raised(reinterpret_cast<const DeviceErrorState*>(a.errors)) ? 1 : 0;
  }
  g.sync();
  if (aborted) return;
  dc_u64 lo, hi;
  block_piece(a.count, gridDim.x, a.unit, blockIdx.x, lo, hi);
  const dc_u64 n = hi - lo;
  if (n == 0) return;
  const T* in = reinterpret_cast<const T*>(a.in);
  T* out = reinterpret_cast<T*>(a.out);
  if (a.step == kStepCopy) {
    for (dc_u32 p = 0; p < a.pieces; ++p) {
      copy_elems<T>(g, out + p * a.out_stride + lo, in + p * a.in_stride + lo, n);
    }
    return;
  }
  reduce_elems<T, OP>(g, out + lo, [&](int p) -> const T* { return in + p * a.in_stride + lo; },
                      (int)a.pieces, n);
  if constexpr (HasEpilogue<H>::value) {
    static_assert(sizeof(typename H::T) == sizeof(T), "the hook's T is not the element type");
    T* dest = reinterpret_cast<T*>(a.dest) + lo;
    g.sync();
    epilogue_rows_at<H>(g, a.user, a.row_len, a.rank, a.world, out + lo, dest,
                        a.row0 + lo / a.row_len, n);
    if (a.step == kStepReduceToDest) {
      g.sync();
      copy_elems<T>(g, dest, out + lo, n);
    }
  }
}

}  // namespace red
}  // namespace devcomm
