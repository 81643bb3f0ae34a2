// devcomm/p2p.cuh: the launch arguments of the send/recv kernels (docs/PROTOCOL.md).
//
// Rust twin: src/abi/p2p_launch.rs (sizes and offsets asserted on both sides, compared by
// tests/layout.rs).
#pragma once

#include "devcomm/call_word.cuh"
#include "devcomm/handles.cuh"

namespace devcomm {

// One direction of a call as a kernel sees it. `peer < 0` means the role is unused.
// Sender and receiver must agree on `blocks`, `chunk_bytes` and `low_latency` for a message:
// the host derives all three from the message size alone (src/p2p/config.rs).
struct P2PSide {
  dc_u64 buf;          // @0  source (send) or destination (recv)
  dc_u64 bytes;        // @8  message size
  dc_u64 steps;        // @16 device u64[max_channels]: bulk step counter per channel (warp)
  dc_u64 ll_steps;     // @24 device u64[max_blocks]: low-latency call counter per block
  dc_u64 chunk_bytes;  // @32 bulk bytes per pipeline step of one channel (<= slot_stride)
  dc_i32 peer;         // @40
  dc_u32 blocks;       // @44 blocks of this role (<= max_blocks); channels = blocks x warps
  dc_u32 low_latency;  // @48 0: staged bulk; 1: LL, 16-byte flag-in-data lines; 2: LL128,
                       //     128-byte lines of 120 (or 112) payload bytes and a flag
  dc_u32 pull;         // @52 send side of a bulk message. 0: push (staging in the receiver's
                       //     window, written over NVLink); 1: pull (staging in the sender's own
                       //     window, read by the receiver over NVLink). The receiver learns it
                       //     per chunk from the MODE word (below), so it may differ per call.
                       //     Copy-engine message, either side: 1 moves this side's copy-engine
                       //     half by SMs instead (the sender's pushed chunks, the receiver's
                       //     pulled ones); a local choice, the slots and signals are the same.
                       //     Bit 1 (kSideGated) and bit 2 (kSideAnnounce): the layout of a
                       //     large message with default settings is negotiated (below).
};

// Large messages with default settings (docs/PROTOCOL.md, "Copy engine"): a side whose launch
// has only this role uses the copy-engine layout and its copy engine, and announces that
// (kSideAnnounce: TYPE = seq << 1 | 1). A launch with two roles runs one kernel,
// p2p_negotiated_kernel: each gated role (kSideGated) has a deciding thread that announces
// TYPE = seq << 1, reads the peer's TYPE for the same message and records DECISION: the
// copy-engine layout moved by SMs (kDecisionCe) if the peer is alone in its launch, the staged
// protocol (kDecisionStaged) if not, kDecisionFailed if its wait failed. Every block of the
// role waits for DECISION and runs the layout chosen; the role's last block out puts DECISION
// back to 0 for the next message (docs/PROTOCOL.md, "Which large messages use it").
constexpr dc_u32 kSidePull = 1u, kSideGated = 2u, kSideAnnounce = 4u;
constexpr dc_u64 kDecisionCe = 1, kDecisionStaged = 2, kDecisionFailed = 3;

// Everything one send/recv launch needs.
struct P2PLaunch {
  DeviceWindow w;          // @0   the p2p window: staging regions + signal pad
  P2PSide send;            // @80
  P2PSide recv;            // @136
  dc_u64 slot_stride;      // @192 bytes between two slots of staging
  dc_u64 region_bytes;     // @200 one sender's region in a receiver's window
  dc_u64 ll_offset;        // @208 where the low-latency lines start inside a region
  dc_u64 ll_parity_bytes;  // @216 bytes of one parity's lines
  dc_u32 max_blocks;       // @224 most blocks per direction (low-latency credit slots)
  dc_u32 depth;            // @228 staging slots per channel
  dc_u32 max_channels;     // @232 most bulk channels (warps) per direction
  dc_u32 mode_slot0;       // @236 first MODE user slot (below)
};

static_assert(sizeof(P2PSide) == 56, "P2PSide size");
static_assert(DC_OFFSETOF(P2PSide, chunk_bytes) == 32, "P2PSide.chunk_bytes");
static_assert(DC_OFFSETOF(P2PSide, peer) == 40, "P2PSide.peer");
static_assert(DC_OFFSETOF(P2PSide, low_latency) == 48, "P2PSide.low_latency");
static_assert(DC_OFFSETOF(P2PSide, pull) == 52, "P2PSide.pull");
static_assert(sizeof(P2PLaunch) == 240, "P2PLaunch size");
static_assert(DC_OFFSETOF(P2PLaunch, max_channels) == 232, "P2PLaunch.max_channels");
static_assert(DC_OFFSETOF(P2PLaunch, send) == 80, "P2PLaunch.send");
static_assert(DC_OFFSETOF(P2PLaunch, recv) == 136, "P2PLaunch.recv");
static_assert(DC_OFFSETOF(P2PLaunch, slot_stride) == 192, "P2PLaunch.slot_stride");
static_assert(DC_OFFSETOF(P2PLaunch, max_blocks) == 224, "P2PLaunch.max_blocks");
static_assert(DC_OFFSETOF(P2PLaunch, mode_slot0) == 236, "P2PLaunch.mode_slot0");

// A launch with two roles at least one of which is negotiated (p2p_negotiated_kernel): `a`
// holds each role's staged side (a gated one carries kSideGated), `ce_send` and `ce_recv` the
// copy-engine sides of gated roles (moved by SMs: kSidePull | kSideGated), and `threads` each
// role's threads per block (a gated role's are the kernel's).
struct P2PNegotiated {
  P2PLaunch a;         // @0
  P2PSide ce_send;     // @240
  P2PSide ce_recv;     // @296
  dc_u32 threads[2];   // @352 send, recv
};

static_assert(sizeof(P2PNegotiated) == 360, "P2PNegotiated size");
static_assert(DC_OFFSETOF(P2PNegotiated, ce_send) == 240, "P2PNegotiated.ce_send");
static_assert(DC_OFFSETOF(P2PNegotiated, ce_recv) == 296, "P2PNegotiated.ce_recv");
static_assert(DC_OFFSETOF(P2PNegotiated, threads) == 352, "P2PNegotiated.threads");

// Window data of the p2p window: W regions, one per sender (push staging, then the LL lines of
// two parities, then the LL128 lines of two parities), then W outboxes, one per receiver (pull
// staging, ll_offset bytes each: the same channel x depth x slot layout as a region's staging).
// The LL128 lines fill the rest of a region, so their size needs no field of its own.
DC_HOST_DEVICE inline dc_u64 p2p_inbox_offset(const P2PLaunch& a, int sender) {
  return (dc_u64)sender * a.region_bytes;
}
DC_HOST_DEVICE inline dc_u64 p2p_ll128_offset(const P2PLaunch& a) {
  return a.ll_offset + 2 * a.ll_parity_bytes;
}
DC_HOST_DEVICE inline dc_u64 p2p_ll128_parity_bytes(const P2PLaunch& a) {
  return (a.region_bytes - p2p_ll128_offset(a)) / 2;
}
DC_HOST_DEVICE inline dc_u64 p2p_outbox_offset(const P2PLaunch& a, int receiver) {
  return (dc_u64)a.w.world_size * a.region_bytes + (dc_u64)receiver * a.ll_offset;
}

// User signal slots of the p2p window (user slot i is pad entry world_size + i).
//   TAIL(sender q, channel c)   in the receiver's pad: q * max_channels + c
//   HEAD(receiver r, channel c) in the sender's pad:   (world + r) * max_channels + c
//   LLHEAD(receiver r, block b) in the sender's pad:   2 * world * max_channels + r * max_blocks + b
DC_HOST_DEVICE inline dc_u64 p2p_tail_slot(const P2PLaunch& a, int sender, dc_u32 c) {
  return (dc_u64)sender * a.max_channels + c;
}
DC_HOST_DEVICE inline dc_u64 p2p_head_slot(const P2PLaunch& a, int receiver, dc_u32 c) {
  return ((dc_u64)a.w.world_size + receiver) * a.max_channels + c;
}
DC_HOST_DEVICE inline dc_u64 p2p_llhead_slot(const P2PLaunch& a, int receiver, dc_u32 b) {
  return 2ull * a.w.world_size * a.max_channels + (dc_u64)receiver * a.max_blocks + b;
}
//   MODE(sender q, channel c, slot k) in the receiver's pad: mode_slot0 + (q * max_channels + c)
//   * depth + k: 1 if the chunk now in slot k is pulled (it lies in the sender's outbox), 0 if
//   pushed (in the receiver's inbox). Written by the sender once the slot is free and before
//   the chunk's TAIL; read by the receiver after TAIL.
DC_HOST_DEVICE inline dc_u64 p2p_mode_slot(const P2PLaunch& a, int sender, dc_u32 c, dc_u32 k) {
  return a.mode_slot0 + ((dc_u64)sender * a.max_channels + c) * a.depth + k;
}

// Copy-engine messages (docs/PROTOCOL.md, "Copy engine"). A message moves in whole chunks
// through kCeSlots fixed slots, chunk i in slot i % kCeSlots. Even slots lie in the push
// staging of the receiver's inbox for this sender: the sender's copy engine writes the chunk
// there over NVLink and the receiver's blocks copy it out. Odd slots lie in the sender's outbox
// for this receiver: the sender's blocks copy the chunk there and the receiver's copy engine
// reads it over NVLink straight into the destination. So the two GPUs' copy engines drive the
// link at once (each slot p2p_ce_slot_bytes). A one-warp pacer on each side turns remote
// signals into local words for its copy stream (GO, set when a copy may start; DONE, written
// by the copy stream after it), so every wait that depends on the other GPU is a bounded one
// in a kernel. Every rank's pad holds, from ce_slot0, kCeWords words per peer p; the words a
// sender writes into the receiver's pad sit in the receiver's block for that sender:
//   +0 TAIL    chunks of p announced here (written by p)    +1 SENT  chunks sent to p
//   +2 RECV    chunks received from p    +3 DRAINED chunks of p copied out of the inbox in
//   this call   +4 INTENT[s] id of p's chunk in slot s (written by p before the chunk)
//   +8 SIZE[s] its message bytes   +12 CNT[s] receiver blocks done with slot s   +16 HEAD[s]
//   id + 1 of the last chunk in slot s that p consumed (written by p)   +20 GO[s]  +24 DONE[s]
//   (this rank sending to p)   +28 LAST[s] id + 1 of the last chunk sent to p in slot s
//   +32 FILLED[s] sender blocks done copying a chunk into outbox slot s   +36 GOR[s]
//   +40 DONER[s] (this rank receiving from p: its copy stream's pulls of odd slots).
//   +44 LSEQ_S  negotiated large messages sent to p   +45 LSEQ_R  received from p
//   +46 TYPE_S[2] p's type for its message seq to this rank (written by p, index seq & 1)
//   +48 TYPE_R[2] p's type as the receiver of this rank's message seq (written by p)
//   +50 DEC_S  decision for this rank's current message to p   +51 DEC_R  from p
//   +52 OUT_S  blocks of the negotiated send role done with DEC_S   +53 OUT_R  likewise.
//   +54..63 the agreement words of every send/recv call with p (devcomm/agree.cuh).
constexpr dc_u32 kCeSlots = 4;
constexpr dc_u32 kCeWords = 64;
constexpr dc_u32 kCeTail = 0, kCeSent = 1, kCeRecv = 2, kCeDrained = 3, kCeIntent = 4,
                 kCeSize = 8, kCeCnt = 12, kCeHead = 16, kCeGo = 20, kCeDone = 24, kCeLast = 28,
                 kCeFilled = 32, kCeGoR = 36, kCeDoneR = 40, kCeLseqS = 44, kCeLseqR = 45,
                 kCeTypeS = 46, kCeTypeR = 48, kCeDecS = 50, kCeDecR = 51,
                 kCeOutS = 52, kCeOutR = 53;
DC_HOST_DEVICE inline dc_u64 p2p_ce_slot0(const P2PLaunch& a) {
  return (dc_u64)a.mode_slot0 + (dc_u64)a.w.world_size * a.max_channels * a.depth;
}
// User slot of word `word` of peer `p`'s block.
DC_HOST_DEVICE inline dc_u64 p2p_ce_word(const P2PLaunch& a, int p, dc_u32 word) {
  return p2p_ce_slot0(a) + (dc_u64)p * kCeWords + word;
}
// Bytes of one copy-engine slot: half the push staging (two slots in the inbox, two in the
// outbox, which is as large), in whole 256-byte units.
DC_HOST_DEVICE inline dc_u64 p2p_ce_slot_bytes(const P2PLaunch& a) {
  return a.ll_offset / 2 / 256 * 256;
}
// Whether slot s is pulled from the sender's outbox (odd) or pushed into the inbox (even), and
// its offset in that staging.
DC_HOST_DEVICE inline bool p2p_ce_pulled(dc_u32 s) { return (s & 1u) != 0; }
DC_HOST_DEVICE inline dc_u64 p2p_ce_slot_offset(const P2PLaunch& a, dc_u32 s) {
  return (dc_u64)(s / 2) * p2p_ce_slot_bytes(a);
}

// Agreement of the two sides of every send/recv call (devcomm/agree.cuh, docs/PROTOCOL.md,
// "Agreement"): the words of peer p's copy-engine block from +56, the descriptor a sender
// stores into the receiver's ring, and the pure decisions (host-compiled by tests/layout.rs).
constexpr dc_u32 kAgCallS = 54, kAgCallR = 55, kAgOutR = 56, kAgAck = 57, kAgDesc = 58;
constexpr dc_u32 kAgRing = 6;
static_assert(kAgDesc + kAgRing <= kCeWords, "agreement words fit the peer's block");

// The word a sender stores into the receiver's ring is the call word of call_word.cuh (kind
// kKindSendRecv, kKindZeroCopy, kKindCollective or kKindBarrier; payload the bytes, or a
// collective's operation and wire bytes).

// Zero-copy send/recv into a registered destination (docs/PROTOCOL.md, "Zero-copy"). The
// receiver posts a descriptor of where the message may land (registration, offset, bytes) and
// then READY = call number into the sender's pad; the sender checks the descriptor against its
// own call, writes straight into the receiver's registered buffer and publishes DONE per block.
// `p.send` / `p.recv` carry buf (source / own destination), bytes, peer, blocks, and in `steps`
// the zero-copy call counters (send: u64[max_blocks] per peer; recv: u64 per peer).
struct ZcLaunch {
  P2PLaunch p;          // @0
  dc_u64 send_dst;      // @240 destination as mapped here: peer's registered buffer + offset
  dc_u64 send_reg;      // @248 registration id of the destination (same on every rank)
  dc_u64 send_offset;   // @256 byte offset of the destination in that registration
  dc_u64 recv_reg;      // @264 the receiver's own registration id
  dc_u64 recv_offset;   // @272 and offset
  dc_u64 zc_slot0;      // @280 first zero-copy user slot of the p2p window
};

static_assert(sizeof(ZcLaunch) == 288, "ZcLaunch size");
static_assert(DC_OFFSETOF(ZcLaunch, send_dst) == 240, "ZcLaunch.send_dst");
static_assert(DC_OFFSETOF(ZcLaunch, recv_reg) == 264, "ZcLaunch.recv_reg");
static_assert(DC_OFFSETOF(ZcLaunch, zc_slot0) == 280, "ZcLaunch.zc_slot0");

// Zero-copy user slots, from zc_slot0:
//   descriptor of receiver r (in the sender's pad): 4 r + {0 READY, 1 registration, 2 offset,
//   3 bytes}
//   DONE(sender q, block b) (in the receiver's pad): 4 world + q * max_blocks + b; the value is
//   2 x call for a moved block, 2 x call + 1 when the sender refused the call (mismatch).
constexpr dc_u32 kZcReady = 0, kZcReg = 1, kZcOffset = 2, kZcBytes = 3;
DC_HOST_DEVICE inline dc_u64 zc_desc_slot(const ZcLaunch& z, int receiver, dc_u32 field) {
  return z.zc_slot0 + 4ull * receiver + field;
}
DC_HOST_DEVICE inline dc_u64 zc_done_slot(const ZcLaunch& z, int sender, dc_u32 b) {
  return z.zc_slot0 + 4ull * z.p.w.world_size + (dc_u64)sender * z.p.max_blocks + b;
}

}  // namespace devcomm
