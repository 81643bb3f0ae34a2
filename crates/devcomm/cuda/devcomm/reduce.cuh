// devcomm/reduce.cuh: the device side of the reductions (all-reduce, reduce-scatter,
// all-gather; docs/COLLECTIVES.md, "Reductions"): element types, the fixed-order reduction,
// flag-in-data lines, bounded waits on the reduce window's slots, and the launch arguments.
//
// FIXED ORDER. Element i of a result is ((x0 op x1) op x2) ... op x(n-1) over the ranks'
// element i in rank order, in the accumulation type Acc (float for F16 and BF16, the element
// type otherwise), converted to the element type once at the end. Every function here that
// reduces takes the ranks' values in rank order and nothing else decides the order, so the
// result does not depend on the algorithm, the block count or the message size.
#pragma once

#include "devcomm/call_word.cuh"
#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"
#include "devcomm/group.cuh"
#include "devcomm/wait.cuh"
#include "devcomm/window.cuh"

namespace devcomm {
namespace red {

// Launch arguments of both reduction kernels (twin of abi::reduce_launch::ReduceLaunch in Rust).
struct ReduceLaunch {
  DeviceWindow w;         // @0   the reduce window: lines at ll_offset, two-shot halves after
  dc_u64 in;              // @80  input buffer
  dc_u64 out;             // @88  output buffer
  dc_u64 count;           // @96  all-reduce: elements; reduce-scatter / all-gather: per shard
  dc_u64 total;           // @104 elements of the whole buffer (AR: count, RS / AG: W x count)
  dc_u64 shard;           // @112 elements per shard (two-shot); one-shot: elements per sender
  dc_u64 chunk;           // @120 elements of each shard per round (two-shot)
  dc_u64 rounds;          // @128 rounds (two-shot)
  dc_u64 unit;            // @136 block pieces are whole units (elements)
  dc_u64 counters;        // @144 device u64[3 kMaxBlocks]: one-shot, two-shot sequences, calls
  dc_u64 user;            // @152 hook arguments (device memory) or 0
  dc_u64 row_len;         // @160 hooked: elements per row
  dc_u64 ll_offset;       // @168 bytes: first line of the one-shot area in the window
  dc_u64 ll_sender_bytes; // @176 bytes of lines per sender per parity
  dc_u64 pipe_offset;     // @184 bytes: first byte of the two-shot area
  dc_u64 half_bytes;      // @192 bytes of one half of the two-shot area
  dc_u32 blocks;          // @200 blocks of this launch
  dc_u32 mode;            // @204 Mode
  dc_u32 op;              // @208 Op (the kernel is instantiated for it; the agreement sends it)
  dc_u32 dtype;           // @212 element type code (DataType::code; the agreement sends it)
  // Zero-copy calls (zero_copy_kernel: buffers in the communicator's memory pool):
  dc_u64 in_peers;        // @216 device u64[world]: the input's segment base of every rank as
                          //      mapped here (its own included); 0 when the input is not read
                          //      from peers
  dc_u64 in_offset;       // @224 bytes: the input's offset in its segment (the same on every rank)
  dc_u64 out_peers;       // @232 the same for the output; 0 when no peer writes it
  dc_u64 out_offset;      // @240
  dc_u64 layout;          // @248 the layout word (48 bits): algorithm, segments and offsets,
                          //      which every rank must announce alike
  dc_u32 zc;              // @256 ZcAlgo
  dc_u32 flags;           // @260 TwoShotFlags (the staged two-shot)
};

static_assert(sizeof(ReduceLaunch) == 264, "ReduceLaunch size");
static_assert(DC_OFFSETOF(ReduceLaunch, in_peers) == 216, "ReduceLaunch.in_peers");
static_assert(DC_OFFSETOF(ReduceLaunch, zc) == 256, "ReduceLaunch.zc");
static_assert(DC_OFFSETOF(ReduceLaunch, in) == 80, "ReduceLaunch.in");
static_assert(DC_OFFSETOF(ReduceLaunch, counters) == 144, "ReduceLaunch.counters");
static_assert(DC_OFFSETOF(ReduceLaunch, blocks) == 200, "ReduceLaunch.blocks");

// Launch arguments of net_step_kernel (reduce.cu), the local steps of the reductions with
// network peers.
struct NetStep {      // twin of abi::reduce_launch::NetStepLaunch
  dc_u64 in;          // @0
  dc_u64 out;         // @8
  dc_u64 in_stride;   // @16 elements between the pieces (copies) of in
  dc_u64 out_stride;  // @24 elements between the pieces of out (kStepCopy)
  dc_u64 count;       // @32 elements per piece
  dc_u64 unit;        // @40 blocks take whole units (hooked: rows)
  dc_u64 user;        // @48 hook arguments or 0
  dc_u64 row_len;     // @56 hooked: elements per row
  dc_u64 dest;        // @64 hooked: where out[0] goes in the caller's output (RowCtx::dest)
  dc_u64 row0;        // @72 hooked: the row index of out[0] in the output
  dc_u64 errors;      // @80 the communicator's DeviceErrorState
  dc_u32 pieces;      // @88
  dc_u32 step;        // @92 NetStepKind
  dc_i32 rank;        // @96
  dc_i32 world;       // @100
};

static_assert(sizeof(NetStep) == 104, "NetStep size");
static_assert(DC_OFFSETOF(NetStep, errors) == 80, "NetStep.errors");
static_assert(DC_OFFSETOF(NetStep, pieces) == 88, "NetStep.pieces");

enum NetStepKind : dc_u32 { kStepCopy = 0, kStepReduce = 1, kStepReduceToDest = 2 };

enum Mode : dc_u32 { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2 };
// How a call moves its data: staged through the reduce window (one_shot_kernel,
// two_shot_kernel), or zero-copy on pool buffers (zero_copy_kernel): every rank reduces the
// whole buffer reading every rank's input in place (one-shot), or reduces its own shard and
// writes it into every rank's output (two-shot; reduce-scatter: into its own only;
// all-gather: writes its input into every rank's output).
enum ZcAlgo : dc_u32 { kStaged = 0, kZcOneShot = 1, kZcTwoShot = 2 };
// How the staged two-shot runs its rounds (two_shot_kernel). kTwoShotPushed (all-reduce,
// Plan::pushed): each block takes the same span of every round, so that from its third round
// a block waits only for its own peers' blocks; it stages round k + 1 before it gathers round
// k; and each reducer writes its reduced piece, as it reduces it, into a result slot of every
// peer's window, from which every rank copies it out: the links carry stores only. Otherwise
// peers read the reduced pieces from the reducer's window, round after round.
enum TwoShotFlags : dc_u32 { kTwoShotPushed = 1 };
enum Op : int { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };

constexpr dc_u32 kMaxBlocks = 128;
// Most blocks of a call on lines (one-shot, two-shot on lines; plan::LINE_MAX_BLOCKS): their
// kFree slots beyond it are never used, so line calls neither wait on nor release them.
constexpr dc_u32 kLineMaxBlocks = 64;
constexpr dc_u32 kThreads = 512;

// Signal slots of the reduce window (user slots), kMaxBlocks per (kind, rank):
//   kFree    [receiver q][block i], in a sender's pad: q has read the sender's lines of seq
//   kReady   [rank p][block b]: p staged round seq of block b's piece in its window
//   kReduced [rank p][block b]: p wrote its reduced shard piece of round seq
//   kDone    [rank p][block i]: p's block i finished reading every window for round seq
//   kAgree0, kAgree1 [rank p][block b]: the call agreement's ring of two words that p's
//            block b announced (below)
//   kZcLayout [rank p][block b]: p's block b entered zero-copy call c: its call word of kind
//            kKindReduceLayout (call_word.cuh), the layout as payload; one slot is enough, as
//            for the agreement: p writes call c + 1's word only after its call c ended, which
//            needed this rank's block b to have read call c's word
//   kZcDone  [rank p][block b]: p's block b is done with every rank's buffers in zero-copy
//            call c (the call number)
//   kPushed  [rank p][block b]: p wrote its reduced shard piece of round seq into its result
//            slot in this rank's window (the staged two-shot's pushed form, kTwoShotPushed)
enum Slot : dc_u32 {
  kFree = 0, kReady = 1, kReduced = 2, kDone = 3, kAgree0 = 4, kAgree1 = 5, kZcLayout = 6,
  kZcDone = 7, kPushed = 8
};
// Slot kinds: the window holds kSlotKinds x world x kMaxBlocks user slots (reduce/launch.rs).
constexpr dc_u32 kSlotKinds = 9;

DC_HOST_DEVICE inline dc_u64 slot_of(Slot kind, int world, int rank, dc_u32 block) {
  return ((dc_u64)kind * (dc_u64)world + (dc_u64)rank) * kMaxBlocks + block;
}

// ---- Call agreement ------------------------------------------------------------------------
//
// Every reduction call tells each peer what it is before anything is written (docs/PROTOCOL.md,
// "Agreement", reductions): at its start each block b stores its call word (call_word.cuh, kind
// kKindReduction: the collective, element type, operator, hook, zero-copy and the bytes of the
// whole buffer) into every peer's pad, ring entry call % 2 of (p = this rank, block b). The calls
// are numbered per block (counters[2 kMaxBlocks + b], the same in every block), whichever
// algorithm runs, so a one-shot call against a two-shot one still meets. A thread about to
// write the output first polls each peer's entry until it carries its own call number and
// compares the words; a difference is recorded as kOpCallMismatch with the field and both
// values (the error record's slot is the field), and the communicator is aborted: nothing is
// written into the output. One relaxed 8-byte store, single-copy atomic, and no fence: the word
// carries everything the check needs (a release store at system scope waits for the thread's
// earlier NVLink stores, about 3 us on 2 H100s, docs/PERFORMANCE.md).
//
// A ring of two is enough: a rank can start call c + 2 only after its call c + 1 ended, which
// needed every peer to have started call c + 1 (every algorithm reads each peer's data of the
// call), hence to have ended call c and read its entry. An entry holds call c - 2 or call c,
// whose low 16 bits differ, also for a block that sat out calls: every call's end refreshes
// the entries of the blocks beyond its launch (agree_refresh).
//
// All-gather has no operator: op 7. A zero-copy call's ranks compare their layouts too
// (kZcLayout, kind kKindReduceLayout), after the words.
constexpr dc_u32 kNoReduceOp = 7;
// The element type of a refused call (no type has it): a rank that refused its buffers in a
// layout another rank may accept (that rank's in-place shard) still takes part with this in
// its word, so that every rank's agreement fails before any output is written (its own too:
// agree_compare fails on its own refused word, whatever the peers announce).
constexpr dc_u32 kRefusedDtype = 7;

// Ring entry of `call`.
DC_HOST_DEVICE inline Slot agree_slot_kind(dc_u64 call) { return (call & 1) ? kAgree1 : kAgree0; }

// Block b's piece [lo, hi) of m elements cut into `blocks` pieces of whole units (the Rust
// planner's block_piece).
DC_HOST_DEVICE inline void block_piece(dc_u64 m, dc_u32 blocks, dc_u64 unit, dc_u32 b,
                                       dc_u64& lo, dc_u64& hi) {
  const dc_u64 units = (m + unit - 1) / unit;
  const dc_u64 per = (units + blocks - 1) / blocks * unit;
  lo = (dc_u64)b * per < m ? (dc_u64)b * per : m;
  hi = lo + per < m ? lo + per : m;
}

// ---- Element types -------------------------------------------------------------------------

struct alignas(2) F16 { unsigned short bits; };
struct alignas(2) BF16 { unsigned short bits; };

#if defined(__CUDACC__)

// Acc and the conversions of each element type. Integer sums wrap: i32 and i64 add as
// unsigned; u8 accumulates in unsigned char.
template <class T> struct Num {
  using Acc = T;
  static __device__ __forceinline__ Acc load(T x) { return x; }
  static __device__ __forceinline__ T store(Acc a) { return a; }
  static constexpr bool kFloat = false;
};
template <> struct Num<float> {
  using Acc = float;
  static __device__ __forceinline__ Acc load(float x) { return x; }
  static __device__ __forceinline__ float store(Acc a) { return a; }
  static constexpr bool kFloat = true;
};
template <> struct Num<double> {
  using Acc = double;
  static __device__ __forceinline__ Acc load(double x) { return x; }
  static __device__ __forceinline__ double store(Acc a) { return a; }
  static constexpr bool kFloat = true;
};
template <> struct Num<F16> {
  using Acc = float;
  static __device__ __forceinline__ float load(F16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
  }
  static __device__ __forceinline__ F16 store(float a) {  // round to nearest even
    F16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(a));
    return h;
  }
  static constexpr bool kFloat = true;
};
template <> struct Num<BF16> {
  using Acc = float;
  static __device__ __forceinline__ float load(BF16 x) {
    return __uint_as_float((unsigned)x.bits << 16);
  }
  static __device__ __forceinline__ BF16 store(float a) {  // round to nearest even
    BF16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(a));
    return h;
  }
  static constexpr bool kFloat = true;
};

