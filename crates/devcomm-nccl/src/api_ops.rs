//! The exported operations: routed to devcomm (`route`) or forwarded to the real NCCL.
#![allow(non_snake_case)]
// NCCL's names
// C entry points: the pointers are the C caller's, under nccl.h's contract for each call.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use devcomm::raw::RawBuffer;
use devcomm::HookArgs;

use crate::api_comm::guarded;
use crate::comm::{nccl_call, overlap, resolve, staged, Handle, ShimComm};
use crate::error::Failure;
use crate::fallback::Nccl;
use crate::ffi::{self, CudaStreamT, NcclCommT, NcclDataType, NcclRedOp, NcclResult};
use crate::group::{self, P2pCall};
use crate::route::{route, Op, Plan, Route};

/// Runs an operation: `f` on this library's communicator (given `nccl`, the operation's real
/// NCCL form, for the calls it hands on), or `nccl` itself on a real NCCL communicator (a
/// call from inside the real NCCL, `comm::Handle::Inner`). A failure inside a group is kept
/// for `ncclGroupEnd` (as NCCL reports it there) and also returned now; devcomm's device
/// errors become the communicator's asynchronous error.
fn op_call<N: FnOnce(&'static Nccl, NcclCommT) -> Option<NcclResult>>(
    call: &str,
    c: NcclCommT,
    nccl: N,
    f: impl FnOnce(&Arc<ShimComm>, N) -> Result<(), Failure>,
) -> NcclResult {
    guarded(call, || {
        let comm = match resolve(call, c)? {
            Handle::Shim(comm) => comm,
            Handle::Inner(nc) => return nccl_call(call, nc, nccl),
        };
        let r = f(&comm, nccl);
        if let Err(e) = &r {
            if e.code == ffi::REMOTE_ERROR {
                comm.set_async_error(e.code);
            }
            if group::in_group() {
                group::defer_error(e.clone());
            }
        }
        r
    })
}

/// Hands the call to the real NCCL on the communicator beside `comm`'s.
fn to_nccl(
    call: &str,
    comm: &ShimComm,
    nccl: impl FnOnce(&'static Nccl, NcclCommT) -> Option<NcclResult>,
) -> Result<(), Failure> {
    let (_, nc) = comm.nccl(call)?;
    nccl_call(call, nc, nccl)
}

fn checked_size(call: &str, t: NcclDataType) -> Result<usize, Failure> {
    ffi::type_size(t).ok_or_else(|| {
        Failure::invalid_argument(format!("{call}: data type {t} is not an NCCL type"))
    })
}

fn devcomm_err(call: &'static str) -> impl Fn(devcomm::Error) -> Failure {
    move |e| Failure::from_devcomm(call, &e)
}

/// `ncclAllReduce`.
#[no_mangle]
pub extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    t: NcclDataType,
    op: NcclRedOp,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    const CALL: &str = "ncclAllReduce";
    op_call(
        CALL,
        c,
        |lib, nc| {
            let f = lib.all_reduce?;
            // SAFETY: NCCL's prototype, the caller's arguments.
            Some(unsafe { f(send, recv, count, t, op, nc, stream) })
        },
        |comm, nccl| {
            checked_size(CALL, t)?;
            match route(Op::AllReduce, t, Some(op), comm.job) {
                Route::Devcomm(Plan::Reduce { dtype, op }) if count > 0 => {
                    let (send, recv, stream) = (send as u64, recv as u64, stream as usize);
                    group::launch(comm, move |comm| {
                        let (dc, s) = comm.dc_stream(CALL, stream as CudaStreamT)?;
                        // SAFETY: NCCL's contract: `count` elements at each buffer on this
                        // device until the stream's work is done.
                        unsafe { dc.all_reduce_raw(send, recv, count, dtype, op, &s) }
                            .map_err(devcomm_err(CALL))
                    })
                }
                Route::Devcomm(_) => Ok(()),
                Route::Nccl(_) => to_nccl(CALL, comm, nccl),
            }
        },
    )
}

