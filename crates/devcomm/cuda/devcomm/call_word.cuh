// devcomm/call_word.cuh: the one encoding of the call agreement (docs/PROTOCOL.md, "Agreement").
//
// Every family tells each peer what its call is before anything is written, in one 8-byte
// word that a relaxed store carries whole: send/recv, the collectives and Comm::barrier through
// a ring of words per pair of ranks (agree.cuh), the reductions through a word per (rank, block)
// (reduce.cuh, "Call agreement"). The word is the same for all:
//
//   call number (low 16 bits) << 48 | payload (48 bits)
//
// The receiving side polls the word until it carries its own call number, then compares it with
// the word of its own call, field by field. A field has a code, which a mismatch record carries
// as its slot (src/cuda/error_record.rs, call_mismatch_field, names it), a place and a width.
// The payload's fields are those of the call's kind (CallKind): the send/recv family's kinds
// (send/recv, zero-copy, collective, barrier) share one ring, so their payload carries the kind;
// a reduction's slots hold reduction words only (its calls, or a zero-copy call's layout), so
// theirs do not:
//
//   send/recv family: kind (code 1) @40, 2 bits; then
//     send/recv, zero-copy, barrier: bytes (2) @0, 40 bits (1 TiB - 1, the largest message)
//     collective: operation (3) @36, 4 bits; the wire bytes with the peer (4) @0, 36 bits
//   reduction: mode (6) @46, 2 bits; element type (7) @43, 3; operator (8) @40, 3; hooked (9)
//              @39, 1; zero-copy (11) @38, 1; the bytes of the whole buffer (10) @0, 38 bits
//              (no GPU holds two buffers whose sizes differ by a multiple of 256 GiB)
//   reduction layout (a zero-copy reduction's places of its pool buffers): layout (12) @0, 48
//
// 16 bits of call number: a send/recv ring entry holds the call 6 calls back (the sender runs at
// most 5 calls ahead of the receiver's last started call); a reduction's entry holds the word of
// the last call in which that block ran on that rank.
// The network transport's chunk headers (net_p2p.cuh) carry the same fields in a struct, not a
// word, and name a mismatch by the same codes; code 5 is their call number.

#pragma once

#include "devcomm/handles.cuh"

namespace devcomm {

constexpr dc_u32 kCallShift = 48;
constexpr dc_u64 kCallNumberMask = (1ull << (64 - kCallShift)) - 1;
constexpr dc_u64 kPayloadMask = (1ull << kCallShift) - 1;

// What a call is.
enum CallKind : dc_u32 {
  kKindSendRecv = 0,     // the staged routes' send/recv (any protocol the size picks)
  kKindZeroCopy = 1,     // send_registered / recv_registered
  kKindCollective = 2,   // the all-to-all(-v), hooked send/recv, a reduction's network steps
  kKindBarrier = 3,      // Comm::barrier
  kKindReduction = 4,    // all-reduce, reduce-scatter, all-gather (reduce.cuh; not in the word)
  kKindReduceLayout = 5  // a zero-copy reduction's layout word (reduce.cuh, kZcLayout; ditto)
};

// Whether `kind` is of the send/recv family (its payload carries the kind).
DC_HOST_DEVICE inline bool p2p_kind(dc_u32 kind) { return kind < kKindReduction; }

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
    case kFieldKind: return CallField{code, kP2PBytesBits, 2};
    case kFieldP2PBytes: return CallField{code, 0, kP2PBytesBits};
    case kFieldCollOp: return CallField{code, kCollOpShift, 4};
    case kFieldCollBytes: return CallField{code, 0, kCollOpShift};
    case kFieldMode: return CallField{code, 46, 2};
    case kFieldDtype: return CallField{code, 43, 3};
    case kFieldOp: return CallField{code, 40, 3};
    case kFieldHooked: return CallField{code, 39, 1};
    case kFieldZeroCopy: return CallField{code, 38, 1};
    case kFieldBytes: return CallField{code, 0, kReduceBytesBits};
    default: return CallField{code, 0, kCallShift};  // kFieldLayout
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

// The word of call `call` (numbered from 1) of `kind` with `payload` (the send/recv family's
// payload below the kind field: bytes, or coll_payload).
DC_HOST_DEVICE inline dc_u64 call_word(dc_u64 call, dc_u32 kind, dc_u64 payload) {
  const dc_u64 p = p2p_kind(kind)
                       ? ((dc_u64)(kind & 3u) << kP2PBytesBits) | (payload & kP2PBytesMask)
                       : payload & kPayloadMask;
  return ((call & kCallNumberMask) << kCallShift) | p;
}

// The call number a word carries (its low 16 bits), as a timeout's record names it.
DC_HOST_DEVICE inline dc_u64 call_number(dc_u64 w) { return w >> kCallShift; }

// Whether word w carries call `call`.
DC_HOST_DEVICE inline bool call_word_is(dc_u64 w, dc_u64 call) {
  return call_number(w) == (call & kCallNumberMask);
}

// The first field in which `theirs` differs from `mine`, a word of `kind`, within the payload
// bits of `mask` (a send/recv family word's kind is always compared), in the order a mismatch is
// best named by; 0 when they agree.
DC_HOST_DEVICE inline dc_u32 call_differs(dc_u32 kind, dc_u64 mine, dc_u64 theirs,
                                          dc_u64 mask = kPayloadMask) {
  const dc_u64 diff = (mine ^ theirs) & kPayloadMask;
  if (p2p_kind(kind)) {
    if (diff & field_mask(kFieldKind)) return kFieldKind;
    const dc_u64 d = diff & mask & kP2PBytesMask;
    if (d == 0) return 0;
    if (kind == kKindCollective) return (d & kCollOpMask) ? kFieldCollOp : kFieldCollBytes;
    return kFieldP2PBytes;
  }
  const dc_u64 d = diff & mask;
  if (d == 0) return 0;
  if (kind == kKindReduceLayout) return kFieldLayout;
  const dc_u32 order[] = {kFieldMode, kFieldDtype, kFieldOp, kFieldHooked, kFieldZeroCopy};
  for (dc_u32 f : order) {
    if (d & field_mask(f)) return f;
  }
  return kFieldBytes;
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
