//! The communicator's memory pool for Python (docs/PYTHON.md, "The memory pool"): the
//! functions PyTorch's pluggable allocator calls (`devcomm_pool_malloc`, `devcomm_pool_free`,
//! looked up in this library by `torch.cuda.memory.CUDAPluggableAllocator`), `Comm.empty`'s
//! tensors, and the pool's growth, statistics and lookups.
//!
//! The allocator functions find the pool by CUDA device in [`POOLS`], where `Comm.mem_pool()`
//! puts its communicator's pool ([`attach`]): one pool per device (a process drives one GPU).
//! They only sub-allocate (no CUDA call, no communication), so they are safe on any thread
//! and inside graph capture. PyTorch turns a null into its own out-of-memory error, whose
//! text devcomm cannot change: the allocator logs devcomm's error (the pool, the request, its
//! segments and free bytes) to stderr and keeps it for `Comm.pool_last_error()`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use devcomm::raw::RawBuffer;
use devcomm::PoolAllocator;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::comm::PyComm;
use crate::errors::{invalid, IntoPy};
use crate::memory::{capsule, DeviceMemory};
use crate::tensor::DType;

/// The pool of each CUDA device's communicator, for the allocator functions.
static POOLS: Mutex<Option<HashMap<i32, PoolAllocator>>> = Mutex::new(None);

/// The last error of the allocator functions, by device.
static LAST_ERROR: Mutex<Option<HashMap<i32, String>>> = Mutex::new(None);

fn pool_of(device: i32) -> Option<PoolAllocator> {
    let pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    pools.as_ref()?.get(&device).cloned()
}

fn record(device: i32, message: String) {
    // The caller (PyTorch) raises its own out-of-memory error; this says why.
    eprintln!("devcomm: {message}");
    let mut last = LAST_ERROR.lock().unwrap_or_else(PoisonError::into_inner);
    last.get_or_insert_with(HashMap::new)
        .insert(device, message);
}

/// PyTorch's pluggable allocator: `size` bytes of device `device`'s communicator pool, or
/// null (the error logged and kept) when there is none or it is exhausted. The stream is not
/// used: pool memory is not stream-ordered, PyTorch's caching allocator orders its reuse.
#[no_mangle]
pub extern "C" fn devcomm_pool_malloc(
    size: isize,
    device: i32,
    _stream: *mut c_void,
) -> *mut c_void {
    let Some(pool) = pool_of(device) else {
        record(
            device,
            format!(
                "no devcomm memory pool on CUDA device {device}: get torch's pool from \
                 Comm.mem_pool() of this device's communicator"
            ),
        );
        return std::ptr::null_mut();
    };
    match pool.alloc(size.max(0) as u64) {
        Ok(at) => (at.segment_base + at.offset) as *mut c_void,
        Err(e) => {
            record(device, e.to_string());
            std::ptr::null_mut()
        }
    }
}

/// PyTorch's pluggable allocator: returns `ptr` to device `device`'s pool. PyTorch's caching
/// allocator frees a block only when no work uses it any more. A refused free (not a pool
/// allocation, or the communicator is gone) is logged.
#[no_mangle]
pub extern "C" fn devcomm_pool_free(
    ptr: *mut c_void,
    _size: isize,
    device: i32,
    _stream: *mut c_void,
) {
    let Some(pool) = pool_of(device) else {
        record(
            device,
            format!("pool free of {ptr:p}: no devcomm memory pool on CUDA device {device}"),
        );
        return;
    };
    // SAFETY: PyTorch frees a block it allocated here once, after the work using it is done.
    if let Err(e) = unsafe { pool.free(ptr as u64) } {
        record(device, e.to_string());
    }
}

/// Makes `comm`'s pool the one the allocator functions use on its device (replacing an
/// earlier communicator's of the same device).
#[pyfunction]
pub fn pool_attach(comm: &Bound<'_, PyComm>) {
    let c = comm.get();
    let device = i32::try_from(c.ordinal()).unwrap_or(-1);
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    pools
        .get_or_insert_with(HashMap::new)
        .insert(device, c.comm().pool());
}

/// The allocator functions' last error on CUDA device `device` (None when there was none).
#[pyfunction]
pub fn pool_last_error(device: i32) -> Option<String> {
    let last = LAST_ERROR.lock().unwrap_or_else(PoisonError::into_inner);
    last.as_ref()?.get(&device).cloned()
}

