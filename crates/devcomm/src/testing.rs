//! Helpers for tests and the `devcomm selftest` checks, outside the communication API.
//!
//! What a check needs around the API it checks: filling device memory with a byte (poison and
//! guard bytes around a destination, also inside a captured graph) and capturing a stream into
//! a CUDA graph that is replayed later. Plain device allocations that a user could hand to
//! [`crate::Comm::register`] are [`DeviceBuffer`]s; copies between raw device addresses are
//! [`memcpy_dtod_async`], and the copy-engine benchmarks' stream memory operations
//! [`stream_write`] and [`stream_wait_geq`]. Each that touches a raw address is an `unsafe fn`.
//!
//! They are the `cuda` layer's wrappers (`cuda/graph.rs`, `cuda/mod.rs`), the only place that
//! calls cudarc's raw layers, re-exported here for the self-test.
//!
//! Errors are [`Error::Cuda`](crate::Error::Cuda) naming the driver call, with rank -1 like the `cuda`
//! layer's (the communicator fills it in).

use cudarc::driver::CudaStream;

use crate::error::Result;

pub use crate::cuda::graph::{begin_capture, end_capture, memset_d8_async};
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

/// Runs `work` with this rank marked as loading a kernel, as a slow compile would: peers
/// waiting at a kernel gate keep waiting while it runs (up to the setup timeout) instead of
/// giving up after the device timeout. The self-test uses it to stand in for a slow NVRTC
/// compile.
pub fn as_if_loading<T>(comm: &crate::Comm, work: impl FnOnce() -> T) -> crate::Result<T> {
    comm.group.loading(|| Ok(work()))
}

/// The network transport (`net/`, docs/NETWORK.md) as the network tests drive it: a host
/// thread stands in for the device, writing descriptors into a transport's queues and waiting
/// on signal words, over real UCX. The transport is crate-private; these are the pieces those
/// tests (and the host twin of the send/recv route) need, nothing a communicator's user calls.
/// The structs the queues carry are public in [`crate::abi::net`], the transport's error in
/// [`crate::error::net`].
pub mod net {
    pub use crate::net::host;
    pub use crate::net::queue::{QueueMemory, QueueRef};
    pub use crate::net::record::ErrorSink;
    pub use crate::net::{probe_library, NetConfig, NetTransport, UCX_LIB_ENV};

    /// Send/recv's network route (`net/route.rs`): the staging layout, chunk headers, credits
    /// and refusal words the kernel (`cuda/devcomm/net_p2p.cuh`) shares with the host.
    pub mod route {
        pub use crate::net::route::{
            chunks, refusal, refused, ChunkHeader, StagingLayout, CHANNELS, CHANNEL_CREDIT,
            CHANNEL_DATA, HEADER_BYTES, KIND_COLLECTIVE, KIND_SENDRECV, LAYOUT,
        };
    }
}
