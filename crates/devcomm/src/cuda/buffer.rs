//! Small plain device allocations (peer tables, handles, counters).

use std::mem::size_of_val;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, DeviceRepr};

use super::{bind, check, log_drop_error};
use crate::error::Result;

/// A `cuMemAlloc` allocation owned by the host, freed on drop.
///
/// Writes ([`DeviceBuffer::from_slice`], [`DeviceBuffer::zeroed`]) are issued with the
/// synchronous driver calls on the legacy default stream; they may still be in flight when the
/// call returns, so setup code calls [`super::synchronize`] before it publishes the buffer.
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    ptr: u64,
    bytes: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1) bytes of device memory, set to zero.
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        let buf = Self::alloc(ctx, bytes)?;
        // SAFETY: `buf.ptr` is a live allocation of `buf.bytes` bytes; the context is current.
        let status = unsafe { sys::cuMemsetD8_v2(buf.ptr, 0, buf.bytes) };
        check(status, "cuMemsetD8")?;
        Ok(buf)
    }

    /// Allocates device memory holding a copy of `values`.
    pub fn from_slice<T: DeviceRepr>(ctx: &Arc<CudaContext>, values: &[T]) -> Result<Self> {
        let buf = Self::alloc(ctx, size_of_val(values))?;
        if !values.is_empty() {
            // SAFETY: the destination holds `size_of_val(values)` bytes; `T: DeviceRepr` is
            // plain data; the source stays borrowed for the whole (host-synchronous) call.
            let status = unsafe {
                sys::cuMemcpyHtoD_v2(buf.ptr, values.as_ptr().cast(), size_of_val(values))
            };
            check(status, "cuMemcpyHtoD")?;
        }
        Ok(buf)
    }

    fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        bind(ctx)?;
        let bytes = bytes.max(1);
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the context is current.
        let status = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) };
        check(status, "cuMemAlloc")?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
            bytes,
        })
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Sets `bytes` bytes at device address `ptr` to zero (`cuMemsetD8`). Like the other
/// synchronous writes it may still be in flight on return: call [`super::synchronize`].
///
/// # Safety
///
/// `[ptr, ptr + bytes)` must be device memory accessible from `ctx` that the caller may
/// overwrite, and no kernel may use it concurrently.
pub unsafe fn memset_zero(ctx: &Arc<CudaContext>, ptr: u64, bytes: usize) -> Result<()> {
    bind(ctx)?;
    // SAFETY: the caller guarantees the range is writable device memory.
    let status = unsafe { sys::cuMemsetD8_v2(ptr, 0, bytes) };
    check(status, "cuMemsetD8")
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let freed = bind(&self.ctx).and_then(|()| {
            // SAFETY: `ptr` came from cuMemAlloc and is freed once; owners drop buffers only
            // after the kernels using them have finished (they synchronise first).
            let status = unsafe { sys::cuMemFree_v2(self.ptr) };
            check(status, "cuMemFree")
        });
        log_drop_error("freeing a device buffer", freed);
    }
}
