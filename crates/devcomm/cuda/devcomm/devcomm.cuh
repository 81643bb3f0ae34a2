// devcomm/devcomm.cuh: the umbrella header of the device API. Kernels include only this.
//
// Layers (each header includes what it needs and compiles on its own):
//   handles.cuh     structs shared with Rust (DeviceWindow, DeviceErrorState, RegisteredBuffer)
//   ordering.cuh    acquire/release loads and stores, fences, globaltimer
//   trace.cuh       per-block timeline events (DC_TRACE_* macros; nothing without DC_TRACE)
//   group.cuh       Thread, Warp, Block, NamedBarrier
//   copy.cuh        copy_bytes
//   wait.cuh        the bounded wait (timeouts, abort flag, error record)
//   window.cuh      peer addresses, signal / signal_add / signal_relaxed, wait_signal
//   barrier.cuh     cross-rank barrier
//   put.cuh         put, put_signal
//   registered.cuh  peer addresses of registered user buffers
//   net.cuh         descriptors into the network queues (net_put, net_signal, net_flush)
//   window_net.cuh  a window's operations routed per peer: NVLink stores or network queues
//                   (put_routed, put_signal_routed, signal_routed, flush_routed, ...)
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"
#include "devcomm/trace.cuh"
#include "devcomm/group.cuh"
#include "devcomm/copy.cuh"
#include "devcomm/wait.cuh"
#include "devcomm/window.cuh"
#include "devcomm/barrier.cuh"
#include "devcomm/put.cuh"
#include "devcomm/registered.cuh"
#include "devcomm/net.cuh"
#include "devcomm/window_net.cuh"
