//! Helpers for tests and the `devcomm selftest` checks, outside the communication API.
//!
//! What a check needs around the API it checks: filling device memory with a byte (poison and
//! guard bytes around a destination, also inside a captured graph) and capturing a stream into
//! a CUDA graph that is replayed later. Plain device allocations that a user could hand to
//! [`crate::Comm::register`] are [`crate::cuda::DeviceBuffer`]s; copies between raw device
//! addresses are [`crate::cuda::memcpy_dtod_async`].
//!
//! They are the [`crate::cuda`] layer's wrappers (`cuda/graph.rs`), the only place that calls
//! cudarc's raw layers, re-exported here for the self-test.
//!
//! Errors are [`Error::Cuda`] naming the driver call, with rank -1 like the [`crate::cuda`]
//! layer's ([`crate::cuda::with_rank`] fills it in).

pub use crate::cuda::graph::{begin_capture, end_capture, memset_d8_async};
