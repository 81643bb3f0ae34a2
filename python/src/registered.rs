//! Registered buffers (docs/PYTHON.md, "Registered buffers"): the registrations a
//! communicator holds for Python, by an id that is never reused, and the zero-copy operations
//! on them. A registration keeps what it covers alive (the torch tensor, or the memory of
//! `alloc_registered`) until it is deregistered or the communicator is dropped.
//!
//! `register`, `alloc_registered` and `deregister` are collective; a rank that refuses its
//! arguments tells the others through the store first (`agree`), so every rank raises instead
//! of waiting for it.

use std::sync::{Arc, Mutex, PoisonError};

use devcomm::raw::RawBuffer;
use devcomm::RegisteredRange;
use pyo3::prelude::*;

use crate::comm::PyComm;
use crate::errors::{invalid, IntoPy};
use crate::memory::{capsule, DeviceMemory};
use crate::tensor::{describe, DType, TensorDesc};

/// What a registration keeps alive (held, never read: dropping it releases the memory).
#[derive(Debug)]
#[allow(dead_code)]
enum Keep {
    /// The registered object (a torch tensor): its memory stays allocated.
    Object(Py<PyAny>),
    /// Memory of `alloc_registered`.
    Memory(Arc<DeviceMemory>),
}

#[derive(Debug)]
struct Entry {
    id: u64,
    handle: u64,
    ptr: u64,
    bytes: u64,
    _keep: Keep,
}

/// A communicator's registrations, in creation order (the same on every rank).
#[derive(Debug, Default)]
pub struct Table {
    inner: Mutex<(u64, Vec<Entry>)>,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Vec<Entry>)> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, handle: u64, ptr: u64, bytes: u64, keep: Keep) -> u64 {
        let mut t = self.lock();
        t.0 += 1;
        let id = t.0;
        t.1.push(Entry {
            id,
            handle,
            ptr,
            bytes,
            _keep: keep,
        });
        id
    }

    /// `(handle, ptr, bytes)` of a live registration.
    fn get(&self, id: u64) -> Option<(u64, u64, u64)> {
        let t = self.lock();
        t.1.iter()
            .find(|e| e.id == id)
            .map(|e| (e.handle, e.ptr, e.bytes))
    }

    fn remove(&self, id: u64) -> Option<Entry> {
        let mut t = self.lock();
        let at = t.1.iter().position(|e| e.id == id)?;
        Some(t.1.remove(at))
    }

    /// The oldest live registration that holds all of `[ptr, ptr+bytes)`, as
    /// `(id, handle, offset)`.
    pub fn find(&self, ptr: u64, bytes: u64) -> Option<(u64, u64, u64)> {
        let t = self.lock();
        t.1.iter()
            .find(|e| within(e.ptr, e.bytes, ptr, bytes))
            .map(|e| (e.id, e.handle, ptr - e.ptr))
    }
}

/// Whether `[ptr, ptr+bytes)` lies inside `[base, base+size)`.
fn within(base: u64, size: u64, ptr: u64, bytes: u64) -> bool {
    match (ptr.checked_add(bytes), base.checked_add(size)) {
        (Some(end), Some(limit)) => ptr >= base && end <= limit,
        _ => false,
    }
}

/// The byte offset of `[ptr, ptr+bytes)` in the registered range `[base, base+size)`, or why
/// it is not inside.
pub fn locate(op: &str, what: &str, base: u64, size: u64, ptr: u64, bytes: u64) -> PyResult<u64> {
    if within(base, size, ptr, bytes) {
        return Ok(ptr - base);
    }
    Err(invalid(
        op,
        format!(
            "{what} [{ptr:#x}, +{bytes}) does not lie inside the registration [{base:#x}, \
             +{size})"
        ),
    ))
}

/// A send offset (bytes into the peer's registered buffer) must be a whole number of the
/// message's elements, so that the data lands on element boundaries there.
pub fn check_offset(op: &str, offset: u64, elem: usize, bytes: u64) -> PyResult<()> {
    if offset % elem as u64 != 0 {
        return Err(invalid(
            op,
            format!("offset {offset} is not a multiple of the message's {elem}-byte elements"),
        ));
    }
    if offset.checked_add(bytes).is_none() {
        return Err(invalid(
            op,
            format!("offset {offset} + {bytes} bytes overflow"),
        ));
    }
    Ok(())
}

