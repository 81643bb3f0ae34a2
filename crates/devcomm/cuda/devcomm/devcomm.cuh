// devcomm/devcomm.cuh: the umbrella header of the device API. Kernels include only this.
//
// Layers (each header includes what it needs and compiles on its own):
//   handles.cuh     structs shared with Rust (DeviceWindow, DeviceErrorState, RegisteredBuffer)
//   ordering.cuh    acquire/release loads and stores, fences, globaltimer
//   group.cuh       Thread, Warp, Block, NamedBarrier
//   copy.cuh        copy_bytes
//   wait.cuh        the bounded wait (timeouts, abort flag, error record)
//   window.cuh      peer addresses, signal / signal_add / signal_relaxed, wait_signal
//   barrier.cuh     cross-rank barrier
//   put.cuh         put, put_signal
//   registered.cuh  peer addresses of registered user buffers
#pragma once

#include "devcomm/handles.cuh"
#include "devcomm/ordering.cuh"
#include "devcomm/group.cuh"
#include "devcomm/copy.cuh"
#include "devcomm/wait.cuh"
#include "devcomm/window.cuh"
#include "devcomm/barrier.cuh"
#include "devcomm/put.cuh"
#include "devcomm/registered.cuh"