/// `ncclReduceScatter`: NCCL's in-place form (`recv` is this rank's shard of `send`) is
/// devcomm's (`input == output`).
#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    recvcount: usize,
    t: NcclDataType,
    op: NcclRedOp,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    const CALL: &str = "ncclReduceScatter";
    op_call(
        CALL,
        c,
        |lib, nc| {
            let f = lib.reduce_scatter?;
            // SAFETY: NCCL's prototype, the caller's arguments.
            Some(unsafe { f(send, recv, recvcount, t, op, nc, stream) })
        },
        |comm, nccl| {
            let size = checked_size(CALL, t)?;
            match route(Op::ReduceScatter, t, Some(op), comm.job) {
                Route::Devcomm(Plan::Reduce { dtype, op }) if recvcount > 0 => {
                    let shard = (send as u64).wrapping_add((comm.rank * recvcount * size) as u64);
                    let output = if recv as u64 == shard {
                        send as u64
                    } else {
                        recv as u64
                    };
                    let (send, stream) = (send as u64, stream as usize);
                    group::launch(comm, move |comm| {
                        let (dc, s) = comm.dc_stream(CALL, stream as CudaStreamT)?;
                        // SAFETY: as ncclAllReduce, for nranks x recvcount input elements.
                        unsafe { dc.reduce_scatter_raw(send, output, recvcount, dtype, op, &s) }
                            .map_err(devcomm_err(CALL))
                    })
                }
                Route::Devcomm(_) => Ok(()),
                Route::Nccl(_) => to_nccl(CALL, comm, nccl),
            }
        },
    )
}

/// `ncclAllGather`: NCCL's in-place form (`send` is this rank's shard of `recv`) is
/// devcomm's (`input == output`).
#[no_mangle]
pub extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    sendcount: usize,
    t: NcclDataType,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    const CALL: &str = "ncclAllGather";
    op_call(
        CALL,
        c,
        |lib, nc| {
            let f = lib.all_gather?;
            // SAFETY: NCCL's prototype, the caller's arguments.
            Some(unsafe { f(send, recv, sendcount, t, nc, stream) })
        },
        |comm, nccl| {
            let size = checked_size(CALL, t)?;
            match route(Op::AllGather, t, None, comm.job) {
                Route::Devcomm(Plan::Gather { dtype }) if sendcount > 0 => {
                    let shard = (recv as u64).wrapping_add((comm.rank * sendcount * size) as u64);
                    let input = if send as u64 == shard {
                        recv as u64
                    } else {
                        send as u64
                    };
                    let (recv, stream) = (recv as u64, stream as usize);
                    group::launch(comm, move |comm| {
                        let (dc, s) = comm.dc_stream(CALL, stream as CudaStreamT)?;
                        // SAFETY: as ncclAllReduce, for nranks x sendcount output elements.
                        unsafe { dc.all_gather_raw(input, recv, sendcount, dtype, &s) }
                            .map_err(devcomm_err(CALL))
                    })
                }
                Route::Devcomm(_) => Ok(()),
                Route::Nccl(_) => to_nccl(CALL, comm, nccl),
            }
        },
    )
}

/// `ncclAlltoAll`: `count` elements to and from every rank.
#[no_mangle]
pub extern "C" fn ncclAlltoAll(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    t: NcclDataType,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    const CALL: &str = "ncclAlltoAll";
    op_call(
        CALL,
        c,
        |lib, nc| {
            let f = lib.all_to_all?;
            // SAFETY: NCCL's prototype, the caller's arguments.
            Some(unsafe { f(send, recv, count, t, nc, stream) })
        },
        |comm, nccl| {
            checked_size(CALL, t)?;
            match route(Op::AllToAll, t, None, comm.job) {
                Route::Devcomm(Plan::Copy { elem_size }) if count > 0 => {
                    let hooks = devcomm::raw::copy_hooks(elem_size).map_err(devcomm_err(CALL))?;
                    let elems = (count * comm.nranks) as u64;
                    let (send, recv, stream) = (send as u64, recv as u64, stream as usize);
                    group::launch(comm, move |comm| {
                        let (dc, s) = comm.dc_stream(CALL, stream as CudaStreamT)?;
                        let b = |ptr: u64| RawBuffer {
                            ptr,
                            elems,
                            elem_size,
                        };
                        let bytes = elems * elem_size as u64;
                        let run = |input: u64| {
                            // SAFETY: NCCL's contract: nranks x count elements in each buffer.
                            unsafe {
                                dc.all_to_all_raw(
                                    &hooks,
                                    b(input),
                                    b(recv),
                                    HookArgs::default(),
                                    &s,
                                )
                            }
                            .map_err(devcomm_err(CALL))
                        };
                        // In place (NCCL allows it): from a copy of the input.
                        match overlap(send, bytes, recv, bytes) {
                            true => staged(CALL, &s, send, bytes as usize, run),
                            false => run(send),
                        }
                    })
                }
                Route::Devcomm(_) => Ok(()),
                Route::Nccl(_) => to_nccl(CALL, comm, nccl),
            }
        },
    )
}

