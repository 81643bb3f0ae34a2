//! Pinned host memory mapped into the GPU (`cuMemHostAlloc` with `DEVICEMAP`): memory that a
//! kernel and a host thread share without copies, such as the network transport's descriptor
//! queues and staging (docs/NETWORK.md, "Host staging").

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::{bind, check, log_drop_error};
use crate::error::Result;

/// An owned, zeroed, page-aligned block of pinned host memory with its device address.
pub(crate) struct HostMapped {
    ctx: Arc<CudaContext>,
    host: *mut u8,
    device: u64,
    bytes: usize,
}

// SAFETY: the memory is owned by this value for its whole life; the value hands out raw
// addresses only, and whoever writes through them (kernels, the network proxy) follows the
// protocol of the structures placed there.
unsafe impl Send for HostMapped {}
// SAFETY: as above; no method gives references into the memory.
unsafe impl Sync for HostMapped {}

impl std::fmt::Debug for HostMapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMapped")
            .field("host", &self.host)
            .field("device", &format_args!("{:#x}", self.device))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl HostMapped {
    /// Allocates `bytes` (more than 0) of zeroed pinned memory mapped into every context
    /// (`DEVICEMAP | PORTABLE`).
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        bind(ctx)?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` is a valid out-pointer; the context is current.
        let status = unsafe { sys::cuMemHostAlloc(&mut host, bytes.max(1), flags) };
        check(status, "cuMemHostAlloc")?;
        let mut mapped = Self {
            ctx: ctx.clone(),
            host: host.cast(),
            device: 0,
            bytes,
        };
        // SAFETY: a fresh allocation of at least `bytes` bytes.
        unsafe { std::ptr::write_bytes(mapped.host, 0, bytes) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated by cuMemHostAlloc with DEVICEMAP; flags must be 0. On
        // failure `mapped` is dropped and frees the allocation.
        let status = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) };
        check(status, "cuMemHostGetDevicePointer")?;
        mapped.device = device;
        Ok(mapped)
    }

    /// The host address (page-aligned).
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The address kernels use.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.bytes
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        let freed = bind(&self.ctx).and_then(|()| {
            // SAFETY: `host` came from cuMemHostAlloc and is freed once, here; its users (the
            // kernels and proxy of one communicator) are gone by now (the owner's contract).
            let status = unsafe { sys::cuMemFreeHost(self.host.cast()) };
            check(status, "cuMemFreeHost")
        });
        log_drop_error("freeing host-mapped memory", freed);
    }
}