fn dead(op: &str, id: u64, rank: usize) -> PyErr {
    invalid(
        op,
        format!("registration {id} was deregistered (or never made) on rank {rank}"),
    )
}

/// Ends a rank's local checks of a collective call with an agreement through the store:
/// if any rank refused, every rank raises `InvalidArgument` (a refusing rank its own error)
/// and none enters the collective.
fn agree<T>(py: Python<'_>, c: &PyComm, step: &str, local: PyResult<T>) -> PyResult<T> {
    let comm = c.comm();
    let status = match &local {
        Ok(_) => Vec::new(),
        Err(e) => format!("!{}", e.value(py)).into_bytes(),
    };
    let tag = format!("devcomm-python/{step}/{}", c.next_agreement());
    let timeout = comm.setup_timeout();
    let all = py
        .detach(|| comm.store().all_gather(&tag, &status, timeout))
        .map_err(devcomm::Error::from)
        .py()?;
    let failures: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, s)| s.first() == Some(&b'!'))
        .map(|(r, s)| format!("rank {r}: {}", String::from_utf8_lossy(&s[1..])))
        .collect();
    match local {
        Ok(_) if !failures.is_empty() => Err(invalid(
            step,
            format!("refused on other ranks: {}", failures.join("; ")),
        )),
        other => other,
    }
}

fn buffer(d: &TensorDesc) -> RawBuffer {
    RawBuffer {
        ptr: d.ptr,
        elems: d.numel(),
        elem_size: d.dtype.size(),
    }
}

/// Collective: registers the tensor `obj` describes (its bytes, contiguous, on this rank's
/// device; the memory must be `cudaMalloc`/`cuMemAlloc` memory or fd-exportable VMM memory)
/// and holds `keep` (the tensor itself) until it is deregistered. Returns `(id, ptr, bytes)`.
#[pyfunction]
pub fn register(
    py: Python<'_>,
    comm: &Bound<'_, PyComm>,
    obj: &Bound<'_, PyAny>,
    keep: &Bound<'_, PyAny>,
    stream: u64,
) -> PyResult<(u64, u64, u64)> {
    const OP: &str = "register";
    let c = comm.get();
    let local = c.tensor(OP, "the tensor", obj, stream).and_then(|d| {
        if d.bytes() == 0 {
            return Err(invalid(OP, "the tensor has no elements"));
        }
        Ok(d)
    });
    let d = agree(py, c, OP, local)?;
    let bytes = usize::try_from(d.bytes())
        .map_err(|_| invalid(OP, format!("{} bytes do not fit this host", d.bytes())))?;
    // SAFETY: `keep` (the tensor) is held with the registration until it is deregistered.
    let handle = py
        .detach(|| unsafe { c.comm().register_raw(d.ptr, bytes) })
        .py()?;
    let id = c.registrations().insert(
        handle,
        d.ptr,
        d.bytes(),
        Keep::Object(keep.clone().unbind()),
    );
    Ok((id, d.ptr, d.bytes()))
}