template <class A> __device__ __forceinline__ A wrap_add(A a, A b) { return a + b; }
template <> __device__ __forceinline__ dc_i32 wrap_add(dc_i32 a, dc_i32 b) {
  return (dc_i32)((unsigned)a + (unsigned)b);
}
template <> __device__ __forceinline__ long long wrap_add(long long a, long long b) {
  return (long long)((unsigned long long)a + (unsigned long long)b);
}
template <> __device__ __forceinline__ unsigned char wrap_add(unsigned char a, unsigned char b) {
  return (unsigned char)(a + b);
}

template <class A> __device__ __forceinline__ bool is_nan(A a) { return a != a; }

// acc op x, where acc holds ranks 0..p-1 and x is rank p's value.
template <int OP, class T>
__device__ __forceinline__ typename Num<T>::Acc combine(typename Num<T>::Acc acc,
                                                        typename Num<T>::Acc x) {
  if (OP == kSum || OP == kAvg) return wrap_add(acc, x);
  // Max / Min: a NaN already in acc stays; a NaN in x replaces acc; between equal values
  // (-0.0 and 0.0 too) acc, the earlier rank's, stays.
  if (Num<T>::kFloat && is_nan(acc)) return acc;
  if (Num<T>::kFloat && is_nan(x)) return x;
  if (OP == kMax) return x > acc ? x : acc;
  return x < acc ? x : acc;
}