/// A call devcomm never answers: the real NCCL's form on every communicator.
fn nccl_only(
    call: &str,
    c: NcclCommT,
    nccl: impl FnOnce(&'static Nccl, NcclCommT) -> Option<NcclResult>,
) -> NcclResult {
    op_call(call, c, nccl, |comm, nccl| to_nccl(call, comm, nccl))
}

/// The real NCCL's rooted calls of one prototype (broadcast, gather, scatter).
type Rooted = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    NcclDataType,
    c_int,
    NcclCommT,
    CudaStreamT,
) -> NcclResult;

/// A rooted call of `Rooted`'s prototype, always NCCL (`entry` picks it from the library).
#[allow(clippy::too_many_arguments)] // the prototype's arguments, the call and its entry point
fn rooted(
    call: &str,
    entry: fn(&Nccl) -> Option<Rooted>,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    t: NcclDataType,
    root: c_int,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    nccl_only(call, c, |lib, nc| {
        let f = entry(lib)?;
        // SAFETY: NCCL's prototype, the caller's arguments.
        Some(unsafe { f(send, recv, count, t, root, nc, stream) })
    })
}

/// `ncclBroadcast`: always NCCL (devcomm has no broadcast).
#[no_mangle]
pub extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    t: NcclDataType,
    root: c_int,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    let entry = |l: &Nccl| l.broadcast;
    rooted(
        "ncclBroadcast",
        entry,
        send,
        recv,
        count,
        t,
        root,
        c,
        stream,
    )
}

/// `ncclBcast`: in-place `ncclBroadcast`.
#[no_mangle]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    t: NcclDataType,
    root: c_int,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    ncclBroadcast(buff, buff, count, t, root, c, stream)
}

/// `ncclReduce`: always NCCL (devcomm has no rooted reduce).
#[no_mangle]
pub extern "C" fn ncclReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    t: NcclDataType,
    op: NcclRedOp,
    root: c_int,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    nccl_only("ncclReduce", c, |lib, nc| {
        let f = lib.reduce?;
        // SAFETY: NCCL's prototype, the caller's arguments.
        Some(unsafe { f(send, recv, count, t, op, root, nc, stream) })
    })
}

/// `ncclGather`: always NCCL.
#[no_mangle]
pub extern "C" fn ncclGather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    t: NcclDataType,
    root: c_int,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    let entry = |l: &Nccl| l.gather;
    rooted("ncclGather", entry, send, recv, count, t, root, c, stream)
}

/// `ncclScatter`: always NCCL.
#[no_mangle]
pub extern "C" fn ncclScatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    t: NcclDataType,
    root: c_int,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    let entry = |l: &Nccl| l.scatter;
    rooted("ncclScatter", entry, send, recv, count, t, root, c, stream)
}

#[allow(clippy::too_many_arguments)] // ncclSend's and ncclRecv's arguments, and the direction
fn p2p(
    call: &'static str,
    send: bool,
    ptr: u64,
    count: usize,
    t: NcclDataType,
    peer: c_int,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    guarded(call, || {
        let comm = match resolve(call, c)? {
            Handle::Shim(comm) => comm,
            Handle::Inner(nc) => {
                return nccl_call(call, nc, |lib, nc| {
                    // SAFETY: NCCL's prototypes, the caller's arguments.
                    Some(unsafe {
                        if send {
                            (lib.send?)(ptr as *const c_void, count, t, peer, nc, stream)
                        } else {
                            (lib.recv?)(ptr as *mut c_void, count, t, peer, nc, stream)
                        }
                    })
                });
            }
        };
        checked_size(call, t)?;
        if peer < 0 || peer as usize >= comm.nranks {
            return Err(Failure::invalid_argument(format!(
                "{call}: peer {peer} is not a rank of {} ranks (rank {})",
                comm.nranks, comm.rank
            )));
        }
        if count == 0 {
            return Ok(());
        }
        group::p2p(P2pCall {
            comm,
            send,
            ptr,
            count,
            dtype: t,
            peer: peer as usize,
            stream,
        })
    })
}

/// `ncclSend`.
#[no_mangle]
pub extern "C" fn ncclSend(
    send: *const c_void,
    count: usize,
    t: NcclDataType,
    peer: c_int,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    p2p("ncclSend", true, send as u64, count, t, peer, c, stream)
}

/// `ncclRecv`.
#[no_mangle]
pub extern "C" fn ncclRecv(
    recv: *mut c_void,
    count: usize,
    t: NcclDataType,
    peer: c_int,
    c: NcclCommT,
    stream: CudaStreamT,
) -> NcclResult {
    p2p("ncclRecv", false, recv as u64, count, t, peer, c, stream)
}
