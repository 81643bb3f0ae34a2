//! Device memory the package allocates for `Comm.alloc_registered` (`cuMemAlloc`, so that it
//! can be registered: stream-ordered pool memory cannot) or takes from the communicator's
//! memory pool for `Comm.empty`, and its export as a DLPack capsule
//! (`dltensor`) that `torch.from_dlpack` turns into a tensor. The capsule's tensor holds a
//! reference to the memory; so does the registration (`registered.rs`). The memory is freed
//! when the last of them goes.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, CudaContext};
use devcomm::PoolAllocator;
use pyo3::prelude::*;

use crate::errors::{invalid, IntoPy};
use crate::tensor::{DLDataType, DLDevice, DLTensor, DType, KDL_CUDA};

/// `bytes` of `cuMemAlloc` memory of one context, or of its communicator's memory pool.
#[derive(Debug)]
pub struct DeviceMemory {
    pub ptr: u64,
    pub bytes: u64,
    ctx: Arc<CudaContext>,
    /// The pool the memory came from (`None`: `cuMemAlloc`).
    pool: Option<PoolAllocator>,
}

impl DeviceMemory {
    /// Allocates `bytes` (> 0) with `cuMemAlloc` in `ctx`.
    pub fn alloc(ctx: &Arc<CudaContext>, bytes: u64, rank: usize) -> PyResult<Self> {
        if bytes == 0 {
            return Err(invalid("alloc_registered", "a tensor of zero bytes"));
        }
        let size = usize::try_from(bytes)
            .map_err(|_| invalid("alloc_registered", format!("{bytes} bytes")))?;
        ctx.bind_to_thread()
            .map_err(|e| devcomm::Error::Cuda {
                rank: rank as i32,
                call: "cuCtxSetCurrent (alloc_registered)",
                source: e,
            })
            .py()?;
        // SAFETY: the context is current on this thread (bound above); the returned memory is
        // owned by the `DeviceMemory` and freed once, in `drop`.
        let ptr = unsafe { result::malloc_sync(size) }
            .map_err(|e| devcomm::Error::Cuda {
                rank: rank as i32,
                call: "cuMemAlloc (alloc_registered)",
                source: e,
            })
            .py()?;
        Ok(Self {
            ptr,
            bytes,
            ctx: ctx.clone(),
            pool: None,
        })
    }

    /// Takes over `bytes` at `ptr`, an allocation of `pool`, which gets it back on drop.
    pub fn from_pool(ctx: &Arc<CudaContext>, pool: PoolAllocator, ptr: u64, bytes: u64) -> Self {
        Self {
            ptr,
            bytes,
            ctx: ctx.clone(),
            pool: Some(pool),
        }
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // Work still reading or writing the memory may be in flight on any stream (the tensor
        // died in Python while its kernels run): wait for the device before freeing. Errors
        // cannot be reported from here; a failed free leaks the memory, nothing worse.
        if self.ctx.bind_to_thread().is_ok() {
            let _ = self.ctx.synchronize();
            if let Some(pool) = &self.pool {
                // SAFETY: the allocation was taken over from the pool once and is returned
                // only here; the device is idle, so no kernel uses it any more.
                if let Err(e) = unsafe { pool.free(self.ptr) } {
                    eprintln!("devcomm: returning a tensor's memory to the pool: {e}");
                }
                return;
            }
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed only here; the
            // device is idle (synchronised above), so no kernel uses it any more.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// `DLManagedTensor` (dlpack.h), as produced here.
#[repr(C)]
struct Managed {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut Managed)>,
}

/// What a capsule owns: the managed tensor first (so a pointer to it is a pointer to this),
/// its shape and strides, and a reference to the memory.
#[repr(C)]
struct Holder {
    managed: Managed,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _memory: Arc<DeviceMemory>,
}

const NAME: &std::ffi::CStr = c"dltensor";

/// The DLPack deleter: frees the holder (and with it a reference to the memory). Needs no GIL.
unsafe extern "C" fn delete_managed(m: *mut Managed) {
    if !m.is_null() {
        // SAFETY: `m` is the `managed` field, at offset 0, of a `Holder` leaked by `capsule`
        // with Box::into_raw; DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(m.cast::<Holder>()) });
    }
}

/// The capsule's destructor: deletes the tensor only if no consumer took it (a consumer
/// renames the capsule `used_dltensor` and calls the deleter itself when done).
unsafe extern "C" fn destroy_capsule(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed (GIL held); IsValid and
    // GetPointer only read it.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let m = pyo3::ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<Managed>();
            if let Some(deleter) = m.as_ref().and_then(|m| m.deleter) {
                deleter(m);
            }
        }
    }
}

/// A `dltensor` capsule of `memory` as a contiguous tensor of `shape` and `dtype` on CUDA
/// device `ordinal` (the shape's bytes must fit the memory; checked).
pub fn capsule<'py>(
    py: Python<'py>,
    memory: &Arc<DeviceMemory>,
    shape: &[i64],
    dtype: DType,
    ordinal: i64,
) -> PyResult<Bound<'py, PyAny>> {
    let numel = shape.iter().try_fold(1u64, |n, &d| {
        u64::try_from(d).ok().and_then(|d| n.checked_mul(d))
    });
    let fits = numel
        .and_then(|n| n.checked_mul(dtype.size() as u64))
        .is_some_and(|b| b <= memory.bytes);
    if !fits {
        return Err(invalid(
            "alloc_registered",
            format!(
                "shape {shape:?} of {} does not fit {} bytes",
                dtype.name(),
                memory.bytes
            ),
        ));
    }
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    let (code, bits) = dtype.to_dlpack();
    let mut holder = Box::new(Holder {
        managed: Managed {
            dl_tensor: DLTensor {
                data: memory.ptr as *mut c_void,
                device: DLDevice {
                    device_type: KDL_CUDA,
                    device_id: i32::try_from(ordinal).unwrap_or(0),
                },
                ndim: i32::try_from(shape.len()).unwrap_or(i32::MAX),
                dtype: DLDataType {
                    code,
                    bits,
                    lanes: 1,
                },
                shape: std::ptr::null(),
                strides: std::ptr::null(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_managed),
        },
        shape: shape.to_vec(),
        strides,
        _memory: memory.clone(),
    });
    // The vectors' buffers do not move with the box.
    holder.managed.dl_tensor.shape = holder.shape.as_ptr();
    holder.managed.dl_tensor.strides = holder.strides.as_ptr();
    let raw = Box::into_raw(holder);
    // SAFETY: `raw` is a live, leaked Holder; storing its own address is a plain write.
    unsafe { (*raw).managed.manager_ctx = raw.cast() };
    // SAFETY: the pointer is the leaked Holder (its `managed` at offset 0), the name a static
    // C string, the destructor matches the capsule protocol; the GIL is held (`py`).
    let obj = unsafe { pyo3::ffi::PyCapsule_New(raw.cast(), NAME.as_ptr(), Some(destroy_capsule)) };
    if obj.is_null() {
        // SAFETY: the capsule was not made, so nothing else owns `raw`.
        unsafe { delete_managed(raw.cast()) };
    }
    // SAFETY: a new reference or null with a Python error set, as from_owned_ptr_or_err takes.
    unsafe { Bound::from_owned_ptr_or_err(py, obj) }
}
