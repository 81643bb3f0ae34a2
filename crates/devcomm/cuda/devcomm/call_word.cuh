// devcomm/call_word.cuh: the one encoding of the call agreement (docs/PROTOCOL.md, "Agreement").
//
// Every family tells each peer what its call is before anything is written, in one 8-byte
// word that a relaxed store carries whole: send/recv, the collectives and Comm::barrier through
// a ring of words per pair of ranks (agree.cuh), the reductions through a word per (rank, block)
// (reduce.cuh, "Call agreement"). The word is the same for all:
//
//   call number (low 13 bits) << 51 | kind (3 bits) << 48 | payload (48 bits)
//
// The receiving side polls the word until it carries its own call number (a stale word holds
// an earlier call of the same ring entry, at most 6 calls back, whose low 13 bits differ), then
// compares it with the word of its own call, field by field. A field has a code, which a
// mismatch record carries as its slot (src/cuda/error_record.rs, call_mismatch_field, names
// it), a place and a width; the fields of a payload depend on the kind:
//
//   kind (code 1)                every word
//   send/recv, zero-copy, barrier: bytes (2) @0, 40 bits (1 TiB - 1, the largest message)
//   collective: operation (3) @36, 4 bits; the wire bytes with the peer (4) @0, 36 bits
//   reduction: mode (6) @46, 2 bits; element type (7) @43, 3; operator (8) @40, 3; hooked (9)
//              @39, 1; zero-copy (11) @38, 1; the bytes of the whole buffer (10) @0, 38 bits
//              (no GPU holds two buffers whose sizes differ by a multiple of 256 GiB)
//   reduction layout (a zero-copy reduction's places of its pool buffers): layout (12) @0, 48
//
// The network transport's chunk headers (net_p2p.cuh) carry the same fields in a struct, not a
// word, and name a mismatch by the same codes; code 5 is their call number.

#pragma once

#include "devcomm/handles.cuh"

