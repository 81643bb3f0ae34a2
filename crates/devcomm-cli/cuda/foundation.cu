// crates/devcomm-cli/cuda/foundation.cu: GPU tests and micro-benchmarks of the device API, for
// the self-test and the benchmarks only (not shipped in the library).
//
// Every kernel is extern "C" (its lowered name is its plain name) and takes the window by value.
// Kernels that wait report failure through their status word and otherwise just return: after a
// failed wait they publish nothing more (CALLER CONTRACT in devcomm/wait.cuh); the host learns
// the details from the communicator's error state.
#include "devcomm/devcomm.cuh"

using devcomm::Block;
using devcomm::DeviceWindow;
using devcomm::Thread;

namespace {

// Block b's share of `bytes` split over `blocks` blocks in 16-byte aligned chunks: [begin, end).
__device__ __forceinline__ void block_chunk(dc_u64 bytes, dc_u64 blocks, dc_u64 b, dc_u64* begin,
                                            dc_u64* end) {
  const dc_u64 units = (bytes + 15) / 16;  // 16-byte units; the last one may be partial
  const dc_u64 per_block = (units + blocks - 1) / blocks;
  dc_u64 lo = b * per_block * 16;
  dc_u64 hi = lo + per_block * 16;
  if (lo > bytes) lo = bytes;
  if (hi > bytes) hi = bytes;
  *begin = lo;
  *end = hi;
}

}  // namespace

// Every block takes peers p = blockIdx.x, blockIdx.x + gridDim.x, ... (skipping itself and peers
// without NVLink): copies src[0, bytes_per_peer) into p's window at offset rank * bytes_per_peer
// and sets p's user slot `rank` to `round`. Rounds must grow from launch to launch. Needs
// signal_count >= world_size and data_bytes >= world_size * bytes_per_peer (else it traps).
extern "C" __global__ void put_signal_all(DeviceWindow w, const void* src, dc_u64 bytes_per_peer,
                                          dc_u64 round) {
  const Block block;
  for (int p = blockIdx.x; p < w.world_size; p += gridDim.x) {
    if (p == w.rank || devcomm::get_nvlink_address(w, p) == nullptr) continue;
    devcomm::put_signal(block, w, p, static_cast<dc_u64>(w.rank) * bytes_per_peer, src,
                        bytes_per_peer, static_cast<dc_u64>(w.rank), round);
  }
}

// Companion of put_signal_all (one block): waits until user slot p >= round for every NVLink
// peer p. status[0] = 1 if all came, 0 on timeout or abort.
extern "C" __global__ void wait_all(DeviceWindow w, dc_u64 round, int* status) {
  const Block block;
  for (int p = 0; p < w.world_size; ++p) {
    if (p == w.rank || devcomm::get_nvlink_address(w, p) == nullptr) continue;
    if (!devcomm::wait_signal(block, w, static_cast<dc_u64>(p), round, devcomm::Cmp::Ge, p)) {
      if (block.thread_rank() == 0) *status = 0;
      return;
    }
  }
  if (block.thread_rank() == 0) *status = 1;
}

// One block, `iters` iterations. Iteration i writes i+1 into every NVLink peer's window (a u64 at
// offset rank * 8), barriers, checks that every peer's u64 in OUR window is i+1, barriers again
// (so nobody overwrites before everyone checked). status[0] = 1 when every iteration passed;
// otherwise 0 and, if scratch is not null, scratch[0..3) = {iteration, peer, value seen}.
// Needs blockDim.x >= world_size. Proves the barrier orders plain stores and loads across GPUs.
extern "C" __global__ void barrier_loop(DeviceWindow w, dc_u64 iters, dc_u64* scratch,
                                        int* status) {
  const Block block;
  const int p = static_cast<int>(threadIdx.x);  // this thread's peer
  const bool mine = p < w.world_size && p != w.rank && devcomm::get_nvlink_address(w, p) != nullptr;
  const dc_u64* own = static_cast<const dc_u64*>(devcomm::get_nvlink_address(w, w.rank));
  for (dc_u64 i = 0; i < iters; ++i) {
    if (mine) static_cast<dc_u64*>(devcomm::get_nvlink_address(w, p))[w.rank] = i + 1;
    if (!devcomm::barrier(block, w)) {
      if (threadIdx.x == 0) *status = 0;
      return;
    }
    const dc_u64 seen = mine ? own[p] : i + 1;
    const bool bad = seen != i + 1;
    if (bad && scratch != nullptr) {  // racy among bad threads; any one report is fine
      scratch[0] = i;
      scratch[1] = static_cast<dc_u64>(p);
      scratch[2] = seen;
    }
    // Every rank stops at the same iteration only if all saw the same thing; a rank that stops
    // early makes the others time out in the next barrier, which is the failure we want loud.
    if (block.any(bad)) {
      if (threadIdx.x == 0) *status = 0;
      return;
    }
    if (!devcomm::barrier(block, w)) {
      if (threadIdx.x == 0) *status = 0;
      return;
    }
  }
  if (threadIdx.x == 0) *status = 1;
}

