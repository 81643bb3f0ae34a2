// devcomm/registered.cuh: peer addresses of registered user buffers.
#pragma once

#include "devcomm/handles.cuh"

namespace devcomm {

#if defined(__CUDACC__)

// `peer`'s copy of the registered buffer as mapped on this GPU, or null when the peer is out of
// range, the registration has no NVLink peer table, or there is no NVLink path. The own rank
// gets the buffer's local base.
__device__ __forceinline__ void* get_nvlink_address(const RegisteredBuffer* reg, int peer) {
  if (reg == nullptr) return nullptr;
  const DevicePeerTable* table = reinterpret_cast<const DevicePeerTable*>(reg->backend_window);
  if (table == nullptr || peer < 0 || peer >= table->world_size) return nullptr;
  if (peer == table->rank) return reinterpret_cast<void*>(reg->base_ptr);
  return reinterpret_cast<void*>(reinterpret_cast<const dc_u64*>(table->peer_base)[peer]);
}

#endif  // __CUDACC__

}  // namespace devcomm