// The final value of an accumulation over `n` ranks: avg divides (floats: by n in Acc;
// integers: the wrapped sum divided by n, truncated toward zero).
template <int OP, class T>
__device__ __forceinline__ T finish(typename Num<T>::Acc acc, int n) {
  using A = typename Num<T>::Acc;
  if (OP == kAvg) acc = (A)(acc / (A)n);
  return Num<T>::store(acc);
}

// ---- Bounded waits on the reduce window ----------------------------------------------------

// One thread waits until its own slot `slot` >= expected (acquire); false on timeout or abort
// (recorded; see wait.cuh's CALLER CONTRACT).
__device__ __forceinline__ bool wait_slot(const DeviceWindow& w, dc_u64 slot, dc_u64 expected,
                                          int peer) {
  return wait_until(error_state(w), w.timeout_ns, w.rank, own_user_slot(w, slot), expected,
                    Cmp::Ge, WaitSite{kOpWaitSignal, peer, slot});
}

// ---- Call agreement on the device (see "Call agreement" above) ------------------------------

// This block's call: its number (the same in every block) and descriptor.
struct Agree {
  dc_u64 call;
  dc_u64 word;
};

__device__ __forceinline__ Agree agree_begin(const ReduceLaunch& a, dc_u32 b, dc_u64 elem_bytes,
                                             bool hooked) {
  const dc_u64* counters = reinterpret_cast<const dc_u64*>(a.counters);
  const dc_u32 op = a.mode == kAllGather ? kNoReduceOp : a.op;
  const dc_u64 call = counters[2 * kMaxBlocks + b] + 1;
  return Agree{call, call_word(call, kKindReduction,
                               reduce_payload(a.mode, a.dtype, op, hooked ? 1u : 0u,
                                              a.total * elem_bytes, a.zc != kStaged ? 1u : 0u))};
}

