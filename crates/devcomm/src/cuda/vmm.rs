//! CUDA virtual memory management: shareable physical allocations and their mappings.
//!
//! Sequence used by the layers above (and the only order that is valid):
//! `PhysicalMemory::create` (cuMemCreate, POSIX-fd shareable) -> `Mapping::new`
//! (cuMemAddressReserve, cuMemMap, cuMemSetAccess) -> `export_fd`
//! (cuMemExportToShareableHandle) ... peer: `PhysicalMemory::import`
//! (cuMemImportFromShareableHandle) -> `Mapping::new`. Tear-down: drop the `Mapping`
//! (cuMemUnmap, cuMemAddressFree) before the `PhysicalMemory` (cuMemRelease).

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::{bind, check, log_drop_error};
use crate::error::{Error, Result};

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// Allocation properties for pinned device memory on `ctx`'s device, shareable as a POSIX fd.
fn allocation_prop(ctx: &CudaContext) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: POSIX_FD,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ctx.cu_device(),
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn query_granularity(
    ctx: &CudaContext,
    option: sys::CUmemAllocationGranularity_flags,
) -> Result<usize> {
    bind(ctx)?;
    let prop = allocation_prop(ctx);
    let mut granularity = 0usize;
    // SAFETY: valid out-pointer and property struct; the context is current.
    let status = unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, option) };
    check(status, "cuMemGetAllocationGranularity")?;
    if granularity == 0 || !granularity.is_power_of_two() {
        return Err(Error::InvalidArgument {
            op: "cuMemGetAllocationGranularity",
            reason: format!("driver reported granularity {granularity}, not a power of two"),
        });
    }
    Ok(granularity)
}

/// The recommended allocation granularity of `ctx`'s device (2 MiB on Hopper): sizes of
/// symmetric allocations are rounded up to it.
pub(crate) fn granularity(ctx: &CudaContext) -> Result<usize> {
    query_granularity(
        ctx,
        sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
    )
}

/// The minimum granularity: every mapping size must be a multiple of it.
pub(crate) fn min_granularity(ctx: &CudaContext) -> Result<usize> {
    query_granularity(
        ctx,
        sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
    )
}

/// `bytes` rounded up to a multiple of `granularity` (a power of two), at least one granule;
/// `None` on overflow.
pub(crate) fn round_up(bytes: usize, granularity: usize) -> Option<usize> {
    debug_assert!(granularity.is_power_of_two());
    let bytes = bytes.max(1);
    bytes
        .checked_add(granularity - 1)
        .map(|b| b & !(granularity - 1))
}

/// A physical allocation (`CUmemGenericAllocationHandle`), released on drop. Mappings of it
/// must be dropped first.
pub struct PhysicalMemory {
    ctx: Arc<CudaContext>,
    handle: sys::CUmemGenericAllocationHandle,
    bytes: usize,
}

impl std::fmt::Debug for PhysicalMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhysicalMemory")
            .field("handle", &format_args!("{:#x}", self.handle))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl PhysicalMemory {
    /// Creates pinned memory of at least `bytes` bytes on `ctx`'s device, rounded up to the
    /// recommended `granularity`; [`bytes`](Self::bytes) gives the rounded size. Shareable
    /// as a POSIX file descriptor.
    pub fn create(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        let granularity = granularity(ctx)?;
        let rounded = round_up(bytes, granularity).ok_or_else(|| Error::InvalidArgument {
            op: "cuMemCreate",
            reason: format!("{bytes} bytes overflow when rounded up to {granularity}"),
        })?;
        bind(ctx)?;
        let prop = allocation_prop(ctx);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and properties; `rounded` is a multiple of the granularity;
        // flags must be 0.
        let status = unsafe { sys::cuMemCreate(&mut handle, rounded, &prop, 0) };
        check(status, "cuMemCreate")?;
        Ok(Self {
            ctx: ctx.clone(),
            handle,
            bytes: rounded,
        })
    }

    /// Imports memory another process exported with [`export_fd`](Self::export_fd).
    /// `bytes` is the exporter's (rounded) size. The fd stays open; the caller closes it.
    pub(crate) fn import(ctx: &Arc<CudaContext>, fd: BorrowedFd<'_>, bytes: usize) -> Result<Self> {
        bind(ctx)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // The POSIX-fd handle type takes the fd itself, cast to a pointer-sized value.
        let os_handle = fd.as_raw_fd() as usize as *mut c_void;
        // SAFETY: valid out-pointer; `os_handle` is an open fd for the duration of the call.
        let status =
            unsafe { sys::cuMemImportFromShareableHandle(&mut handle, os_handle, POSIX_FD) };
        check(status, "cuMemImportFromShareableHandle")?;
        Ok(Self {
            ctx: ctx.clone(),
            handle,
            bytes,
        })
    }

    /// The allocation that backs the VMM-mapped address `ptr` (cuMemRetainAllocationHandle),
    /// or `None` when `ptr` is not VMM memory (e.g. `cuMemAlloc`). `bytes` is the size of the
    /// mapping containing `ptr` (see `pointer::mapping_range`). Releasing the value
    /// drops the reference it took; the owner's mapping is not affected.
    pub(crate) fn retain(ctx: &Arc<CudaContext>, ptr: u64, bytes: usize) -> Result<Option<Self>> {
        bind(ctx)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer; the driver only looks the address up.
        let status = unsafe { sys::cuMemRetainAllocationHandle(&mut handle, ptr as *mut c_void) };
        match status {
            sys::CUresult::CUDA_SUCCESS => Ok(Some(Self {
                ctx: ctx.clone(),
                handle,
                bytes,
            })),
            other => {
                // Memory from cuMemAlloc / cudaMalloc answers CUDA_ERROR_INVALID_VALUE here.
                log::debug!("cuMemRetainAllocationHandle({ptr:#x}): {other:?}: not VMM memory");
                Ok(None)
            }
        }
    }

    /// Exports the allocation as a POSIX file descriptor (for `Store::exchange_fds`).
    pub(crate) fn export_fd(&self) -> Result<OwnedFd> {
        bind(&self.ctx)?;
        let mut fd: c_int = -1;
        // SAFETY: for the POSIX-fd type the driver writes an `int` to the out-pointer.
        let status = unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut c_int).cast(),
                self.handle,
                POSIX_FD,
                0,
            )
        };
        check(status, "cuMemExportToShareableHandle")?;
        if fd < 0 {
            return Err(Error::InvalidArgument {
                op: "cuMemExportToShareableHandle",
                reason: format!("driver returned fd {fd}"),
            });
        }
        // SAFETY: the driver created `fd` for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Size in bytes (a multiple of the granularity for created memory).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
        let released = bind(&self.ctx).and_then(|()| {
            // SAFETY: the handle is owned by `self` and released once. Mappings of it were
            // dropped before (they own no reference, the driver keeps mapped memory alive).
            let status = unsafe { sys::cuMemRelease(self.handle) };
            check(status, "cuMemRelease")
        });
        log_drop_error("releasing physical memory", released);
    }
}

