//! Layer 1: the thin layer over cudarc.
//!
//! The only module that calls `cudarc::driver::sys` and `cudarc::nvrtc::sys`. It wraps, once
//! each, the driver calls that cudarc's safe API lacks: virtual memory (`cuMem*`, [`vmm`]),
//! legacy CUDA IPC ([`ipc`]), NVRTC programs (`nvrtc`),
//! host-mapped pinned memory ([`ErrorState`], [`HostMapped`]), pointer queries ([`pointer`]), device queries
//! ([`info`]) and plain device allocations for small tables ([`DeviceBuffer`]).
//!
//! Every function binds the given context to the calling thread before its driver calls, so
//! callers need not. Errors are [`Error::Cuda`] naming the driver call. This layer does not
//! know the rank: its errors carry rank -1, and the layers above fill it in with
//! [`with_rank`].

mod buffer;
mod driver;
mod error_record;
mod error_state;
#[cfg(test)]
mod gpu_tests;
pub(crate) mod graph;
mod host_mapped;
pub(crate) mod info;
pub(crate) mod ipc;
pub(crate) mod nvrtc;
pub(crate) mod pointer;
pub(crate) mod vmm;

use std::sync::Arc;

use cudarc::driver::CudaStream;
use cudarc::driver::{sys, CudaContext};

use crate::error::{CudaResultExt, Error, Result};

pub(crate) use buffer::memset_zero;
pub use buffer::DeviceBuffer;
pub use driver::ensure_driver;
pub(crate) use error_state::ErrorState;
pub(crate) use host_mapped::HostMapped;

/// Loads the code of kernel `f` now rather than at its first launch (the driver's lazy
/// loading), which can wait for kernels already running on the device.
pub(crate) fn load_function_now(f: &cudarc::driver::CudaFunction) -> Result<()> {
    // SAFETY: a live function handle (the module that owns it outlives `f`).
    unsafe { sys::cuFuncLoad(f.cu_function()) }
        .result()
        .cuda(NO_RANK, "cuFuncLoad")
}

/// Rank placed in errors of this layer, which does not know the rank.
pub(crate) const NO_RANK: i32 = -1;

/// A one-dimensional launch: `blocks` blocks of `threads` threads, no dynamic shared memory.
pub(crate) fn linear_launch(blocks: u32, threads: u32) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `func(args)` on `stream` with the shape of `cfg`, through `cuLaunchKernelEx`, with
/// programmatic stream serialization when `pdl` (the group's choice: compute capability 9.0 or
/// newer and `DEVCOMM_PDL` not `0`; docs/PROTOCOL.md, "Back-to-back launches"): the kernel may
/// be scheduled while the kernel before it on the stream still runs, and its first act (`enter_after_previous_kernel` in
/// `cuda/devcomm/ordering.cuh`) waits until that kernel has finished and its writes are
/// visible. What the launch saves is the scheduling gap between back-to-back kernels.
///
/// # Safety
///
/// `func` must take exactly one parameter, of type `A`, by value; everything it touches
/// through `args` must stay valid until it has finished; and it must call
/// `enter_after_previous_kernel()` before it touches any memory (every devcomm kernel does
/// so first).
pub(crate) unsafe fn launch_struct<A: cudarc::driver::DeviceRepr>(
    stream: &CudaStream,
    func: &cudarc::driver::CudaFunction,
    cfg: cudarc::driver::LaunchConfig,
    args: &A,
    pdl: bool,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    stream.context().bind_to_thread()?;
    // SAFETY: an all-zero attribute is valid (IGNORE with a zeroed value); both fields set
    // below are plain integers.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: u32::from(pdl),
    };
    let mut params = [args as *const A as *mut std::ffi::c_void];
    // SAFETY: `config` and `attr` outlive the call; `params` holds one pointer to a live `A`,
    // the kernel's only parameter (the caller's contract), which the driver copies before it
    // returns.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            func.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}

/// Maps a raw driver status to `Ok` or [`Error::Cuda`] naming `call`.
pub(crate) fn check(status: sys::CUresult, call: &'static str) -> Result<()> {
    status.result().cuda(NO_RANK, call)
}

/// Makes `ctx` current on the calling thread (raw driver calls act on the current context).
pub(crate) fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread().cuda(NO_RANK, "cuCtxSetCurrent")
}

/// Blocks until all work of `ctx` (every stream) has finished.
pub fn synchronize(ctx: &Arc<CudaContext>) -> Result<()> {
    ctx.synchronize().cuda(NO_RANK, "cuCtxSynchronize")
}

/// Enqueues a device-to-device copy of `bytes` on `stream` (either address may be a peer's
/// mapping: the copy engine then moves the data over NVLink).
pub(crate) fn memcpy_dtod_async(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the driver checks that both ranges are mapped device memory of the stream's
    // context (or peers mapped into it) and reports an error otherwise; the caller guarantees
    // they hold `bytes` and that nothing frees them before the stream reaches the copy.
    unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
        .cuda(NO_RANK, "cuMemcpyDtoDAsync")
}