// Thread p of the block announces the call to peer p: one relaxed store of its word. (No
// abort mirror here, unlike send/recv's senders: a reduction forwards no data of an earlier
// call, and a kernel behind a failed one runs with the counters that call left, whose number
// its peers' checks never accept: they time out naming this rank.)
template <class G>
__device__ __forceinline__ void agree_announce(const G& g, const ReduceLaunch& a, dc_u32 b,
                                               const Agree& ag) {
  const int world = a.w.world_size, me = a.w.rank;
  const dc_u64 slot = slot_of(agree_slot_kind(ag.call), world, me, b);
  const dc_u64 word = ag.word;
  for (dc_u32 p = g.thread_rank(); p < (dc_u32)world; p += g.size()) {
    if ((int)p != me) st_relaxed_sys(peer_user_slot(a.w, (int)p, slot), word);
  }
}

// At the end of a call that ended here, the entries in peer p's pad that speak for block i:
// block b refreshes its own layout entry when the call was staged (its agreement entry it
// announced at the start), and block 0 both entries of every block i beyond the launch, which
// announced nothing. So every entry holds one of the last two calls' numbers (the ring entry
// of call c holds c - 2 or c, the layout entry c - 1 or c) whatever blocks a call used: a
// block that sat out 65,536 calls, or a never-written entry (0), cannot pass for the current
// call by its 16 low bits, and a zero-copy call that passed the agreement cannot take a
// layout word that old. Called from each kernel's end loop, for its pairs (p, i) with i == b
// or (b == 0 and i >= a.blocks).
__device__ __forceinline__ void agree_refresh(const ReduceLaunch& a, const Agree& ag, dc_u32 b,
                                              int p, dc_u32 i) {
  const int world = a.w.world_size, me = a.w.rank;
  if (p == me) return;
  if (i != b) {
    st_relaxed_sys(peer_user_slot(a.w, p, slot_of(agree_slot_kind(ag.call), world, me, i)),
                   ag.word);
  }
  if (i != b || a.zc == kStaged) {
    st_relaxed_sys(peer_user_slot(a.w, p, slot_of(kZcLayout, world, me, i)),
                   call_word(ag.call, kKindReduceLayout, a.layout));
  }
}