/// Collective: allocates `shape` elements of `dtype` with `cuMemAlloc`, registers them, and
/// returns `(id, ptr, bytes, capsule)`, the capsule a DLPack `dltensor` of the memory. The
/// memory lives while the registration or the capsule's tensor does.
#[pyfunction]
pub fn alloc_registered<'py>(
    py: Python<'py>,
    comm: &Bound<'py, PyComm>,
    shape: Vec<i64>,
    dtype: &str,
) -> PyResult<(u64, u64, u64, Bound<'py, PyAny>)> {
    const OP: &str = "alloc_registered";
    let c = comm.get();
    let cc = c.comm();
    let local = (|| {
        let dt = DType::from_name(dtype).ok_or_else(|| invalid(OP, format!("dtype {dtype}")))?;
        let numel = shape.iter().try_fold(1u64, |n, &d| {
            u64::try_from(d).ok().and_then(|d| n.checked_mul(d))
        });
        let bytes = numel
            .and_then(|n| n.checked_mul(dt.size() as u64))
            .ok_or_else(|| invalid(OP, format!("shape {shape:?}")))?;
        let memory = Arc::new(DeviceMemory::alloc(cc.context(), bytes, cc.rank())?);
        let cap = capsule(py, &memory, &shape, dt, c.ordinal())?;
        Ok((memory, cap))
    })();
    let (memory, cap) = agree(py, c, OP, local)?;
    let (ptr, bytes) = (memory.ptr, memory.bytes);
    // SAFETY: `memory` is kept with the registration until it is deregistered.
    let handle = py
        .detach(|| unsafe { cc.register_raw(ptr, bytes as usize) })
        .py()?;
    let id = c
        .registrations()
        .insert(handle, ptr, bytes, Keep::Memory(memory));
    Ok((id, ptr, bytes, cap))
}

/// Collective: releases registration `id` (waits for the device and for every rank); what it
/// kept alive is released after.
#[pyfunction]
pub fn deregister(py: Python<'_>, comm: &Bound<'_, PyComm>, id: u64) -> PyResult<()> {
    const OP: &str = "deregister";
    let c = comm.get();
    let cc = c.comm();
    let local = c
        .registrations()
        .get(id)
        .ok_or_else(|| dead(OP, id, cc.rank()));
    let (handle, _, _) = agree(py, c, OP, local)?;
    let result = py.detach(|| cc.deregister_raw(handle));
    // The crate forgets the handle once every rank agreed, even if the release then failed.
    if result.is_ok() || cc.registered_address_raw(handle, cc.rank()).is_none() {
        drop(c.registrations().remove(id));
    }
    result.py()
}

/// Sends `t` into `peer`'s buffer of registration `id`, `offset` bytes in.
#[pyfunction]
pub fn send_registered(
    py: Python<'_>,
    comm: &Bound<'_, PyComm>,
    t: &Bound<'_, PyAny>,
    peer: usize,
    id: u64,
    offset: u64,
    stream: u64,
) -> PyResult<()> {
    const OP: &str = "send_registered";
    let c = comm.get();
    let d = c.tensor(OP, "the tensor", t, stream)?;
    check_offset(OP, offset, d.dtype.size(), d.bytes())?;
    let (handle, _, _) = c
        .registrations()
        .get(id)
        .ok_or_else(|| dead(OP, id, c.comm().rank()))?;
    let s = c.stream(stream)?;
    // SAFETY: `handle` is live (found among the registrations), and deregistering it is a
    // collective call on this thread after this one.
    let dst = unsafe { RegisteredRange::from_raw(handle, offset, d.bytes()) };
    // SAFETY: the tensor was checked (this device, contiguous) and spans its bytes; it is only
    // read, and its owner keeps it alive for the stream's work.
    py.detach(|| unsafe { c.comm().send_registered_raw(buffer(&d), peer, dst, &s) })
        .py()
}

/// This rank's range of `t` in registration `id` (or, for None, the oldest that holds it, else
/// the communicator's memory pool).
fn recv_range(
    c: &PyComm,
    op: &str,
    d: &TensorDesc,
    id: Option<u64>,
) -> PyResult<RegisteredRange<'static>> {
    let rank = c.comm().rank();
    match id {
        Some(id) => {
            let (handle, base, size) = c
                .registrations()
                .get(id)
                .ok_or_else(|| dead(op, id, rank))?;
            let offset = locate(op, "recv", base, size, d.ptr, d.bytes())?;
            // SAFETY: as in `send_registered`.
            Ok(unsafe { RegisteredRange::from_raw(handle, offset, d.bytes()) })
        }
        None => c
            .registrations()
            .find(d.ptr, d.bytes())
            // SAFETY: as in `send_registered`.
            .map(|(_, handle, offset)| unsafe {
                RegisteredRange::from_raw(handle, offset, d.bytes())
            })
            // Memory of the communicator's pool is registered as its segments, which live as
            // long as the communicator.
            .or_else(|| {
                c.comm().pool_lookup(d.ptr, d.bytes()).map(|at| {
                    // SAFETY: a pool segment's registration, live while the communicator is.
                    unsafe { RegisteredRange::from_raw(at.device_handle, at.offset, d.bytes()) }
                })
            })
            .ok_or_else(|| {
                invalid(
                    op,
                    format!(
                        "recv [{:#x}, +{}) lies inside no registration nor the memory pool of \
                         rank {rank}",
                        d.ptr,
                        d.bytes()
                    ),
                )
            }),
    }
}