/// Makes `stream` wait until the 64-bit word at `addr` is at least `value` (a stream memory
/// operation: no kernel, no deadline of its own; the writer must be bounded).
pub(crate) fn stream_wait_geq(stream: &CudaStream, addr: u64, value: u64) -> Result<()> {
    use cudarc::driver::sys;
    let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: `addr` is device memory of (or mapped into) the stream's context that lives as
    // long as the communicator; the driver validates it.
    unsafe { sys::cuStreamWaitValue64_v2(stream.cu_stream(), addr, value, flags) }
        .result()
        .cuda(NO_RANK, "cuStreamWaitValue64")
}

/// Whether a driver error is `CUDA_ERROR_NOT_FOUND` (a symbol a module does not have).
pub(crate) fn is_not_found(e: &cudarc::driver::DriverError) -> bool {
    e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_FOUND
}

/// Writes `value` to the 64-bit word at `addr` once the stream's earlier work is done, after a
/// memory barrier (the default flags), so what that work wrote is visible first.
pub(crate) fn stream_write(stream: &CudaStream, addr: u64, value: u64) -> Result<()> {
    use cudarc::driver::sys;
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // SAFETY: as stream_wait_geq.
    unsafe { sys::cuStreamWriteValue64_v2(stream.cu_stream(), addr, value, flags) }
        .result()
        .cuda(NO_RANK, "cuStreamWriteValue64")
}

/// A non-blocking stream of devcomm's own (the copy-engine streams) that leaves the caller's
/// context as it found it. `CudaContext::new_stream` would count it, and cudarc switches a
/// context with any counted stream into multi-stream mode: from then on every access to a
/// buffer through its safe API records and waits on events (host driver calls on every
/// call of the user's, devcomm's and any other library's), and the first switch synchronises
/// the context. devcomm orders its own streams with explicit events, so it keeps them out of
/// that count; the stream is destroyed on drop (after work already enqueued completes: the
/// driver's rule for `cuStreamDestroy`).
#[derive(Debug)]
pub(crate) struct InternalStream(Arc<CudaStream>);

impl InternalStream {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        bind(ctx)?;
        let raw = cudarc::driver::result::stream::create(
            cudarc::driver::result::stream::StreamKind::NonBlocking,
        )
        .cuda(NO_RANK, "cuStreamCreate")?;
        // SAFETY: `raw` is a stream of `ctx` just created; this value owns it and destroys it
        // only in `drop`, after the wrapper (never handed out by value) is gone from use.
        Ok(Self(unsafe { ctx.wrap_borrowed_stream(raw) }))
    }
}

impl std::ops::Deref for InternalStream {
    type Target = Arc<CudaStream>;
    fn deref(&self) -> &Arc<CudaStream> {
        &self.0
    }
}

impl Drop for InternalStream {
    fn drop(&mut self) {
        let result = bind(self.0.context()).and_then(|()| {
            // SAFETY: the stream was created in `new` and nothing else destroys it.
            unsafe { cudarc::driver::result::stream::destroy(self.0.cu_stream()) }
                .cuda(NO_RANK, "cuStreamDestroy")
        });
        log_drop_error("cuStreamDestroy (copy-engine stream)", result);
    }
}

/// Fills in the rank of an [`Error::Cuda`] raised by this layer (which does not know it);
/// other errors pass through unchanged.
pub(crate) fn with_rank(err: Error, rank: usize) -> Error {
    match err {
        Error::Cuda {
            rank: NO_RANK,
            call,
            source,
        } => Error::Cuda {
            rank: i32::try_from(rank).unwrap_or(i32::MAX),
            call,
            source,
        },
        other => other,
    }
}

/// Logs a failed clean-up call; `Drop` cannot return errors and must not panic.
pub(crate) fn log_drop_error(what: &str, result: Result<()>) {
    if let Err(e) = result {
        log::warn!("devcomm: {what} failed during clean-up: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::DriverError;

    #[test]
    fn with_rank_fills_only_unknown_cuda_ranks() {
        let err = check(sys::CUresult::CUDA_ERROR_INVALID_VALUE, "cuMemMap").unwrap_err();
        match with_rank(err, 3) {
            Error::Cuda { rank, call, source } => {
                assert_eq!(rank, 3);
                assert_eq!(call, "cuMemMap");
                assert_eq!(source, DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
            }
            other => panic!("unexpected {other:?}"),
        }
        let known = Error::Cuda {
            rank: 1,
            call: "cuMemCreate",
            source: DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        };
        assert!(matches!(with_rank(known, 3), Error::Cuda { rank: 1, .. }));
        let other = Error::NotImplemented { feature: "x" };
        assert!(matches!(with_rank(other, 3), Error::NotImplemented { .. }));
    }

    #[test]
    fn check_passes_success() {
        assert!(check(sys::CUresult::CUDA_SUCCESS, "cuInit").is_ok());
    }
}