// Peer p's ring entry of this call (block b), in this rank's pad.
__device__ __forceinline__ const volatile dc_u64* agree_entry(const ReduceLaunch& a, dc_u32 b,
                                                              const Agree& ag, int p) {
  return own_user_slot(a.w, slot_of(agree_slot_kind(ag.call), a.w.world_size, p, b));
}

// Compares peer p's word of this call with this side's: false on a mismatch
// (recorded as kOpCallMismatch: the field, this side's value, the peer's).
__device__ inline bool agree_compare(const ReduceLaunch& a, const Agree& ag, int p, dc_u64 w) {
  const bool refused = field_value(ag.word, kFieldDtype) == kRefusedDtype;
  const dc_u32 field = refused ? kFieldDtype : call_differs(kKindReduction, ag.word, w);
  if (field == 0) return true;
  record_wait_failure(error_state(a.w), a.w.rank, WaitSite{kOpCallMismatch, p, field},
                      field_value(ag.word, field), field_value(w, field), 0);
  return false;
}

// Polls `entry` (peer p's word in slot `slot` of this rank's pad) until it carries call
// `call`, left in `w`: false on a timeout or abort (recorded).
__device__ inline bool poll_call_word(const ReduceLaunch& a, const volatile dc_u64* entry,
                                      dc_u64 slot, dc_u64 call, int p, dc_u64& w) {
  DeviceErrorState* err = error_state(a.w);
  dc_u64 start = 0, next_abort = 0;
  w = *entry;
  for (dc_u32 polls = 1; !call_word_is(w, call); ++polls) {
    if (polls % kAbortCheckPolls == 0) {
      const dc_u64 now = globaltimer_ns();
      if (start == 0) {
        start = now;
        next_abort = now + kAbortCheckNs;
      }
      if (now >= next_abort) {
        if (abort_raised(err)) return false;
        next_abort = now + kAbortCheckNs;
      }
      if (now - start >= a.w.timeout_ns) {
        record_wait_failure(err, a.w.rank, WaitSite{kOpWaitSignal, p, slot},
                            call & kCallNumberMask, call_number(w), now - start);
        return false;
      }
    }
    w = *entry;
  }
  return true;
}

// Polls peer p's entry (block b) until it announces this call, then compares the descriptors:
// false on a timeout or abort (recorded) or a mismatch (agree_compare).
__device__ inline bool agree_check(const ReduceLaunch& a, dc_u32 b, const Agree& ag, int p) {
  const dc_u64 slot = slot_of(agree_slot_kind(ag.call), a.w.world_size, p, b);
  dc_u64 w = 0;
  return poll_call_word(a, own_user_slot(a.w, slot), slot, ag.call, p, w) &&
         agree_compare(a, ag, p, w);
}

// Zero-copy calls: peer p's layout word of this call (block b) equals this rank's; false on a
// timeout or abort, or a different layout (recorded as kOpCallMismatch, field kFieldLayout).
__device__ inline bool layout_check(const ReduceLaunch& a, dc_u32 b, const Agree& ag, int p) {
  const dc_u64 slot = slot_of(kZcLayout, a.w.world_size, p, b);
  dc_u64 w = 0;
  if (!poll_call_word(a, own_user_slot(a.w, slot), slot, ag.call, p, w)) return false;
  const dc_u64 mine = call_word(ag.call, kKindReduceLayout, a.layout);
  if (call_differs(kKindReduceLayout, mine, w) == 0) return true;
  record_wait_failure(error_state(a.w), a.w.rank, WaitSite{kOpCallMismatch, p, kFieldLayout},
                      field_value(mine, kFieldLayout), field_value(w, kFieldLayout), 0);
  return false;
}

// Whether every peer announced the same call, checked by group g (peer p by its thread p; a
// barrier of g follows, so every thread of g must call it).
template <class G>
__device__ __forceinline__ bool agree_all(const G& g, const ReduceLaunch& a, dc_u32 b,
                                          const Agree& ag) {
  bool ok = true;
  for (dc_u32 p = g.thread_rank(); p < (dc_u32)a.w.world_size; p += g.size()) {
    if ((int)p != a.w.rank) ok = ok && agree_check(a, b, ag, (int)p);
  }
  return !g.any(!ok);
}

// Up to 8 bytes at p (n < 8 at a buffer's end: the rest is 0), any alignment.
__device__ __forceinline__ dc_u64 load8(const unsigned char* p, dc_u64 n) {
  if (n >= 8 && (reinterpret_cast<dc_u64>(p) & 7) == 0) return *reinterpret_cast<const dc_u64*>(p);
  dc_u64 v = 0;
  for (dc_u64 k = 0; k < n && k < 8; ++k) v |= (dc_u64)p[k] << (8 * k);
  return v;
}

