//! Queries about device pointers the user hands in (for buffer registration).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::vmm::PhysicalMemory;
use super::{bind, check};
use crate::error::Result;

type Attr = sys::CUpointer_attribute;

/// Reads a pointer attribute into a zeroed 8-byte word. Attributes are 1- to 8-byte values
/// (bool, int, size_t or pointer) written at the start of the word; zero-initialising keeps
/// the unused high bytes zero on this little-endian host, so the word equals the value.
fn attribute_word(ctx: &CudaContext, attr: Attr, ptr: u64, call: &'static str) -> Result<u64> {
    bind(ctx)?;
    let mut word: u64 = 0;
    // SAFETY: `word` has room for every attribute type used here (at most 8 bytes).
    let status =
        unsafe { sys::cuPointerGetAttribute((&mut word as *mut u64).cast::<c_void>(), attr, ptr) };
    check(status, call)?;
    Ok(word)
}

/// `(base, bytes)` of the allocation containing `ptr` (`cuMemGetAddressRange`).
pub(crate) fn allocation_range(ctx: &Arc<CudaContext>, ptr: u64) -> Result<(u64, usize)> {
    bind(ctx)?;
    let (mut base, mut bytes): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-pointers.
    let status = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut bytes, ptr) };
    check(status, "cuMemGetAddressRange")?;
    Ok((base, bytes))
}

/// `(base, bytes)` of the VMM mapping (one `cuMemMap` call) containing `ptr`; offset 0 of
/// the backing physical allocation is at `base`.
pub(crate) fn mapping_range(ctx: &Arc<CudaContext>, ptr: u64) -> Result<(u64, usize)> {
    let base = attribute_word(
        ctx,
        Attr::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
        ptr,
        "cuPointerGetAttribute(MAPPING_BASE_ADDR)",
    )?;
    let bytes = attribute_word(
        ctx,
        Attr::CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
        ptr,
        "cuPointerGetAttribute(MAPPING_SIZE)",
    )?;
    Ok((base, bytes as usize))
}

/// Whether `ptr` lies in memory mapped through the VMM API (`cuMemMap`), i.e. whether
/// `cuMemRetainAllocationHandle` accepts it.
pub(crate) fn is_vmm(ctx: &Arc<CudaContext>, ptr: u64) -> Result<bool> {
    // The retained reference is released at once when the value drops.
    Ok(PhysicalMemory::retain(ctx, ptr, 0)?.is_some())
}

/// Whether `ptr` can be shared with `cuIpcGetMemHandle`
/// (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`).
pub(crate) fn is_legacy_ipc_capable(ctx: &Arc<CudaContext>, ptr: u64) -> Result<bool> {
    let word = attribute_word(
        ctx,
        Attr::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        ptr,
        "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)",
    )?;
    Ok(word != 0)
}

/// Ordinal of the device whose memory `ptr` points to (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
pub(crate) fn device_ordinal(ctx: &Arc<CudaContext>, ptr: u64) -> Result<i32> {
    let word = attribute_word(
        ctx,
        Attr::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ptr,
        "cuPointerGetAttribute(DEVICE_ORDINAL)",
    )?;
    // An `int`: the low four bytes of the word.
    Ok(word as u32 as i32)
}
