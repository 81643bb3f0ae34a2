// devcomm/handles.cuh: plain structs shared by the host (Rust, `src/handles.rs`) and the device.
//
// Every struct here has a Rust twin with the same size and field offsets. Both sides assert
// them: `static_assert` below, `const` assertions in Rust, and a CPU test compiles this header
// with the host C++ compiler and compares the offsets with Rust's. Change both sides together.
//
// This header compiles as host C++ (g++), as device code under NVRTC and under nvcc.
#pragma once

#if defined(__CUDACC_RTC__)
typedef unsigned long long dc_u64;
typedef long long dc_i64;
typedef unsigned int dc_u32;
typedef int dc_i32;
// NVRTC has neither <cstddef> nor __builtin_offsetof; __INTADDR__ is its front end's (EDG's)
// constant-expression form of offsetof.
#define DC_OFFSETOF(type, field) __INTADDR__(&(((type*)0)->field))
#else
#include <cstddef>
#include <cstdint>
typedef std::uint64_t dc_u64;
typedef std::int64_t dc_i64;
typedef std::uint32_t dc_u32;
typedef std::int32_t dc_i32;
#define DC_OFFSETOF(type, field) offsetof(type, field)
#endif

// Functions usable from host code and device code (plain host C++ included).
#if defined(__CUDACC__)
#define DC_HOST_DEVICE __host__ __device__
#else
#define DC_HOST_DEVICE
#endif