// Writes the first n (<= 8) bytes of v at p, any alignment.
__device__ __forceinline__ void store8(unsigned char* p, dc_u64 v, dc_u64 n) {
  if (n >= 8 && (reinterpret_cast<dc_u64>(p) & 7) == 0) {
    *reinterpret_cast<dc_u64*>(p) = v;
    return;
  }
  for (dc_u64 k = 0; k < n && k < 8; ++k) p[k] = (unsigned char)(v >> (8 * k));
}

// 8 bytes as elements of T (8 / sizeof(T) of them; T of 1, 2, 4 or 8 bytes).
template <class T> union Word {
  dc_u64 u;
  T v[8 / sizeof(T)];
};

// ---- Piece loops ---------------------------------------------------------------------------
//
// A thread handles the 16-byte groups t, t + G, t + 2G, ... (G = the group's size), kBatch of
// them at a time: it issues the loads of all kBatch groups before using any, so that kBatch
// loads per thread are in flight over NVLink at once (one at a time, a block of 512 threads
// keeps only 8 KiB in flight). Each group belongs to one thread, which reads all of its inputs
// before writing it, so a destination may be one of the sources (the own window slot).

constexpr int kBatch = 4;

// Copies n elements of T from src to dst by the threads of block g: 16-byte accesses when
// both are 16-byte aligned, element accesses otherwise.
template <class T, class G>
__device__ __forceinline__ void copy_elems(const G& g, T* dst, const T* src, dc_u64 n) {
  constexpr dc_u64 kV = 16 / sizeof(T);
  dc_u64 i0 = 0;
  if (((reinterpret_cast<dc_u64>(dst) | reinterpret_cast<dc_u64>(src)) & 15) == 0) {
    const dc_u64 nv = n / kV, stride = g.size();
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (dc_u64 j0 = g.thread_rank(); j0 < nv; j0 += kBatch * stride) {
      uint4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const dc_u64 j = j0 + u * stride;
        v[u] = j < nv ? s[j] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const dc_u64 j = j0 + u * stride;
        if (j < nv) d[j] = v[u];
      }
    }
    i0 = nv * kV;
  }
  for (dc_u64 i = i0 + g.thread_rank(); i < n; i += g.size()) dst[i] = src[i];
}

