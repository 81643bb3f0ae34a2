// devcomm/trace.cuh: per-block timeline events of the kernels (docs/TRACING.md).
//
// With tracing on (DEVCOMM_TRACE=1) the JIT compiles every kernel with -DDC_TRACE=1: the
// DC_TRACE_* macros below then record `TraceEvent`s with %globaltimer into this rank's ring
// (`TraceRing`, device memory, one per communicator), whose address the host writes into the
// module's global `dc_trace_ring` once after loading the module. Without DC_TRACE the macros
// expand to nothing and this header adds no code, no global and no launch argument: an untraced
// kernel is the kernel of a build without this feature.
//
// The ring never wraps: a writer claims index i with one atomicAdd on `claimed` and writes
// record i only when i < capacity; a claim past the end is dropped, and the drops are counted
// by `claimed` itself (dropped = claimed - capacity). No record is ever written twice, so none
// can be torn by a later writer. The host reads the ring after synchronising (`Comm::
// trace_events`) and clears it (`claimed` = 0).
//
// Layout shared with Rust (`src/trace/ring.rs`), checked by tests/trace_layout.rs.
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"

namespace devcomm {

// One event: 32 bytes.
struct TraceEvent {
  dc_u64 time_ns;  // %globaltimer when it was recorded
  dc_u64 arg;      // bytes moved (kTraceBytes, kTracePhaseEnd), or the kind's argument
  dc_u32 call;     // the host's call id (TraceRing::call at the kernel's start)
  unsigned short kind;   // TraceKind
  unsigned short phase;  // TracePhase (0: none)
  unsigned short block;  // blockIdx.x
  unsigned short peer;   // the peer rank (0xffff: none)
  dc_u32 slot;     // the signal slot or step waited on (waits), else 0
};

// The ring's header; `capacity` records follow at `kTraceHeaderBytes`.
struct TraceRing {
  dc_u64 claimed;   // records claimed so far (atomicAdd); may exceed capacity
  dc_u64 capacity;  // records that fit
  dc_u32 call;      // id of the current call, written in stream order before its kernels
  dc_u32 rank;      // the communicator's rank (for readers of a raw dump)
  dc_u64 reserved[5];
};

constexpr dc_u64 kTraceHeaderBytes = 64;
constexpr unsigned short kTraceNoPeer = 0xffff;

// Event kinds. Values are stable: Rust decodes them.
enum TraceKind : unsigned short {
  kTraceKernelBegin = 1,  // a block starts (after waiting for the previous kernel)
  kTraceKernelEnd = 2,    // a block ends (not recorded when it stops on an error)
  kTracePhaseBegin = 3,   // a phase starts (phase, peer)
  kTracePhaseEnd = 4,     // a phase ends (phase, peer, arg: bytes it moved)
  kTraceWaitBegin = 5,    // a wait for a peer starts (peer, slot)
  kTraceWaitEnd = 6,      // the wait is over (peer, slot)
  kTraceBytes = 7,        // an instant: arg bytes moved to or from peer
};

// Phases. Values are stable: Rust names them.
enum TracePhase : unsigned short {
  kPhaseNone = 0,
  kPhaseStage = 1,     // copy input into a window (own or a peer's)
  kPhaseWait = 2,      // wait for a peer's data or release
  kPhaseReduce = 3,    // combine every rank's piece
  kPhaseWriteOut = 4,  // write results into the output
  kPhaseSend = 5,      // a send role moves its data
  kPhaseRecv = 6,      // a receive role moves its data
  kPhaseAgree = 7,     // the call agreement
};

static_assert(sizeof(TraceEvent) == 32, "TraceEvent is 32 bytes");
static_assert(sizeof(TraceRing) == kTraceHeaderBytes, "TraceRing header is 64 bytes");

}  // namespace devcomm

#if defined(DC_TRACE) && DC_TRACE && defined(__CUDACC__)

// Set by the host once per loaded module (cuModuleGetGlobal); null: nothing is recorded.
__device__ devcomm::TraceRing* dc_trace_ring;

namespace devcomm {

// Claims one record and fills it; a claim past the end only counts as dropped.
__device__ __noinline__ void trace_record(unsigned short kind, unsigned short phase, int peer,
                                          dc_u32 slot, dc_u64 arg) {
  TraceRing* r = dc_trace_ring;
  if (r == nullptr) return;
  const dc_u64 t = globaltimer_ns();
  const dc_u64 i = atomicAdd(reinterpret_cast<unsigned long long*>(&r->claimed), 1ull);
  if (i >= r->capacity) return;
  TraceEvent* e = reinterpret_cast<TraceEvent*>(reinterpret_cast<char*>(r) + kTraceHeaderBytes) + i;
  e->time_ns = t;
  e->arg = arg;
  e->call = *reinterpret_cast<volatile dc_u32*>(&r->call);
  e->phase = phase;
  e->block = (unsigned short)blockIdx.x;
  e->peer = peer < 0 ? kTraceNoPeer : (unsigned short)peer;
  e->slot = slot;
  e->kind = kind;
}

}  // namespace devcomm

// Records when `leader` (one thread of the recording group) is true.
#define DC_TRACE_EVENT_BY(leader, kind, phase, peer, slot, arg) \
  do {                                                           \
    if (leader) ::devcomm::trace_record((kind), (phase), (peer), (slot), (arg)); \
  } while (0)

#else

#define DC_TRACE_EVENT_BY(leader, kind, phase, peer, slot, arg) \
  do {                                                           \
  } while (0)

#endif

// Thread 0 of the block records.
#define DC_TRACE_EVENT(kind, phase, peer, slot, arg) \
  DC_TRACE_EVENT_BY(threadIdx.x == 0, kind, phase, peer, slot, arg)
// The usual pairs, recorded by thread 0 of the block.
#define DC_TRACE_KERNEL_BEGIN() DC_TRACE_EVENT(::devcomm::kTraceKernelBegin, 0, -1, 0, 0)
#define DC_TRACE_KERNEL_END(bytes) DC_TRACE_EVENT(::devcomm::kTraceKernelEnd, 0, -1, 0, (bytes))
#define DC_TRACE_PHASE_BEGIN(phase, peer) \
  DC_TRACE_EVENT(::devcomm::kTracePhaseBegin, (phase), (peer), 0, 0)
#define DC_TRACE_PHASE_END(phase, peer, bytes) \
  DC_TRACE_EVENT(::devcomm::kTracePhaseEnd, (phase), (peer), 0, (bytes))
#define DC_TRACE_WAIT_BEGIN(peer, slot) \
  DC_TRACE_EVENT(::devcomm::kTraceWaitBegin, ::devcomm::kPhaseWait, (peer), (slot), 0)
#define DC_TRACE_WAIT_END(peer, slot) \
  DC_TRACE_EVENT(::devcomm::kTraceWaitEnd, ::devcomm::kPhaseWait, (peer), (slot), 0)