/// Collective: grows `comm`'s pool by a segment of at least `nbytes`; returns its index.
#[pyfunction]
pub fn pool_grow(py: Python<'_>, comm: &Bound<'_, PyComm>, nbytes: usize) -> PyResult<usize> {
    let c = comm.get();
    py.detach(|| c.comm().grow_pool(nbytes)).py()
}

/// The pool's `segments` (sizes), `free` bytes, `largest_free` range and live `allocations`.
#[pyfunction]
pub fn pool_usage<'py>(py: Python<'py>, comm: &Bound<'py, PyComm>) -> PyResult<Bound<'py, PyDict>> {
    let u = comm.get().comm().pool_usage();
    let d = PyDict::new(py);
    d.set_item("segments", u.segments)?;
    d.set_item("free", u.free)?;
    d.set_item("largest_free", u.largest_free)?;
    d.set_item("allocations", u.allocations)?;
    Ok(d)
}

/// Where `[ptr, ptr+nbytes)` lies in the pool: `(segment, offset, segment_base,
/// segment_bytes, device_handle)`, or None when it is not inside one segment.
#[pyfunction]
pub fn pool_lookup(
    comm: &Bound<'_, PyComm>,
    ptr: u64,
    nbytes: u64,
) -> Option<(usize, u64, u64, u64, u64)> {
    let at = comm.get().comm().pool_lookup(ptr, nbytes)?;
    Some((
        at.segment,
        at.offset,
        at.segment_base,
        at.segment_bytes,
        at.device_handle,
    ))
}

/// Local: a contiguous tensor of `shape` and `dtype` from `comm`'s pool, as a DLPack capsule
/// with its address: `(ptr, capsule)`. `devcomm.PoolExhausted` when the pool has no room.
/// The memory goes back to the pool when the tensor (and every view) is gone; that waits for
/// the device.
#[pyfunction]
pub fn pool_empty<'py>(
    py: Python<'py>,
    comm: &Bound<'py, PyComm>,
    shape: Vec<i64>,
    dtype: &str,
) -> PyResult<(u64, Bound<'py, PyAny>)> {
    const OP: &str = "empty";
    let c = comm.get();
    let dt =
        DType::from_name(dtype).ok_or_else(|| invalid(OP, format!("unknown dtype {dtype}")))?;
    let numel = shape.iter().try_fold(1u64, |n, &d| {
        u64::try_from(d).ok().and_then(|d| n.checked_mul(d))
    });
    let bytes = numel
        .and_then(|n| n.checked_mul(dt.size() as u64))
        .ok_or_else(|| invalid(OP, format!("shape {shape:?} of {dtype}")))?;
    let pool = c.comm().pool();
    let at = pool.alloc(bytes).py()?;
    let memory = Arc::new(DeviceMemory::from_pool(
        c.comm().context(),
        pool,
        at.segment_base + at.offset,
        bytes,
    ));
    let cap = capsule(py, &memory, &shape, dt, c.ordinal())?;
    Ok((memory.ptr, cap))
}

/// Zero-copy send of `t` into `peer`'s pool memory at the address `dst` has on this rank (the
/// pool is symmetric when the ranks allocate in the same order; the peer's receive names its
/// own tensor at that address, and a different range is a zero-copy mismatch).
#[pyfunction]
pub fn pool_send(
    py: Python<'_>,
    comm: &Bound<'_, PyComm>,
    t: &Bound<'_, PyAny>,
    peer: usize,
    dst: u64,
    stream: u64,
) -> PyResult<()> {
    const OP: &str = "send_registered";
    let c = comm.get();
    let d = c.tensor(OP, "the tensor", t, stream)?;
    let range = c
        .comm()
        .registered_range_of(dst, d.bytes())
        .ok_or_else(|| {
            invalid(
                OP,
                format!(
                    "the destination [{dst:#x}, +{}) lies in no segment of rank {}'s memory pool",
                    d.bytes(),
                    c.comm().rank()
                ),
            )
        })?;
    let s = c.stream(stream)?;
    let buf = RawBuffer {
        ptr: d.ptr,
        elems: d.numel(),
        elem_size: d.dtype.size(),
    };
    // SAFETY: the tensor was checked (this device, contiguous) and spans its bytes; it is only
    // read, and its owner keeps it alive for the stream's work. The range is in a pool segment,
    // which lives as long as the communicator.
    py.detach(|| unsafe { c.comm().send_registered_raw(buf, peer, range, &s) })
        .py()
}
