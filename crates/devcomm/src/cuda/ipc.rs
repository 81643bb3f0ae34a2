//! Legacy CUDA IPC for `cuMemAlloc`/`cudaMalloc` memory that another process owns.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::{bind, check, log_drop_error};
use crate::error::{Error, Result};

/// Size of a `CUipcMemHandle`.
pub(crate) const IPC_HANDLE_BYTES: usize = 64;

/// An opaque 64-byte handle that lets another process on this host open an allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpcHandle([u8; IPC_HANDLE_BYTES]);

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IpcHandle(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..)")
    }
}

impl IpcHandle {
    /// The handle of the allocation that contains `ptr` (pass the allocation's base: the
    /// importer's address corresponds to the base, see [`super::pointer::allocation_range`]).
    pub(crate) fn get(ctx: &Arc<CudaContext>, ptr: u64) -> Result<Self> {
        bind(ctx)?;
        // SAFETY: all-zero bits are a valid `CUipcMemHandle` (a byte array).
        let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; the driver only looks the address up.
        let status = unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) };
        check(status, "cuIpcGetMemHandle")?;
        Ok(Self(handle.reserved.map(|c| c as u8)))
    }

    /// The handle's bytes, to send to other processes.
    pub(crate) fn as_bytes(&self) -> &[u8; IPC_HANDLE_BYTES] {
        &self.0
    }

    /// A handle received from another process; `bytes` must be exactly 64 bytes.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let array: [u8; IPC_HANDLE_BYTES] =
            bytes.try_into().map_err(|_| Error::InvalidArgument {
                op: "IpcHandle::from_bytes",
                reason: format!("expected {IPC_HANDLE_BYTES} bytes, got {}", bytes.len()),
            })?;
        Ok(Self(array))
    }

    /// Opens the handle in `ctx` with lazy peer access (no `cuCtxEnablePeerAccess` needed).
    pub(crate) fn open(ctx: &Arc<CudaContext>, handle: &IpcHandle) -> Result<IpcMapping> {
        bind(ctx)?;
        let raw = sys::CUipcMemHandle {
            reserved: handle.0.map(|b| b as std::ffi::c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
        // SAFETY: valid out-pointer; `raw` is passed by value.
        let status = unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, raw, flags) };
        check(status, "cuIpcOpenMemHandle")?;
        Ok(IpcMapping {
            ctx: ctx.clone(),
            ptr,
        })
    }
}

/// Another process's allocation opened in this process; closed on drop.
///
/// The driver reference-counts opens of one handle in one context: opening the same
/// allocation twice returns the same address, and each mapping closes its own reference.
pub(crate) struct IpcMapping {
    ctx: Arc<CudaContext>,
    ptr: u64,
}

impl std::fmt::Debug for IpcMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcMapping")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .finish()
    }
}

impl IpcMapping {
    /// Address of the allocation's base in this process.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let closed = bind(&self.ctx).and_then(|()| {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle and is closed once; owners
            // synchronise the device before dropping mappings that kernels may use.
            let status = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
            check(status, "cuIpcCloseMemHandle")
        });
        log_drop_error("closing an IPC mapping", closed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_bytes_round_trip() {
        let bytes: Vec<u8> = (0..64).map(|i| (i * 7 + 200) as u8).collect();
        let handle = IpcHandle::from_bytes(&bytes).unwrap();
        assert_eq!(handle.as_bytes().as_slice(), bytes.as_slice());
        assert!(IpcHandle::from_bytes(&bytes[..63]).is_err());
    }
}