/// Receives `t`'s bytes from `peer` straight into `t`, which lies inside a registration of
/// this rank (`id`, or found).
#[pyfunction]
#[pyo3(signature = (comm, t, peer, id, stream))]
pub fn recv_registered(
    py: Python<'_>,
    comm: &Bound<'_, PyComm>,
    t: &Bound<'_, PyAny>,
    peer: usize,
    id: Option<u64>,
    stream: u64,
) -> PyResult<()> {
    const OP: &str = "recv_registered";
    let c = comm.get();
    let d = c.tensor(OP, "recv", t, stream)?;
    let dst = recv_range(c, OP, &d, id)?;
    let s = c.stream(stream)?;
    py.detach(|| c.comm().recv_registered(dst, peer, &s)).py()
}

/// Both in one kernel: `send` into `send_peer`'s buffer of registration `send_id` at
/// `offset`, and `recv` (inside a registration of this rank) from `recv_peer`.
#[pyfunction]
#[pyo3(signature = (comm, send, send_peer, send_id, offset, recv, recv_peer, recv_id, stream))]
#[allow(clippy::too_many_arguments)]
pub fn sendrecv_registered(
    py: Python<'_>,
    comm: &Bound<'_, PyComm>,
    send: &Bound<'_, PyAny>,
    send_peer: usize,
    send_id: u64,
    offset: u64,
    recv: &Bound<'_, PyAny>,
    recv_peer: usize,
    recv_id: Option<u64>,
    stream: u64,
) -> PyResult<()> {
    const OP: &str = "sendrecv_registered";
    let c = comm.get();
    let a = c.tensor(OP, "send", send, stream)?;
    let b = c.tensor(OP, "recv", recv, stream)?;
    check_offset(OP, offset, a.dtype.size(), a.bytes())?;
    let (handle, _, _) = c
        .registrations()
        .get(send_id)
        .ok_or_else(|| dead(OP, send_id, c.comm().rank()))?;
    let recv_dst = recv_range(c, OP, &b, recv_id)?;
    let s = c.stream(stream)?;
    // SAFETY: as in `send_registered`.
    let send_dst = unsafe { RegisteredRange::from_raw(handle, offset, a.bytes()) };
    // SAFETY: as in `send_registered`; `recv` is written by the peer through the registration.
    py.detach(|| unsafe {
        c.comm()
            .sendrecv_registered_raw(buffer(&a), send_peer, send_dst, recv_dst, recv_peer, &s)
    })
    .py()
}

/// Where a tensor lies in a registered range `[base, base+nbytes)`: its byte offset, or
/// `InvalidArgument` when it is not inside (or not contiguous). The check the registered
/// operations make; exposed for `Registration.offset_of` and for tests.
#[pyfunction]
#[pyo3(signature = (obj, base, nbytes, ordinal = 0))]
pub fn locate_in(obj: &Bound<'_, PyAny>, base: u64, nbytes: u64, ordinal: i64) -> PyResult<u64> {
    const OP: &str = "locate";
    let d = describe(OP, "the tensor", obj, 0)?;
    d.check(OP, "the tensor", ordinal)?;
    locate(OP, "the tensor", base, nbytes, d.ptr, d.bytes())
}

/// The check of a send offset, exposed for tests: `InvalidArgument` when `offset` is not a
/// multiple of `elem_size` or overflows with `nbytes`.
#[pyfunction]
pub fn check_send_offset(offset: u64, elem_size: usize, nbytes: u64) -> PyResult<()> {
    check_offset("send_registered", offset, elem_size.max(1), nbytes)
}