/// A virtual address range of this process mapped to a [`PhysicalMemory`], readable and
/// writable by `ctx`'s device. Drop unmaps and frees the range.
pub struct Mapping {
    ctx: Arc<CudaContext>,
    ptr: u64,
    bytes: usize,
    mapped: bool,
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Mapping {
    /// Reserves an address range aligned to the recommended granularity, maps the first
    /// `bytes` bytes of `memory` there (offset 0) and grants `ctx`'s device read/write access.
    /// `bytes` must be a multiple of the minimum granularity and at most `memory.bytes()`.
    pub fn new(ctx: &Arc<CudaContext>, memory: &PhysicalMemory, bytes: usize) -> Result<Self> {
        let min = min_granularity(ctx)?;
        let align = granularity(ctx)?;
        if bytes == 0 || bytes % min != 0 || bytes > memory.bytes {
            return Err(Error::InvalidArgument {
                op: "cuMemMap",
                reason: format!(
                    "cannot map {bytes} bytes of a {}-byte allocation (granularity {min})",
                    memory.bytes
                ),
            });
        }
        bind(ctx)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; size and alignment are granularity multiples; no fixed
        // address (0) and no flags.
        let status = unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, align, 0, 0) };
        check(status, "cuMemAddressReserve")?;
        // From here on, drop undoes whatever succeeded.
        let mut mapping = Self {
            ctx: ctx.clone(),
            ptr,
            bytes,
            mapped: false,
        };
        // SAFETY: the range [ptr, ptr+bytes) was just reserved and is unmapped; offset 0 and
        // `bytes <= memory.bytes`; flags must be 0.
        let status = unsafe { sys::cuMemMap(ptr, bytes, 0, memory.handle, 0) };
        check(status, "cuMemMap")?;
        mapping.mapped = true;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ctx.cu_device(),
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is fully mapped; one descriptor.
        let status = unsafe { sys::cuMemSetAccess(ptr, bytes, &access, 1) };
        check(status, "cuMemSetAccess")?;
        Ok(mapping)
    }

    /// Device address of the start of the mapping.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let freed = bind(&self.ctx).and_then(|()| {
            if self.mapped {
                // SAFETY: exactly this range was mapped by `new`; owners synchronise the
                // device before dropping mappings that kernels may use.
                let status = unsafe { sys::cuMemUnmap(self.ptr, self.bytes) };
                check(status, "cuMemUnmap")?;
            }
            // SAFETY: exactly this range was reserved by `new` and is now unmapped.
            let status = unsafe { sys::cuMemAddressFree(self.ptr, self.bytes) };
            check(status, "cuMemAddressFree")
        });
        log_drop_error("unmapping memory", freed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_up_to_granularity() {
        const G: usize = 2 << 20;
        assert_eq!(
            round_up(0, G),
            Some(G),
            "empty requests still get one granule"
        );
        assert_eq!(round_up(1, G), Some(G));
        assert_eq!(round_up(G, G), Some(G));
        assert_eq!(round_up(G + 1, G), Some(2 * G));
        assert_eq!(round_up(3 * G - 8, G), Some(3 * G));
        assert_eq!(round_up(usize::MAX - 3, G), None);
    }
}
