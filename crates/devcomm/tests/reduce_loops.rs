//! Runs `reduce.cuh`'s piece loops (`copy_elems`, `reduce_elems`) on the host, compiled by
//! the host C++ compiler with stand-ins for the CUDA built-ins and the threads of a group run
//! one after another (a piece loop has no communication between threads: every element is
//! read and written by one thread). For every size up to 300 elements, aligned and misaligned
//! buffers, groups of 1, 3 and 32 threads and 1 to 4 ranks: the results equal a plain
//! reduction in rank order, element by element, and nothing outside the destination is
//! touched. Also the reductions' call word (packing, the field a difference names) and
//! its ring's signal slots (`kSlotKinds`, equal to `devcomm::reduce::plan::SLOT_KINDS`).
//! Needs `c++` (or `$CXX`).

#[allow(dead_code)] // run_ok and assert_layout
#[path = "common/cxx.rs"]
mod cxx;

use cxx::{compile_cpp, run_ok, scratch_dir};

const SIMULATION: &str = r#"
#define __CUDACC__ 1
#define __device__
#define __forceinline__ inline
#define __global__
#define __host__
#define __launch_bounds__(x)
#define __shared__ static
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static Dim3 threadIdx, blockDim, blockIdx;
inline void __syncwarp(unsigned = 0xffffffffu) {}
inline int __any_sync(unsigned, int p) { return p; }
inline void __syncthreads() {}
inline int __syncthreads_or(int p) { return p; }
inline void __threadfence_system() {}
inline void __nanosleep(unsigned) {}
inline void __trap() {}
inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) { unsigned o = *p; if (o == c) *p = v; return o; }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c, unsigned long long v) { unsigned long long o = *p; if (o == c) *p = v; return o; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
inline float rsqrtf(float x) { return x; }
#include "devcomm/reduce.cuh"

using namespace devcomm;
using namespace devcomm::red;

struct SimGroup {
  unsigned rank, n;
  unsigned thread_rank() const { return rank; }
  unsigned size() const { return n; }
};

template <class T, int OP>
bool check_reduce(const char* name) {
  constexpr int kPad = 64, kMax = 300;
  alignas(64) static T src[4][kMax + 2 * kPad], dst[kMax + 2 * kPad], want[kMax + 2 * kPad];
  for (int p = 0; p < 4; ++p)
    for (int i = 0; i < kMax + 2 * kPad; ++i) src[p][i] = (T)((i * 37 + p * 101) % 251 - (OP == kMax ? 120 : 0));
  const unsigned groups[] = {1, 3, 32};
  for (int world = 1; world <= 4; ++world)
    for (unsigned n : groups)
      for (int so = 0; so < 3; ++so)       // source offset (elements): 0 keeps 16-byte alignment
        for (int dof = 0; dof < 2; ++dof)  // destination offset
          for (int len = 0; len <= kMax; len += (len < 40 ? 1 : 13)) {
            for (int i = 0; i < kMax + 2 * kPad; ++i) dst[i] = want[i] = (T)77;
            for (int i = 0; i < len; ++i) {
              typename Num<T>::Acc acc = Num<T>::load(src[0][kPad + so + i]);
              for (int p = 1; p < world; ++p) acc = combine<OP, T>(acc, Num<T>::load(src[p][kPad + so + i]));
              want[kPad + dof + i] = finish<OP, T>(acc, world);
            }
            auto from = [&](int p) -> const T* { return &src[p][kPad + so]; };
            for (unsigned r = 0; r < n; ++r)
              reduce_elems<T, OP>(SimGroup{r, n}, &dst[kPad + dof], from, world, (dc_u64)len);
            if (std::memcmp(dst, want, sizeof dst) != 0) {
              std::printf("FAIL reduce %s world=%d group=%u so=%d dof=%d len=%d\n", name, world, n, so, dof, len);
              return false;
            }
            // The same data copied.
            for (int i = 0; i < kMax + 2 * kPad; ++i) dst[i] = want[i] = (T)77;
            std::memcpy(&want[kPad + dof], &src[0][kPad + so], len * sizeof(T));
            for (unsigned r = 0; r < n; ++r) copy_elems<T>(SimGroup{r, n}, &dst[kPad + dof], &src[0][kPad + so], (dc_u64)len);
            if (std::memcmp(dst, want, sizeof dst) != 0) {
              std::printf("FAIL copy %s group=%u so=%d dof=%d len=%d\n", name, n, so, dof, len);
              return false;
            }
          }
  return true;
}

// The call agreement's word of a reduction (call_word.cuh, kind kKindReduction): each field
// packs, decodes and is the one named when it alone differs; the ring's and the zero-copy
// calls' slots fit the window's kinds (the last kind's last slot is the window's last).
static dc_u64 word(dc_u32 mode, dc_u32 dtype, dc_u32 op, dc_u32 hooked, dc_u64 bytes,
                   dc_u32 zc = 0, dc_u64 call = 5) {
  return call_word(call, kKindReduction, reduce_payload(mode, dtype, op, hooked, bytes, zc));
}

bool check_desc() {
  const dc_u64 base = word(kAllReduce, 2, kSum, 0, 4096);
  struct { dc_u64 other; dc_u32 field; dc_u64 mine, theirs; } cases[] = {
      {word(kAllGather, 2, kNoReduceOp, 0, 4096), kFieldMode, kAllReduce, kAllGather},
      {word(kAllReduce, 0, kSum, 0, 4096), kFieldDtype, 2, 0},
      {word(kAllReduce, 2, kMax, 0, 4096), kFieldOp, kSum, kMax},
      {word(kAllReduce, 2, kSum, 1, 4096), kFieldHooked, 0, 1},
      {word(kAllReduce, 2, kSum, 0, 4097), kFieldBytes, 4096, 4097},
      {word(kAllReduce, 2, kSum, 0, 4096, 1), kFieldZeroCopy, 0, 1},
      {word(kAllReduce, 2, kSum, 0, (1ull << 38) + 4096), 0, 0, 0},  // bytes: 38 bits
  };
  if (call_differs(kKindReduction, base, base) != 0) return false;
  // A refused call's type (7, REFUSED_DTYPE in reduce/launch.rs) packs whole and is no type's.
  const dc_u64 refused = word(kAllReduce, kRefusedDtype, kSum, 0, 4096);
  if (kRefusedDtype != 7 || field_value(refused, kFieldDtype) != 7 ||
      call_differs(kKindReduction, base, refused) != kFieldDtype) {
    std::printf("FAIL refused word\n");
    return false;
  }
  for (const auto& c : cases) {
    const dc_u32 f = call_differs(kKindReduction, base, c.other);
    if (f != c.field) {
      std::printf("FAIL word field %u, expected %u\n", f, c.field);
      return false;
    }
    if (f != 0 && (field_value(base, f) != c.mine || field_value(c.other, f) != c.theirs)) {
      std::printf("FAIL word values of field %u\n", f);
      return false;
    }
  }
  // The call number: its low 16 bits above the payload, which it leaves whole; a zero-copy
  // call's layout word (48 bits) names the layout when it differs.
  const dc_u64 wrapped = word(kAllReduce, 2, kSum, 0, 4096, 0, 65536 + 5);
  const dc_u64 l1 = call_word(5, kKindReduceLayout, 0xfedcba987654ull);
  const dc_u64 l2 = call_word(5, kKindReduceLayout, 0xfedcba987655ull);
  if (!call_word_is(base, 5) || call_word_is(base, 3) || !call_word_is(wrapped, 5) ||
      call_differs(kKindReduction, base, wrapped) != 0 || field_value(base, kFieldBytes) != 4096 ||
      call_differs(kKindReduceLayout, l1, l1) != 0 ||
      call_differs(kKindReduceLayout, l1, l2) != kFieldLayout ||
      field_value(l2, kFieldLayout) != 0xfedcba987655ull) {
    std::printf("FAIL agree word\n");
    return false;
  }
  const dc_u64 last = slot_of(kPushed, 32, 31, kMaxBlocks - 1);
  const bool ring = agree_slot_kind(1) == kAgree1 && agree_slot_kind(2) == kAgree0 &&
                    agree_slot_kind(3) == kAgree1 && kSlotKinds == 9 && kPushed == kSlotKinds - 1 &&
                    last == (dc_u64)kSlotKinds * 32 * kMaxBlocks - 1;
  if (!ring) std::printf("FAIL desc ring slots\n");
  return ring;
}

int main() {
  bool ok = check_desc() && check_reduce<float, kSum>("f32 sum") && check_reduce<float, kAvg>("f32 avg") &&
            check_reduce<double, kMax>("f64 max") && check_reduce<int, kMin>("i32 min") &&
            check_reduce<int, kAvg>("i32 avg") && check_reduce<long long, kSum>("i64 sum") &&
            check_reduce<unsigned char, kSum>("u8 sum");
  std::printf(ok ? "OK\n" : "FAILED\n");
  return ok ? 0 : 1;
}
"#;

#[test]
fn the_window_holds_the_kernels_slot_kinds() {
    // check_desc() above asserts kSlotKinds == 9 in the header.
    assert_eq!(devcomm::reduce::plan::SLOT_KINDS, 9);
}

#[test]
fn piece_loops_reduce_in_rank_order_and_touch_nothing_else() {
    let dir = scratch_dir("reduce_loops");
    let Some(binary) = compile_cpp(&dir, "reduce_loops", SIMULATION, &["-O1"]) else {
        return;
    };
    run_ok(&binary);
    std::fs::remove_dir_all(&dir).unwrap();
}
