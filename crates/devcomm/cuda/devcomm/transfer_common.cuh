// devcomm/transfer_common.cuh: what every protocol of transfer.cuh shares: block spans,
// bounded waits, publishing a signal, the negotiation gate, and send/recv's byte movers
// (ByteSend / ByteRecv). The movers' contract is at the top of transfer.cuh.
#pragma once

#include "devcomm/devcomm.cuh"
#include "devcomm/p2p.cuh"

namespace devcomm {
namespace p2p {

#if defined(__CUDACC__)

struct Span {
  dc_u64 begin;
  dc_u64 len;
};

// Block b's share of `bytes` split over `blocks`, in multiples of `align` bytes. Sender and
// receiver compute the same spans, hence the same chunk counts and step counters.
__device__ __forceinline__ Span block_span(dc_u64 bytes, dc_u32 blocks, dc_u32 b, dc_u64 align) {
  dc_u64 per = (bytes + blocks - 1) / blocks;
  per = (per + align - 1) / align * align;
  const dc_u64 begin = per * b < bytes ? per * b : bytes;
  const dc_u64 end = begin + per < bytes ? begin + per : bytes;
  return Span{begin, end - begin};
}

__device__ __forceinline__ bool bounded_wait(const P2PLaunch& a, const dc_u64* addr,
                                             dc_u64 expected, DeviceOp op, int peer,
                                             dc_u64 slot) {
  return wait_until(error_state(a.w), a.w.timeout_ns, a.w.rank, addr, expected, Cmp::Ge,
                    WaitSite{op, peer, slot});
}

// Publishes `value` into `flag` after everything the group wrote before its last barrier.
__device__ __forceinline__ void publish(dc_u64* flag, dc_u64 value) {
  fence_acq_rel_sys();
  st_release_sys(flag, value);
}

// Whether a role runs: always unless it is gated on a negotiation (p2p.cuh), then only where
// its DECISION (word `dec_word` of the peer's block) is `wanted`. A gated role's blocks wait
// for the decision first: in p2p_negotiated_kernel only the role's block 0 makes it. The wait
// allows twice the timeout, so that the decider's own wait fails first and names what was
// missing; a failed wait records itself and closes the gate.
__device__ __forceinline__ bool gate_open(const P2PLaunch& a, const P2PSide& side,
                                         dc_u32 dec_word, dc_u64 wanted) {
  if (!(side.pull & kSideGated)) return true;
  const dc_u64 slot = p2p_ce_word(a, side.peer, dec_word);
  const dc_u64* dec = own_user_slot(a.w, slot);
  const DeviceOp op = dec_word == kCeDecS ? kOpSendSlotFree : kOpRecvSlotFull;
  if (!wait_until(error_state(a.w), 2 * a.w.timeout_ns, a.w.rank, dec, 1, Cmp::Ge,
                  WaitSite{op, side.peer, slot})) {
    return false;
  }
  return ld_acquire_sys(dec) == wanted;
}

// Reads up to 8 bytes at p (fewer at the message's end), any alignment.
__device__ __forceinline__ dc_u64 load_payload(const unsigned char* p, dc_u64 n) {
  if (n == 8 && (reinterpret_cast<dc_u64>(p) & 7) == 0) return *reinterpret_cast<const dc_u64*>(p);
  dc_u64 v = 0;
  for (dc_u64 k = 0; k < n; ++k) v |= (dc_u64)p[k] << (8 * k);
  return v;
}

__device__ __forceinline__ void store_payload(unsigned char* p, dc_u64 v, dc_u64 n) {
  if (n == 8 && (reinterpret_cast<dc_u64>(p) & 7) == 0) {
    *reinterpret_cast<dc_u64*>(p) = v;
    return;
  }
  for (dc_u64 k = 0; k < n; ++k) p[k] = (unsigned char)(v >> (8 * k));
}

// Send/recv's movers: the wire bytes are the buffer's bytes, at any alignment.
struct ByteSend {
  static constexpr dc_u64 kUnit = 8;
  const unsigned char* src;
  template <class G>
  __device__ __forceinline__ void chunk(const G& g, char* slot, dc_u64 off, dc_u64 n) const {
    copy_bytes(g, slot, src + off, n);
  }
  __device__ __forceinline__ void unit(dc_u64 off, dc_u64 n, dc_u64 (&v)[1]) const {
    v[0] = load_payload(src + off, n);
  }
};

struct ByteRecv {
  static constexpr dc_u64 kUnit = 8;
  unsigned char* dst;
  template <class G>
  __device__ __forceinline__ void chunk(const G& g, const char* slot, dc_u64 off, dc_u64 n,
                                        bool remote) const {
    if (remote) {  // reads over NVLink: more loads in flight
      copy_bytes<kCopyUnrollRemote>(g, dst + off, slot, n);
    } else {
      copy_bytes(g, dst + off, slot, n);
    }
  }
  __device__ __forceinline__ void unit(dc_u64 off, dc_u64 n, const dc_u64 (&v)[1]) const {
    store_payload(dst + off, v[0], n);
  }
};

#endif  // __CUDACC__

}  // namespace p2p
}  // namespace devcomm