// dst[i] = reduction over ranks p = 0..world-1 (in order) of src(p)[i], for i < n; src(p) is
// `base_of(p) + offset` elements. 16-byte accesses when every pointer is 16-byte aligned.
template <class T, int OP, class G, class Src>
__device__ __forceinline__ void reduce_elems(const G& g, T* dst, Src src, int world, dc_u64 n) {
  using N = Num<T>;
  using A = typename N::Acc;
  constexpr int kV = (int)(16 / sizeof(T));
  bool aligned = (reinterpret_cast<dc_u64>(dst) & 15) == 0;
  for (int p = 0; p < world; ++p) aligned = aligned && (reinterpret_cast<dc_u64>(src(p)) & 15) == 0;
  dc_u64 i0 = 0;
  if (aligned) {
    union V {
      uint4 u;
      T v[kV];
    };
    const dc_u64 nv = n / kV, stride = g.size();
    for (dc_u64 j0 = g.thread_rank(); j0 < nv; j0 += kBatch * stride) {
      A acc[kBatch][kV];
      V x[kBatch];
      for (int p = 0; p < world; ++p) {  // rank order: the fixed order of every element
        const uint4* s = reinterpret_cast<const uint4*>(src(p));
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const dc_u64 j = j0 + u * stride;
          x[u].u = j < nv ? s[j] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
#pragma unroll
          for (int k = 0; k < kV; ++k) {
            const A v = N::load(x[u].v[k]);
            acc[u][k] = p == 0 ? v : combine<OP, T>(acc[u][k], v);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const dc_u64 j = j0 + u * stride;
        if (j >= nv) continue;
#pragma unroll
        for (int k = 0; k < kV; ++k) x[u].v[k] = finish<OP, T>(acc[u][k], world);
        reinterpret_cast<uint4*>(dst)[j] = x[u].u;
      }
    }
    i0 = nv * kV;
  }
  for (dc_u64 i = i0 + g.thread_rank(); i < n; i += g.size()) {
    A acc = N::load(src(0)[i]);
    for (int p = 1; p < world; ++p) acc = combine<OP, T>(acc, N::load(src(p)[i]));
    dst[i] = finish<OP, T>(acc, world);
  }
}

// Peers whose loads a thread issues together before reducing (registers: kWide x kWideBatch
// 16-byte values); more ranks take reduce_elems' rank-by-rank loop.
enum : int { kWide = 8, kWideBatch = 2 };

// dst(q)[i] for q < ndst = reduction over ranks p = 0..world-1 (in order) of src(p)[i], for
// i < n. Unlike reduce_elems, every rank's loads are in flight at once (remote loads over
// NVLink are latency-bound), and the result goes to several destinations. The same
// accumulation in the same order as reduce_elems: the results are bitwise equal.
template <class T, int OP, class G, class Src, class Dst>
__device__ __forceinline__ void reduce_wide(const G& g, Src src, int world, Dst dst, int ndst,
                                            dc_u64 n) {
  using N = Num<T>;
  using A = typename N::Acc;
  constexpr int kV = (int)(16 / sizeof(T));
  bool aligned = world <= kWide;
  for (int p = 0; p < world; ++p) aligned = aligned && (reinterpret_cast<dc_u64>(src(p)) & 15) == 0;
  for (int q = 0; q < ndst; ++q) aligned = aligned && (reinterpret_cast<dc_u64>(dst(q)) & 15) == 0;
  if (!aligned) {
    reduce_elems<T, OP>(g, dst(0), src, world, n);
    g.sync();
    for (int q = 1; q < ndst; ++q) copy_elems<T>(g, dst(q), dst(0), n);
    return;
  }
  union V {
    uint4 u;
    T v[kV];
  };
  const dc_u64 nv = n / kV, stride = g.size();
  for (dc_u64 j0 = g.thread_rank(); j0 < nv; j0 += kWideBatch * stride) {
    V x[kWide][kWideBatch];
#pragma unroll
    for (int p = 0; p < kWide; ++p) {
      if (p >= world) break;
      const uint4* s = reinterpret_cast<const uint4*>(src(p));
#pragma unroll
      for (int u = 0; u < kWideBatch; ++u) {
        const dc_u64 j = j0 + u * stride;
        x[p][u].u = j < nv ? s[j] : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kWideBatch; ++u) {
      const dc_u64 j = j0 + u * stride;
      if (j >= nv) continue;
      V r;
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        A acc = N::load(x[0][u].v[k]);
#pragma unroll
        for (int p = 1; p < kWide; ++p) {
          if (p < world) acc = combine<OP, T>(acc, N::load(x[p][u].v[k]));
        }
        r.v[k] = finish<OP, T>(acc, world);
      }
      for (int q = 0; q < ndst; ++q) reinterpret_cast<uint4*>(dst(q))[j] = r.u;
    }
  }
  for (dc_u64 i = nv * kV + g.thread_rank(); i < n; i += g.size()) {
    A acc = N::load(src(0)[i]);
    for (int p = 1; p < world; ++p) acc = combine<OP, T>(acc, N::load(src(p)[i]));
    const T r = finish<OP, T>(acc, world);
    for (int q = 0; q < ndst; ++q) dst(q)[i] = r;
  }
}

// ---- Epilogue hooks ------------------------------------------------------------------------
//
// A hooked all-reduce or reduce-scatter calls H::epilogue(ctx, row) for every row of this
// rank's reduced shard, one row group per row (every thread of the group calls it), before the
// row is written anywhere: `row` holds the row's cols reduced elements (of H::T, rounded) in
// this rank's window and the hook rewrites them in place (reading ctx.user for its own
// arguments). What it leaves there is what the output receives: every rank's (all-reduce) or
// this rank's (reduce-scatter). A hook must not touch other rows.
//
// Row groups: H may declare `static constexpr unsigned kRowThreads = N;` with N one of 32, 64,
// 128, 256, 512 (kThreads, the whole block); without it a row has one warp (N = 32), the
// contract hooks were written against before the constant existed. A group is N consecutive
// threads of the block (whole warps); the block's kThreads / N groups take its rows in turn
// (row r of a block's rows: group r % groups). Every kernel that runs hooks does so on its
// whole block of kThreads threads, so N alone decides the row's shape (which lane holds which
// columns, the order of row_sum) on every algorithm: results stay bitwise the same on every
// path.
struct RowCtx {
  const void* user;  // the user arguments (device memory) or null
  dc_u64 row;        // the row's index in this rank's output (all-reduce: the whole buffer;
                     // reduce-scatter: this rank's shard)
  dc_u64 cols;       // elements per row
  dc_i32 rank;
  dc_i32 world_size;
  dc_u32 lane;       // this thread's place in the row's group (0..lanes-1)
  dc_u32 lanes;      // threads of the row's group: the hook's kRowThreads (32 if it has none)
  const void* dest;  // the row's place in this rank's output, still as it was before the
                     // call (an accumulate hook adds it; in place it is this rank's input)
};

// No hook.
struct NoEpilogue {};

// Whether H is a user's hook (anything but NoEpilogue).
template <class H> struct HasEpilogue { static constexpr bool value = true; };
template <> struct HasEpilogue<NoEpilogue> { static constexpr bool value = false; };

// Whether n threads may run a row: a power of two from a warp to the whole block.
constexpr bool row_threads_ok(long long n) {
  return (n == 32 || n == 64 || n == 128 || n == 256 || n == 512) && n <= (long long)kThreads;
}

// The threads of H's row group: H::kRowThreads when H declares it, else 32 (a warp).
template <class H, class = void> struct RowThreads { static constexpr dc_u32 value = 32; };
template <class H> struct RowThreads<H, decltype((void)H::kRowThreads)> {
  static_assert(row_threads_ok((long long)H::kRowThreads),
                "the hook's kRowThreads must be 32, 64, 128, 256 or 512");
  static constexpr dc_u32 value = (dc_u32)H::kRowThreads;
};

// The sum of v over the 32 lanes of a warp, on every lane (a helper for hooks): an xor
// butterfly, lane l adding lane l ^ o's value for o = 16, 8, 4, 2, 1, so every lane ends with
// the same bits. In a row group wider than a warp it sums the caller's warp only: a hook sums
// its row with row_sum.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The largest v over the 32 lanes of a warp (fmaxf), on every lane, in warp_sum's butterfly.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One float a warp of the block: where row_sum and row_max leave each warp's partial for the
// other warps of its row group (a group's warps are its own slots, so groups never share one).
__device__ __forceinline__ float* row_group_scratch() {
  __shared__ float partials[kThreads / 32];
  return partials;
}

// The value of every warp of the calling thread's row group combined in warp order, on every
// thread of the group: each warp's lanes combine by `warp` (its butterfly), then every thread
// folds the warps' values 0, 1, 2, ... with `op`. Groups wider than a warp meet at hardware
// barrier 1 + (the group's index in the block), of c.lanes threads (ids 1..kThreads / lanes;
// 0 is __syncthreads', and no reduction kernel uses the others while hooks run); the second
// barrier keeps a fast warp's next call from overwriting a partial a slow warp still reads.
template <class W, class Op>
__device__ __forceinline__ float row_combine(const RowCtx& c, float v, W warp, Op op) {
  v = warp(v);
  if (c.lanes <= 32) return v;
  const dc_u32 t = linear_thread_index();
  const dc_u32 id = 1 + t / c.lanes, first = (t - c.lane) / 32, warps = c.lanes / 32;
  float* partials = row_group_scratch();
  if ((t & 31u) == 0) partials[t / 32] = v;
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(c.lanes) : "memory");
  float r = partials[first];
  for (dc_u32 k = 1; k < warps; ++k) r = op(r, partials[first + k]);
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(c.lanes) : "memory");
  return r;
}

