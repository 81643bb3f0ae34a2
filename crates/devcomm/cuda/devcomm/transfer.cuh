// devcomm/transfer.cuh: the send/recv protocol of one (peer, direction), shared by the send/recv
// kernels (kernels/sendrecv.cu) and the collectives (devcomm/collective.cuh). The protocol is
// docs/PROTOCOL.md: the bulk path stages chunks through per-channel slots with TAIL/HEAD
// signals, the low-latency path writes flag-in-data lines.
//
// The protocol (waits, slots, signals, counters) is separate from what moves the bytes: each
// function takes a *mover* that copies one chunk or one low-latency unit. Send/recv moves bytes
// (ByteSend / ByteRecv below); collectives move tiles through the user's hooks. Every byte
// count here is a count of *wire* bytes, the bytes that cross NVLink.
//
// A mover for the sending side provides
//   static constexpr dc_u64 kUnit;                         // 8 or 16: low-latency unit bytes
//   template <class G> void chunk(const G&, char* slot, dc_u64 off, dc_u64 n) const;
//       writes wire bytes [off, off + n) of the message into `slot` (called by all of G)
//   void unit(dc_u64 off, dc_u64 n, dc_u64 (&v)[kUnit / 8]) const;
//       one thread: the wire bytes [off, off + n) (n <= kUnit) as kUnit / 8 words
// and a mover for the receiving side
//   static constexpr dc_u64 kUnit;
//   template <class G> void chunk(const G&, const char* slot, dc_u64 off, dc_u64 n,
//                                 bool remote) const;   // remote: `slot` is the sender's memory
//   void unit(dc_u64 off, dc_u64 n, const dc_u64 (&v)[kUnit / 8]) const;
//
// The protocols live in one header each, all included here: transfer_common.cuh (spans, waits,
// the negotiation gate, the byte movers), bulk.cuh (staged chunks), ll.cuh (LL lines and the
// poll loop), ll128.cuh (LL128 lines), low_latency.cuh (a low-latency call of either kind).
#pragma once

#include "devcomm/transfer_common.cuh"
#include "devcomm/bulk.cuh"
#include "devcomm/ll.cuh"
#include "devcomm/ll128.cuh"
#include "devcomm/low_latency.cuh"