namespace devcomm {

constexpr dc_u32 kCallShift = 51, kCallKindShift = 48;
constexpr dc_u64 kCallNumberMask = (1ull << (64 - kCallShift)) - 1;
constexpr dc_u64 kPayloadMask = (1ull << kCallKindShift) - 1;

// What a call is.
enum CallKind : dc_u32 {
  kKindSendRecv = 0,    // the staged routes' send/recv (any protocol the size picks)
  kKindZeroCopy = 1,    // send_registered / recv_registered
  kKindCollective = 2,  // the all-to-all(-v), hooked send/recv, a reduction's network steps
  kKindBarrier = 3,     // Comm::barrier
  kKindReduction = 4,   // all-reduce, reduce-scatter, all-gather (reduce.cuh)
  kKindReduceLayout = 5 // a zero-copy reduction's layout word (reduce.cuh, kZcLayout)
};

// A field of a word: its code (a mismatch record's slot), place and width.
struct CallField {
  dc_u32 code;
  dc_u32 shift;
  dc_u32 bits;
};

// Field codes.
constexpr dc_u32 kFieldKind = 1, kFieldP2PBytes = 2, kFieldCollOp = 3, kFieldCollBytes = 4,
                 kFieldNetCall = 5, kFieldMode = 6, kFieldDtype = 7, kFieldOp = 8, kFieldHooked = 9,
                 kFieldBytes = 10, kFieldZeroCopy = 11, kFieldLayout = 12;

// Widths of the payloads' sizes.
constexpr dc_u32 kP2PBytesBits = 40, kCollOpShift = 36, kReduceBytesBits = 38;
constexpr dc_u64 kP2PBytesMask = (1ull << kP2PBytesBits) - 1;
constexpr dc_u64 kCollBytesMask = (1ull << kCollOpShift) - 1;
constexpr dc_u64 kCollOpMask = kP2PBytesMask & ~kCollBytesMask;

// The place and width of field `code` (the same in every kind that has it).
DC_HOST_DEVICE inline CallField call_field(dc_u32 code) {
  switch (code) {
    case kFieldKind: return CallField{code, kCallKindShift, 3};
    case kFieldP2PBytes: return CallField{code, 0, kP2PBytesBits};
    case kFieldCollOp: return CallField{code, kCollOpShift, 4};
    case kFieldCollBytes: return CallField{code, 0, kCollOpShift};
    case kFieldMode: return CallField{code, 46, 2};
    case kFieldDtype: return CallField{code, 43, 3};
    case kFieldOp: return CallField{code, 40, 3};
    case kFieldHooked: return CallField{code, 39, 1};
    case kFieldZeroCopy: return CallField{code, 38, 1};
    case kFieldBytes: return CallField{code, 0, kReduceBytesBits};
    default: return CallField{code, 0, kCallKindShift};  // kFieldLayout
  }
}

// The bits of field `code` in a word.
DC_HOST_DEVICE inline dc_u64 field_mask(dc_u32 code) {
  const CallField f = call_field(code);
  return ((1ull << f.bits) - 1) << f.shift;
}

// The value of field `code` in word (or payload) w.
DC_HOST_DEVICE inline dc_u64 field_value(dc_u64 w, dc_u32 code) {
  const CallField f = call_field(code);
  return (w >> f.shift) & ((1ull << f.bits) - 1);
}

// The word of call `call` (numbered from 1) of `kind` with `payload`.
DC_HOST_DEVICE inline dc_u64 call_word(dc_u64 call, dc_u32 kind, dc_u64 payload) {
  return ((call & kCallNumberMask) << kCallShift) | ((dc_u64)(kind & 7u) << kCallKindShift) |
         (payload & kPayloadMask);
}

DC_HOST_DEVICE inline dc_u32 call_kind(dc_u64 w) { return (dc_u32)((w >> kCallKindShift) & 7u); }
DC_HOST_DEVICE inline dc_u64 call_payload(dc_u64 w) { return w & kPayloadMask; }
// The call number a word carries (its low 13 bits), as a timeout's record names it.
DC_HOST_DEVICE inline dc_u64 call_number(dc_u64 w) { return w >> kCallShift; }

// Whether word w carries call `call` (a word never written, 0, carries none: calls start at 1
// and a ring entry is written before its number's low bits come round again).
DC_HOST_DEVICE inline bool call_word_is(dc_u64 w, dc_u64 call) {
  return call_number(w) == (call & kCallNumberMask);
}

// The first field in which `theirs` differs from `mine` within the payload bits of `mask`
// (the kind is always compared), in the order a mismatch is best named by; 0 when they agree.
DC_HOST_DEVICE inline dc_u32 call_differs(dc_u64 mine, dc_u64 theirs,
                                          dc_u64 mask = kPayloadMask) {
  if (call_kind(mine) != call_kind(theirs)) return kFieldKind;
  const dc_u64 diff = (mine ^ theirs) & mask & kPayloadMask;
  if (diff == 0) return 0;
  switch (call_kind(mine)) {
    case kKindCollective: return (diff & kCollOpMask) ? kFieldCollOp : kFieldCollBytes;
    case kKindReduction: {
      const dc_u32 order[] = {kFieldMode, kFieldDtype, kFieldOp, kFieldHooked, kFieldZeroCopy};
      for (dc_u32 f : order) {
        if (diff & field_mask(f)) return f;
      }
      return kFieldBytes;
    }
    case kKindReduceLayout: return kFieldLayout;
    default: return kFieldP2PBytes;
  }
}

// A collective's payload: its operation (4 bits) above the wire bytes with the peer.
DC_HOST_DEVICE inline dc_u64 coll_payload(dc_u32 op, dc_u64 wire_bytes) {
  return ((dc_u64)(op & 15u) << kCollOpShift) | (wire_bytes & kCollBytesMask);
}

// A reduction's payload.
DC_HOST_DEVICE inline dc_u64 reduce_payload(dc_u32 mode, dc_u32 dtype, dc_u32 op, dc_u32 hooked,
                                            dc_u64 bytes, dc_u32 zero_copy = 0) {
  return ((dc_u64)(mode & 3u) << 46) | ((dc_u64)(dtype & 7u) << 43) | ((dc_u64)(op & 7u) << 40) |
         ((dc_u64)(hooked & 1u) << 39) | ((dc_u64)(zero_copy & 1u) << 38) |
         (bytes & ((1ull << kReduceBytesBits) - 1));
}

}  // namespace devcomm
