//! Helpers for tests and the `devcomm selftest` checks, outside the communication API.
//!
//! What a check needs around the API it checks: filling device memory with a byte (poison and
//! guard bytes around a destination, also inside a captured graph) and capturing a stream into
//! a CUDA graph that is replayed later. Plain device allocations that a user could hand to
//! [`crate::Comm::register`] are [`DeviceBuffer`]s; copies between raw device addresses are
//! [`memcpy_dtod_async`], and the copy-engine benchmarks' stream memory operations
//! [`stream_write`] and [`stream_wait_geq`]. Each that touches a raw address is an `unsafe fn`.
//!
//! The memset calls cudarc's `result` layer directly, since the `cuda` layer has no
//! stream-ordered memset yet; it belongs in that layer once it has.
//!
//! Errors are [`Error::Cuda`] naming the driver call, with rank -1 like the `cuda`
//! layer's (the communicator fills it in).

use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaStream};

use crate::error::{CudaResultExt, Error, Result};

pub use crate::cuda::vmm::{Mapping, PhysicalMemory};
pub use crate::cuda::{synchronize, DeviceBuffer};

/// Enqueues a device-to-device copy of `bytes` from `src` to `dst` on `stream` (either address
/// may be a peer's mapping: the copy engine then moves the data over NVLink).
///
/// # Safety
///
/// `[src, src + bytes)` must be readable and `[dst, dst + bytes)` writable device memory of the
/// stream's context (or mapped into it), both allocated until the stream has reached the copy,
/// and no kernel may use `dst` concurrently unless ordered after the copy.
pub unsafe fn memcpy_dtod_async(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    crate::cuda::memcpy_dtod_async(dst, src, bytes, stream)
}

/// Makes `stream` wait until the 64-bit word at `addr` is at least `value` (a stream memory
/// operation: no kernel and no deadline of its own, so the writer of the word must be bounded).
///
/// # Safety
///
/// `addr` must be an 8-byte aligned word of device memory of the stream's context (or mapped
/// into it) that stays allocated until the wait has completed, and some bounded work must
/// write a value of at least `value` there, or the stream never proceeds.
pub unsafe fn stream_wait_geq(stream: &CudaStream, addr: u64, value: u64) -> Result<()> {
    crate::cuda::stream_wait_geq(stream, addr, value)
}

/// Writes `value` to the 64-bit word at `addr` once the stream's earlier work is done, after a
/// memory barrier, so what that work wrote is visible first.
///
/// # Safety
///
/// `addr` must be an 8-byte aligned word of device memory of the stream's context (or mapped
/// into it) that the caller may overwrite and that stays allocated until the stream has
/// reached the write.
pub unsafe fn stream_write(stream: &CudaStream, addr: u64, value: u64) -> Result<()> {
    crate::cuda::stream_write(stream, addr, value)
}

/// Rank in the errors of this module, which does not know the rank (as in `cuda`).
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
    crate::cuda::capture::begin(stream)
}

/// Ends the capture begun by [`begin_capture`] and instantiates the graph, with auto-free on
/// launch (memory allocated inside the graph is freed when it is launched again). An empty
/// capture is an error.
pub fn end_capture(stream: &Arc<CudaStream>) -> Result<CudaGraph> {
    crate::cuda::capture::end(stream)?.ok_or_else(|| Error::InvalidArgument {
        op: "end_capture",
        reason: "the capture recorded no graph (was the capture begun on this stream?)".into(),
    })
}
