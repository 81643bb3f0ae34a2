//! Windows and registered buffers of [`Comm`].

use cudarc::driver::DeviceRepr;

use super::Comm;
use crate::error::Result;
use crate::window::Window;

impl Comm {
    /// Collective: a symmetric window of `len` elements and `signal_count` user signal slots
    /// on every rank.
    pub fn window<T: DeviceRepr>(&self, len: usize, signal_count: usize) -> Result<Window<T>> {
        Window::new(&self.group, len, signal_count)
    }

    /// Collective: registers a buffer the user allocated (`cuMemAlloc`/`cudaMalloc` memory or
    /// a `cuMem` virtual-memory allocation) so that peers' kernels can reach it. Returns the
    /// device address of its `RegisteredBuffer` struct.
    pub fn register(&self, ptr: u64, bytes: usize) -> Result<u64> {
        self.registry.register(&self.group, ptr, bytes)
    }

    /// Collective: releases a registration made by [`Comm::register`]. The user may free the
    /// buffer once this returns.
    pub fn deregister(&self, handle: u64) -> Result<()> {
        self.registry.deregister(&self.group, handle)
    }

    /// The peer's address of a registered buffer as mapped here, or `None` without NVLink or
    /// for an unknown handle.
    pub fn registered_nvlink_address(&self, handle: u64, peer: usize) -> Option<u64> {
        self.registry.get_nvlink_address(handle, peer)
    }
}