// The sum of v over the row's group, on every thread of it, in a fixed order: warp_sum's
// butterfly within each warp, then the warps' sums added in warp order ((w0 + w1) + w2) + ...
// (for 32 lanes: warp_sum itself). EVERY thread of the group must call it, the same number of
// times for the row (it contains the group's barriers): never from a branch some of the
// group's threads skip.
__device__ __forceinline__ float row_sum(const RowCtx& c, float v) {
  return row_combine(c, v, [](float x) { return warp_sum(x); },
                     [](float a, float b) { return a + b; });
}

// The largest v (fmaxf) over the row's group, on every thread of it: warp_max within each
// warp, then the warps' values in warp order. Called as row_sum is: by every thread of the
// group, the same number of times.
__device__ __forceinline__ float row_max(const RowCtx& c, float v) {
  return row_combine(c, v, [](float x) { return warp_max(x); },
                     [](float a, float b) { return fmaxf(a, b); });
}

// Element conversions for hooks: to float and back (rounding to nearest even).
template <class T> __device__ __forceinline__ float to_float(T x) { return (float)x; }
template <> __device__ __forceinline__ float to_float(F16 x) { return Num<F16>::load(x); }
template <> __device__ __forceinline__ float to_float(BF16 x) { return Num<BF16>::load(x); }
template <class T> __device__ __forceinline__ T from_float(float x) { return (T)x; }
template <> __device__ __forceinline__ F16 from_float(float x) { return Num<F16>::store(x); }
template <> __device__ __forceinline__ BF16 from_float(float x) { return Num<BF16>::store(x); }

#endif  // __CUDACC__

}  // namespace red
}  // namespace devcomm
