//! Stream-ordered byte fills and graph capture, wrapped once over cudarc's `result` layer and
//! its graph API (used by [`crate::testing`] and the self-test).

use std::sync::Arc;

use cudarc::driver::{sys, CudaGraph, CudaStream};

use crate::error::{CudaResultExt, Error, Result};

/// Rank in the errors of this module, which does not know the rank.
const NO_RANK: i32 = -1;

/// Enqueues on `stream` a fill of `bytes` bytes at device address `dst` with `value`
/// (`cuMemsetD8Async`). Stream-ordered, and recorded as a memset node when the stream is being
/// captured. `bytes == 0` enqueues nothing.
///
/// # Safety
///
/// `[dst, dst + bytes)` must be device memory of the stream's context (or mapped into it) that
/// the caller may overwrite, and it must stay allocated until the stream has reached the fill
/// (for a captured stream: until the graph's last replay has finished). No kernel may read or
/// write the range concurrently unless the caller orders it after the fill.
pub unsafe fn memset_d8_async(
    dst: u64,
    value: u8,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    stream
        .context()
        .bind_to_thread()
        .cuda(NO_RANK, "cuCtxSetCurrent")?;
    // SAFETY: the caller guarantees that the range is writable device memory that outlives
    // the fill; the stream handle is live (borrowed from `stream`).
    unsafe { cudarc::driver::result::memset_d8_async(dst, value, bytes, stream.cu_stream()) }
        .cuda(NO_RANK, "cuMemsetD8Async")
}

/// Starts capturing `stream` into a graph, in thread-local capture mode: work that other
/// threads enqueue meanwhile is not affected. End it with [`end_capture`] on the same thread,
/// also when the work to capture failed, or the stream stays unusable.
pub fn begin_capture(stream: &CudaStream) -> Result<()> {
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .cuda(NO_RANK, "cuStreamBeginCapture")
}

/// Ends the capture begun by [`begin_capture`] and instantiates the graph, with auto-free on
/// launch (memory allocated inside the graph is freed when it is launched again). An empty
/// capture is an error.
pub fn end_capture(stream: &Arc<CudaStream>) -> Result<CudaGraph> {
    let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
    stream
        .end_capture(flags)
        .cuda(NO_RANK, "cuStreamEndCapture")?
        .ok_or_else(|| Error::InvalidArgument {
            op: "end_capture",
            reason: "the capture recorded no graph (was the capture begun on this stream?)".into(),
        })
}

/// Whether `stream` is capturing a graph now (active, or invalidated by an error).
pub(crate) fn is_capturing(stream: &CudaStream) -> Result<bool> {
    let status = stream
        .capture_status()
        .cuda(NO_RANK, "cuStreamIsCapturing")?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