// Copies `bytes` from `peer`'s registered buffer (over NVLink) into local dst; the blocks split
// the range. Traps if the registration has no NVLink address for `peer` (check on the host).
extern "C" __global__ void read_registered(const devcomm::RegisteredBuffer* reg, int peer,
                                           void* dst, dc_u64 bytes) {
  const Block block;
  const unsigned char* src = static_cast<const unsigned char*>(devcomm::get_nvlink_address(reg, peer));
  if (src == nullptr) __trap();
  dc_u64 begin, end;
  block_chunk(bytes, gridDim.x, blockIdx.x, &begin, &end);
  devcomm::copy_bytes(block, static_cast<unsigned char*>(dst) + begin, src + begin, end - begin);
}

// Waits (one thread) for user slot `slot` to reach a value nobody sends. Exercises the timeout
// path: the error record names `peer` and `slot`; status[0] = 0 on the (expected) failure.
extern "C" __global__ void wait_forever(DeviceWindow w, int peer, dc_u64 slot, int* status) {
  const bool ok = devcomm::wait_signal(Thread{}, w, slot, ~0ull, devcomm::Cmp::Eq, peer);
  *status = ok ? 1 : 0;
}

// Ping-pong latency between this rank and `peer` on user slot 0 (one thread on each side). The
// smaller rank pings with base+i+1 and waits for the echo; the other echoes. elapsed_ns[0] = the
// whole loop (one-way latency = elapsed / (2 * iters)), or 0 if a wait failed. `base` is the
// number of rounds already done on this slot, so values stay monotonic across launches.
// Launch <<<1, 1>>> on both ranks; peer != rank.
extern "C" __global__ void pingpong(DeviceWindow w, int peer, dc_u64 iters, dc_u64 base,
                                    dc_u64* elapsed_ns) {
  const Thread self;
  const bool pinger = w.rank < peer;
  const dc_u64 start = devcomm::globaltimer_ns();
  for (dc_u64 i = 0; i < iters; ++i) {
    const dc_u64 v = base + i + 1;
    if (pinger) devcomm::signal(w, peer, 0, v);
    if (!devcomm::wait_signal(self, w, 0, v, devcomm::Cmp::Ge, peer)) {
      *elapsed_ns = 0;
      return;
    }
    if (!pinger) devcomm::signal(w, peer, 0, v);
  }
  *elapsed_ns = devcomm::globaltimer_ns() - start;
}

// Every thread of the grid, for copies only (copy_bytes needs thread_rank and size; a grid has
// no barrier without a cooperative launch, so sync and any are deliberately absent).
struct GridThreads {
  __device__ __forceinline__ dc_u32 thread_rank() const {
    return blockIdx.x * blockDim.x + threadIdx.x;
  }
  __device__ __forceinline__ dc_u32 size() const { return gridDim.x * blockDim.x; }
};

// Pushes src[0, bytes) into `peer`'s window data at offset 0, the whole grid striding over the
// range 16 bytes per thread (consecutive threads write consecutive vectors across blocks:
// measured faster at 1 MiB than a contiguous range per block). No signal: the host times the
// launch with events, and kernel completion makes the stores visible.
extern "C" __global__ void put_bandwidth(DeviceWindow w, int peer, const void* src, dc_u64 bytes) {
  devcomm::put(GridThreads{}, w, peer, 0, src, bytes);
}

