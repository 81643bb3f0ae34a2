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
    pub(crate) fn from_slice<T: DeviceRepr>(ctx: &Arc<CudaContext>, values: &[T]) -> Result<Self> {
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
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Copies `out.len()` bytes from `offset` into `out` (`cuMemcpyDtoH`: waits for the
    /// legacy default stream; the caller synchronises the streams that write the buffer).
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range("read", offset, out.len())?;
        bind(&self.ctx)?;
        // SAFETY: the range lies inside the allocation (checked); `out` is as long.
        let status = unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + offset as u64, out.len())
        };
        check(status, "cuMemcpyDtoH")
    }

    /// Copies `bytes` to `offset` (`cuMemcpyHtoD`; may be in flight on return, as
    /// [`DeviceBuffer::from_slice`]).
    pub(crate) fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.check_range("write", offset, bytes.len())?;
        bind(&self.ctx)?;
        // SAFETY: the range lies inside the allocation (checked); the source stays borrowed
        // for the whole (host-synchronous) call.
        let status = unsafe {
            sys::cuMemcpyHtoD_v2(self.ptr + offset as u64, bytes.as_ptr().cast(), bytes.len())
        };
        check(status, "cuMemcpyHtoD")
    }

    fn check_range(&self, what: &'static str, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(crate::error::Error::InvalidArgument {
                op: "DeviceBuffer",
                reason: format!(
                    "{what} of {len} bytes at offset {offset} outside the buffer of {} bytes",
                    self.bytes
                ),
            });
        }
        Ok(())
    }
}

/// Sets `bytes` bytes at device address `ptr` to zero (`cuMemsetD8`). Like the other
/// synchronous writes it may still be in flight on return: call [`super::synchronize`].
///
/// # Safety
///
/// `[ptr, ptr + bytes)` must be device memory accessible from `ctx` that the caller may
/// overwrite, and no kernel may use it concurrently.
pub(crate) unsafe fn memset_zero(ctx: &Arc<CudaContext>, ptr: u64, bytes: usize) -> Result<()> {
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
