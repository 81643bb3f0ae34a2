//! Layer 1: the thin layer over cudarc.
//!
//! The only module that calls `cudarc::driver::sys`. It wraps, once each, the driver calls that
//! cudarc's safe API lacks: virtual memory (`cuMem*`, [`vmm`]), legacy CUDA IPC ([`ipc`]),
//! host-mapped pinned memory ([`ErrorState`]), pointer queries ([`pointer`]), device queries
//! ([`info`]) and plain device allocations for small tables ([`DeviceBuffer`]).
//!
//! Every function binds the given context to the calling thread before its driver calls, so
//! callers need not. Errors are [`Error::Cuda`] naming the driver call. This layer does not
//! know the rank: its errors carry rank -1, and the layers above fill it in with
//! [`with_rank`].

mod buffer;
mod error_state;
#[cfg(test)]
mod gpu_tests;
pub mod info;
pub mod ipc;
pub mod pointer;
pub mod vmm;

use std::sync::Arc;

use cudarc::driver::CudaStream;
use cudarc::driver::{sys, CudaContext};

use crate::error::{CudaResultExt, Error, Result};

pub use buffer::{memset_zero, DeviceBuffer};
pub use error_state::ErrorState;

/// Rank placed in errors of this layer, which does not know the rank.
pub(crate) const NO_RANK: i32 = -1;

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
pub fn memcpy_dtod_async(dst: u64, src: u64, bytes: usize, stream: &CudaStream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the driver checks that both ranges are mapped device memory of the stream's
    // context (or peers mapped into it) and reports an error otherwise; the caller guarantees
    // they hold `bytes` and that nothing frees them before the stream reaches the copy.
    unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
        .cuda(NO_RANK, "cuMemcpyDtoDAsync")
}

/// Fills in the rank of an [`Error::Cuda`] raised by this layer (which does not know it);
/// other errors pass through unchanged.
pub fn with_rank(err: Error, rank: usize) -> Error {
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