// Copies src[0, bytes) to dst (local or a peer's mapped window) by the Tensor Memory Accelerator:
// bulk loads into shared memory (completing on an mbarrier) and bulk stores out of it, lane 0 of
// every warp running its own pipeline of `stages` buffers of `chunk` bytes, the grid's warps
// taking chunks in turn. Measures whether bulk stores over NVLink pass the SM store ceiling
// (docs/PERFORMANCE.md, v11). bytes and chunk must be multiples of 16; dynamic shared memory
// is warps * stages * (chunk + 8) bytes. No signal: kernel completion makes the writes visible.
extern "C" __global__ void copy_bandwidth_tma(void* dst, const void* src, dc_u64 bytes,
                                              dc_u32 chunk, dc_u32 stages) {
  extern __shared__ __align__(128) unsigned char smem[];
  const dc_u32 warp = threadIdx.x / 32;
  const dc_u32 warps = blockDim.x / 32;
  if ((threadIdx.x & 31) != 0) return;
  unsigned char* buf = smem + static_cast<dc_u64>(warp) * stages * chunk;
  dc_u64* bars = reinterpret_cast<dc_u64*>(smem + static_cast<dc_u64>(warps) * stages * chunk) +
                 static_cast<dc_u64>(warp) * stages;
  const dc_u32 buf_s = static_cast<dc_u32>(__cvta_generic_to_shared(buf));
  const dc_u32 bar_s = static_cast<dc_u32>(__cvta_generic_to_shared(bars));
  for (dc_u32 s = 0; s < stages; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_s + 8 * s) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const dc_u64 nchunks = (bytes + chunk - 1) / chunk;
  const dc_u64 first = static_cast<dc_u64>(blockIdx.x) * warps + warp;
  const dc_u64 stride = static_cast<dc_u64>(gridDim.x) * warps;
  auto load = [&](dc_u64 k) {  // k-th chunk of this warp into stage k % stages
    const dc_u64 c = first + k * stride;
    if (c >= nchunks) return;
    const dc_u64 off = c * chunk;
    const dc_u32 n = static_cast<dc_u32>(bytes - off < chunk ? bytes - off : chunk);
    const dc_u32 s = static_cast<dc_u32>(k % stages);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_s + 8 * s),
                 "r"(n)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(buf_s + s * chunk),
        "l"(static_cast<const unsigned char*>(src) + off), "r"(n), "r"(bar_s + 8 * s)
        : "memory");
  };
  for (dc_u32 k = 0; k < stages; ++k) load(k);
  for (dc_u64 k = 0; first + k * stride < nchunks; ++k) {
    const dc_u64 off = (first + k * stride) * chunk;
    const dc_u32 n = static_cast<dc_u32>(bytes - off < chunk ? bytes - off : chunk);
    const dc_u32 s = static_cast<dc_u32>(k % stages);
    const dc_u32 parity = static_cast<dc_u32>((k / stages) & 1);
    dc_u32 done = 0;
    while (!done) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(bar_s + 8 * s), "r"(parity)
          : "memory");
    }
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                     static_cast<unsigned char*>(dst) + off),
                 "r"(buf_s + s * chunk), "r"(n)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    // The store before this one has read its buffer: refill that stage.
    asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    if (k >= 1) load(k - 1 + stages);
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Byte i of what rank `from` puts into rank `to`'s window in round r (fresh every round).
// Twin of `routed_byte` in src/selftest/net/window.rs.
__device__ __forceinline__ unsigned char routed_byte(int from, int to, dc_u64 r, dc_u64 i) {
  dc_u64 x = (i + 1) * 0x9E3779B97F4A7C15ull;
  x ^= r * 0xD1B54A32D192ED03ull + (static_cast<dc_u64>(from) << 40) +
       (static_cast<dc_u64>(to) << 52);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<unsigned char>(x >> 56);
}

// Adds to *bad the bytes of got[0, chunk) (what `from` put for `to` in round r) that differ
// from routed_byte; the threads of the block share the range.
__device__ inline void count_wrong(const unsigned char* got, int from, int to, dc_u64 r,
                                   dc_u64 chunk, unsigned long long* bad) {
  unsigned long long wrong = 0;
  for (dc_u64 i = threadIdx.x; i < chunk; i += blockDim.x)
    wrong += got[i] != routed_byte(from, to, r, i);
  if (wrong != 0) atomicAdd(bad, wrong);
}

// Rounds [first, first + rounds) of puts with signals between every pair of ranks, each peer
// over its own route (NVLink stores or the network queues: window_net.cuh). Block p serves peer
// p (one producer per (peer, channel), channel 0). Window data: [p * chunk, (p + 1) * chunk) is
// the source for peer p, [(W + p) * chunk, ...) what p put here; user slots [0, W): p's round
// (set), [W, 2W): p's acknowledgements (a counter). Round r: wait until p took round r - 1
// (acknowledged), flush, write the source, put it with signal r, wait for p's round r, compare
// every byte (mismatches added to *bad), acknowledge. Rounds count from 1 across launches on one
// window. status[0] = 0 when a wait gave up (recorded in the error state).
extern "C" __global__ void routed_rounds(DeviceWindow w, devcomm::WindowNet n, dc_u64 chunk,
                                         dc_u64 first, dc_u64 rounds, unsigned long long* bad,
                                         int* status) {
  const Block block;
  const int p = static_cast<int>(blockIdx.x);
  if (p >= w.world_size || p == w.rank) return;
  const dc_u64 world = static_cast<dc_u64>(w.world_size);
  unsigned char* data = static_cast<unsigned char*>(devcomm::get_nvlink_address(w, w.rank));
  bool ok = true;
  for (dc_u64 r = first; r < first + rounds && ok; ++r) {
    if (r > 1) ok = devcomm::wait_signal(block, w, world + p, r - 1, devcomm::Cmp::Ge, p);
    ok = ok && devcomm::flush_routed(block, w, n, p);
    if (!ok) break;
    unsigned char* src = data + static_cast<dc_u64>(p) * chunk;
    for (dc_u64 i = threadIdx.x; i < chunk; i += blockDim.x) src[i] = routed_byte(w.rank, p, r, i);
    ok = devcomm::put_signal_routed(block, w, n, p, (world + w.rank) * chunk,
                                    static_cast<dc_u64>(p) * chunk, chunk, w.rank, r);
    ok = ok && devcomm::wait_signal(block, w, p, r, devcomm::Cmp::Ge, p);
    if (!ok) break;
    count_wrong(data + (world + p) * chunk, p, w.rank, r, chunk, bad);
    ok = devcomm::signal_add_routed(block, w, n, p, world + w.rank, 1);
  }
  ok = ok && devcomm::flush_routed(block, w, n, p);
  if (!ok && threadIdx.x == 0) *status = 0;
}

