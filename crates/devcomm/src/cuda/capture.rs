//! CUDA graph capture of a stream: begin and end in thread-local mode, and whether a stream is
//! capturing now.

use std::sync::Arc;

use cudarc::driver::{sys, CudaGraph, CudaStream};

use super::NO_RANK;
use crate::error::{CudaResultExt, Result};

/// Starts capturing `stream` in thread-local mode (work other threads enqueue is not affected).
pub(crate) fn begin(stream: &CudaStream) -> Result<()> {
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .cuda(NO_RANK, "cuStreamBeginCapture")
}

/// Ends the capture of `stream` and instantiates the graph with auto-free on launch; `None`
/// when the capture recorded no graph.
pub(crate) fn end(stream: &Arc<CudaStream>) -> Result<Option<CudaGraph>> {
    let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
    stream
        .end_capture(flags)
        .cuda(NO_RANK, "cuStreamEndCapture")
}

/// Whether `stream` is capturing a graph now (active, or invalidated by an error).
pub(crate) fn is_capturing(stream: &CudaStream) -> Result<bool> {
    let status = stream
        .capture_status()
        .cuda(NO_RANK, "cuStreamIsCapturing")?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