namespace devcomm {

// What a bounded wait was doing when it gave up. Values are stable: Rust decodes them.
enum DeviceOp : dc_u32 {
  kOpNone = 0,
  kOpWaitSignal = 1,     // wait_signal on a window slot
  kOpBarrier = 2,        // cross-rank barrier
  kOpSendSlotFree = 3,   // sender waiting for HEAD (receiver freed a staging slot)
  kOpRecvSlotFull = 4,   // receiver waiting for TAIL (sender filled a staging slot)
  kOpCountExchange = 5,  // all-to-all-v waiting for a peer's counts
  kOpCountOverflow = 6,  // all-to-all-v counts outside a buffer (no wait: expected = capacity)
  kOpZcReady = 7,        // zero-copy sender waiting for the receiver's descriptor (READY)
  kOpZcDone = 8,         // zero-copy receiver waiting for the sender's blocks (DONE)
  kOpZcMismatch = 9,     // zero-copy call whose two sides disagree (no wait: slot = field)
  kOpCeMismatch = 10,    // copy-engine chunk whose id or size is not the one expected (no
                         // wait: slot = the word in the peer's block, INTENT 4..8 or SIZE
                         // 8..12; expected = ours, seen = the slot's)
  kOpCallMismatch = 11,  // a call whose two sides differ (no wait: slot = field, expected = this
                         // side's value, seen = the peer's; devcomm/agree.cuh)
  kOpMoeDispatch = 12,   // MoE dispatch (direct path) waiting for a rank's rows (slot = rank)
  kOpMoeCombine = 13,    // MoE combine (direct path) waiting for a rank's sums (slot = world + rank)
  // The network transport (net.cuh, src/net/record.rs); slot = the queue's channel.
  kOpNetQueueFull = 20,      // a producer waited for a free queue entry (a credit)
  kOpNetPeerFailed = 21,     // the proxy found the peer failed (seen = UCX status)
  kOpNetFlush = 22,          // a producer's flush was not completed in time
  kOpNetBadDescriptor = 23,  // the proxy refused a descriptor (outside its registration)
  kOpUser = 100,         // waits issued by user code through the raw window ops
};

// The first failure a kernel of this process saw. Claimed once (flag 0 -> 1 by atomicCAS),
// filled in with `op` last, then `abort` is raised so every other wait of the process gives up
// at once. The host takes the record as complete once `op` is set (error_state::evaluate).
struct ErrorRecord {
  dc_u32 flag;        // @0  0 = empty, 1 = claimed
  dc_u32 op;          // @4  DeviceOp (0 while the claimer writes the other fields)
  dc_i32 rank;        // @8  rank that waited
  dc_i32 peer;        // @12 peer whose signal never came (-1 if not peer-specific)
  dc_u64 slot;        // @16 signal slot index
  dc_u64 expected;    // @24 value waited for
  dc_u64 seen;        // @32 last value read
  dc_u64 elapsed_ns;  // @40 how long it waited
};

// Lives in host-mapped pinned memory: the host reads it without synchronising the stream, and
// can raise `abort` to make every in-flight wait return.
struct DeviceErrorState {
  dc_u32 abort;         // @0 non-zero: every wait returns false at once
  dc_u32 reserved;      // @4
  ErrorRecord record;   // @8
  dc_u64 mirror;        // @56 device u64* (device memory): the first failing launch's token,
                        //     set with `abort`; 0: none (src/handles.rs)
};

// A symmetric window as kernels see it. Passed to kernels by value.
//
// Signal pad layout (each entry a u64, monotonic, never reset on the device):
//   [0, world_size)                         barrier slots, entry p written by rank p
//   [world_size, world_size + signal_count) user slots, index `slot` -> world_size + slot
struct DeviceWindow {
  dc_u64 data;          // @0  this rank's data region
  dc_u64 data_bytes;    // @8  bytes in the data region (same on every rank)
  dc_u64 signals;       // @16 this rank's signal pad (u64*), barrier slots first
  dc_u64 signal_count;  // @24 user slots per pad
  dc_u64 peer_data;     // @32 device u64[world_size]: each rank's data region as mapped here;
                        //     0 where there is no NVLink path; entry [rank] == data
  dc_u64 peer_signals;  // @40 device u64[world_size]: each rank's signal pad as mapped here
  dc_u64 error_state;   // @48 DeviceErrorState* (host-mapped)
  dc_u64 timeout_ns;    // @56 bound of every wait on this window
  dc_u64 barrier_epoch; // @64 device u64[2]: [0] this rank's barrier counter (not
                        //     peer-visible), [1] the address of the abort mirror (DeviceErrorState)
  dc_i32 rank;          // @72
  dc_i32 world_size;    // @76
};

// Peer addresses of a registered user buffer (what RegisteredBuffer::backend_window points to
// for NVLink registrations).
struct DevicePeerTable {
  dc_u64 peer_base;     // @0  device u64[world_size]: the buffer's base as mapped here, 0 if none
  dc_i32 rank;          // @8
  dc_i32 world_size;    // @12
};

// The registered-buffer handle of the source documents. Registration returns the device
// address of one of these; deregistration takes that address back.
struct RegisteredBuffer {
  dc_u64 base_ptr;        // @0
  dc_u64 size;            // @8
  dc_u64 backend_window;  // @16 DevicePeerTable* for NVLink registrations
  dc_u32 lkey;            // @24 key with the network transport; 0: none (NVLink only)
  dc_u32 reserved;        // @28
};

static_assert(sizeof(ErrorRecord) == 48, "ErrorRecord size");
static_assert(DC_OFFSETOF(ErrorRecord, slot) == 16, "ErrorRecord.slot");
static_assert(DC_OFFSETOF(ErrorRecord, elapsed_ns) == 40, "ErrorRecord.elapsed_ns");
static_assert(sizeof(DeviceErrorState) == 64, "DeviceErrorState size");
static_assert(DC_OFFSETOF(DeviceErrorState, mirror) == 56, "DeviceErrorState.mirror");
static_assert(DC_OFFSETOF(DeviceErrorState, record) == 8, "DeviceErrorState.record");
static_assert(sizeof(DeviceWindow) == 80, "DeviceWindow size");
static_assert(DC_OFFSETOF(DeviceWindow, peer_data) == 32, "DeviceWindow.peer_data");
static_assert(DC_OFFSETOF(DeviceWindow, barrier_epoch) == 64, "DeviceWindow.barrier_epoch");
static_assert(DC_OFFSETOF(DeviceWindow, rank) == 72, "DeviceWindow.rank");
static_assert(sizeof(DevicePeerTable) == 16, "DevicePeerTable size");
static_assert(sizeof(RegisteredBuffer) == 32, "RegisteredBuffer size");
static_assert(DC_OFFSETOF(RegisteredBuffer, backend_window) == 16, "RegisteredBuffer.backend_window");
static_assert(DC_OFFSETOF(RegisteredBuffer, lkey) == 24, "RegisteredBuffer.lkey");

}  // namespace devcomm