// barrier_loop over every peer with the routed operations (one block, blockDim.x >= world_size):
// iteration i, thread p puts i + 1 from word W + p of this rank's window into word `rank` of
// p's window (put_routed, channel 0), barrier_routed (channel 0: ordered after the puts), every
// peer's word in OUR window must be i + 1, barrier_routed again. status[0] = 1 when every
// iteration passed; otherwise 0 and scratch[0..3) = {iteration, peer, value seen}.
extern "C" __global__ void routed_barrier_loop(DeviceWindow w, devcomm::WindowNet n, dc_u64 iters,
                                               dc_u64* scratch, int* status) {
  const Block block;
  const int p = static_cast<int>(threadIdx.x);
  const bool mine = p < w.world_size && p != w.rank;
  dc_u64* own = static_cast<dc_u64*>(devcomm::get_nvlink_address(w, w.rank));
  const dc_u64 world = static_cast<dc_u64>(w.world_size);
  for (dc_u64 i = 0; i < iters; ++i) {
    bool ok = true;
    if (mine) {
      own[world + p] = i + 1;
      ok = devcomm::put_routed(Thread{}, w, n, p, static_cast<dc_u64>(w.rank) * 8,
                               (world + p) * 8, 8);
    }
    ok = !block.any(!ok) && devcomm::barrier_routed(block, w, n);
    if (!ok) {
      if (threadIdx.x == 0) *status = 0;
      return;
    }
    const dc_u64 seen = mine ? reinterpret_cast<volatile dc_u64*>(own)[p] : i + 1;
    const bool bad = seen != i + 1;
    if (bad) {
      scratch[0] = i;
      scratch[1] = static_cast<dc_u64>(p);
      scratch[2] = seen;
    }
    if (block.any(bad) || !devcomm::barrier_routed(block, w, n)) {
      if (threadIdx.x == 0) *status = 0;
      return;
    }
  }
  if (threadIdx.x == 0) *status = 1;
}

// One round of puts from this rank's buffer of registration `reg` into every peer's buffer of
// it (put_registered_routed on channel 1: NVLink stores, or a network put under reg->lkey),
// each followed by signal_routed of `round` in user slot `rank` of the window (same channel:
// ordered after the put); then the peer's data is compared (mismatches added to *bad) and the
// channel flushed. Buffer: [p * chunk, ...) the source for peer p, [(W + p) * chunk, ...) what
// p put here. Block p serves peer p. Rounds grow from launch to launch; the host synchronises
// every rank between launches. status[0] = 0 when a wait gave up.
extern "C" __global__ void routed_registered(DeviceWindow w, devcomm::WindowNet n,
                                             const devcomm::RegisteredBuffer* reg, dc_u64 chunk,
                                             dc_u64 round, unsigned long long* bad, int* status) {
  const Block block;
  const int p = static_cast<int>(blockIdx.x);
  if (p >= w.world_size || p == w.rank) return;
  const dc_u64 world = static_cast<dc_u64>(w.world_size);
  unsigned char* data = reinterpret_cast<unsigned char*>(reg->base_ptr);
  unsigned char* src = data + static_cast<dc_u64>(p) * chunk;
  for (dc_u64 i = threadIdx.x; i < chunk; i += blockDim.x)
    src[i] = routed_byte(w.rank, p, round, i);
  bool ok = devcomm::put_registered_routed(block, w, n, reg, p, (world + w.rank) * chunk,
                                           static_cast<dc_u64>(p) * chunk, chunk, 1);
  ok = ok && devcomm::signal_routed(block, w, n, p, static_cast<dc_u64>(w.rank), round, 1);
  ok = ok && devcomm::wait_signal(block, w, static_cast<dc_u64>(p), round, devcomm::Cmp::Ge, p);
  if (ok) {
    count_wrong(data + (world + p) * chunk, p, w.rank, round, chunk, bad);
  }
  ok = ok && devcomm::flush_routed(block, w, n, p, 1);
  if (!ok && threadIdx.x == 0) *status = 0;
}
