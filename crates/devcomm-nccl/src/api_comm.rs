//! The exported communicator, group, error and memory calls of NCCL's C ABI.
#![allow(non_snake_case)]
// NCCL's names
// C entry points: the pointers are the C caller's, under nccl.h's contract for each call.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_char, c_int, c_void};

use crate::comm::{self, lookup, resolve, Handle};
use crate::error::{self, Failure};
use crate::ffi::{
    self, NcclCommT, NcclConfig, NcclDataType, NcclRedOp, NcclResult, NcclUniqueId, NcclWindowT,
};

/// Runs an exported call: its failure is recorded for `ncclGetLastError`, and a panic becomes
/// `ncclInternalError` instead of unwinding into C.
pub(crate) fn guarded(call: &str, f: impl FnOnce() -> Result<(), Failure>) -> NcclResult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => error::result(r),
        Err(_) => error::record(&Failure::new(
            ffi::INTERNAL_ERROR,
            format!("{call}: devcomm-nccl panicked (a bug; see the log)"),
        )),
    }
}

/// `*out = v` for a non-null `out`.
pub(crate) fn write<T>(call: &str, out: *mut T, v: T) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid_argument(format!(
            "{call}: the output pointer is null"
        )));
    }
    // SAFETY: non-null, and NCCL's contract makes it writable.
    unsafe { out.write(v) };
    Ok(())
}

/// `ncclCommInitRank(Config)` on the calling thread's device: now, or inside a group at its
/// outermost end (as NCCL does; `*out` is written then), when the group's inits run on a
/// thread each: a thread that creates several ranks of one communicator (nccl-tests' `-g`)
/// cannot make them one after the other, since each waits for the others to join. The
/// configuration is copied now.
fn init_rank_or_defer(
    call: &'static str,
    out: *mut NcclCommT,
    nranks: c_int,
    id: NcclUniqueId,
    rank: c_int,
    config: *mut NcclConfig,
) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid_argument(format!(
            "{call}: the output pointer is null"
        )));
    }
    comm::check_init(nranks, &id, rank)?;
    if !crate::group::in_group() {
        let c = comm::init_rank(nranks, &id, rank, config, None)?;
        return write(call, out, c);
    }
    let device = comm::current_device()?;
    // SAFETY: NCCL's contract: a non-null config points to an initialised ncclConfig_t.
    let config = (!config.is_null()).then(|| KeptConfig(unsafe { *config }));
    let out = out as usize;
    crate::group::defer_init(Box::new(move || {
        let mut config = config;
        let cfg = config
            .as_mut()
            .map_or(std::ptr::null_mut(), |c| &mut c.0 as *mut NcclConfig);
        let c = comm::init_rank(nranks, &id, rank, cfg, Some(device))?;
        write(call, out as *mut NcclCommT, c)
    }));
    Ok(())
}

/// A copy of the caller's `ncclConfig_t` kept for the end of a group. Its string pointers
/// (`netName`, `commName`) are the caller's, whose strings NCCL's contract keeps alive until the
/// communicator is made, so the copy may move to the thread that makes it.
struct KeptConfig(NcclConfig);
// SAFETY: see the type's comment; nothing else in it is a pointer.
unsafe impl Send for KeptConfig {}

/// `ncclGetVersion`: the NCCL version this library is compatible with.
#[no_mangle]
pub extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    guarded("ncclGetVersion", || {
        write("ncclGetVersion", version, ffi::NCCL_VERSION_CODE)
    })
}

/// `ncclGetUniqueId`: the address of a store rank 0 will host and a fresh secret token.
#[no_mangle]
pub extern "C" fn ncclGetUniqueId(unique_id: *mut NcclUniqueId) -> NcclResult {
    guarded("ncclGetUniqueId", || {
        let bytes = crate::unique_id::fresh(&crate::unique_id::store_host())?;
        let id = NcclUniqueId {
            internal: bytes.map(|b| b as c_char),
        };
        write("ncclGetUniqueId", unique_id, id)
    })
}

/// `ncclCommInitRank`.
#[no_mangle]
pub extern "C" fn ncclCommInitRank(
    out: *mut NcclCommT,
    nranks: c_int,
    id: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    guarded("ncclCommInitRank", || {
        init_rank_or_defer(
            "ncclCommInitRank",
            out,
            nranks,
            id,
            rank,
            std::ptr::null_mut(),
        )
    })
}

/// `ncclCommInitRankConfig`: the configuration goes to the real NCCL's communicator; devcomm
/// takes its settings from its environment variables. A non-blocking communicator
/// (`blocking = 0`) is ready when the call returns.
#[no_mangle]
pub extern "C" fn ncclCommInitRankConfig(
    out: *mut NcclCommT,
    nranks: c_int,
    id: NcclUniqueId,
    rank: c_int,
    config: *mut NcclConfig,
) -> NcclResult {
    guarded("ncclCommInitRankConfig", || {
        init_rank_or_defer("ncclCommInitRankConfig", out, nranks, id, rank, config)
    })
}

/// `ncclCommInitRankScalable`: one id is `ncclCommInitRankConfig`; several are refused.
#[no_mangle]
pub extern "C" fn ncclCommInitRankScalable(
    out: *mut NcclCommT,
    nranks: c_int,
    rank: c_int,
    n_id: c_int,
    ids: *mut NcclUniqueId,
    config: *mut NcclConfig,
) -> NcclResult {
    guarded("ncclCommInitRankScalable", || {
        if n_id != 1 || ids.is_null() {
            return Err(Failure::invalid_usage(format!(
                "ncclCommInitRankScalable: libdevcomm_nccl takes one unique id, not {n_id}"
            )));
        }
        // SAFETY: one id, non-null.
        let id = unsafe { *ids };
        init_rank_or_defer("ncclCommInitRankScalable", out, nranks, id, rank, config)
    })
}

/// `ncclCommInitAll`: one communicator per device of `devlist` (or devices 0..ndev), made
/// from one thread each since creation is collective.
#[no_mangle]
pub extern "C" fn ncclCommInitAll(
    comms: *mut NcclCommT,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    guarded("ncclCommInitAll", || {
        if comms.is_null() || ndev < 1 {
            return Err(Failure::invalid_argument(format!(
                "ncclCommInitAll: {ndev} devices, output {comms:p}"
            )));
        }
        let n = ndev as usize;
        let devices: Vec<i32> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: NCCL's contract: `ndev` ints.
            unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
        };
        let bytes = crate::unique_id::fresh("127.0.0.1")?;
        let id = NcclUniqueId {
            internal: bytes.map(|b| b as c_char),
        };
        let made: Vec<_> = std::thread::scope(|s| {
            let threads: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(r, &d)| {
                    s.spawn(move || {
                        comm::init_rank(ndev, &id, r as c_int, std::ptr::null_mut(), Some(d))
                            .map(|h| h as usize)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| {
                    t.join().unwrap_or_else(|_| {
                        Err(Failure::new(
                            ffi::INTERNAL_ERROR,
                            "ncclCommInitAll: an init thread panicked",
                        ))
                    })
                })
                .collect()
        });
        let mut first_err = None;
        let mut handles = Vec::with_capacity(n);
        for r in made {
            match r {
                Ok(h) => handles.push(h as NcclCommT),
                Err(f) => first_err = first_err.or(Some(f)),
            }
        }
        if let Some(f) = first_err {
            for h in handles {
                if let Ok(c) = comm::unregister("ncclCommInitAll", h) {
                    comm::destroy(c, true);
                }
            }
            return Err(f);
        }
        // SAFETY: NCCL's contract: `ndev` handles writable.
        unsafe { std::ptr::copy_nonoverlapping(handles.as_ptr(), comms, n) };
        Ok(())
    })
}

/// `ncclCommSplit`: the real NCCL splits its communicator, and the ranks of each color meet
/// on a fresh devcomm store (found through the parent's store) and build a devcomm
/// communicator there. Without a devcomm parent, the new communicator is NCCL's only.
#[no_mangle]
pub extern "C" fn ncclCommSplit(
    parent: NcclCommT,
    color: c_int,
    key: c_int,
    out: *mut NcclCommT,
    config: *mut NcclConfig,
) -> NcclResult {
    guarded("ncclCommSplit", || {
        let p = lookup("ncclCommSplit", parent)?;
        let c = crate::split::split(&p, color, key, config)?;
        write("ncclCommSplit", out, c)
    })
}

/// `ncclCommShrink`: refused (devcomm cannot rebuild a communicator without ranks that
/// may be dead).
#[no_mangle]
pub extern "C" fn ncclCommShrink(
    _comm: NcclCommT,
    _exclude: *mut c_int,
    _count: c_int,
    _out: *mut NcclCommT,
    _config: *mut NcclConfig,
    _flags: c_int,
) -> NcclResult {
    guarded("ncclCommShrink", || {
        Err(Failure::invalid_usage(
            "ncclCommShrink: not supported by libdevcomm_nccl (make a new communicator)",
        ))
    })
}

/// `ncclCommFinalize`: devcomm has no pending state to flush; NCCL's is finalized.
#[no_mangle]
pub extern "C" fn ncclCommFinalize(c: NcclCommT) -> NcclResult {
    guarded("ncclCommFinalize", || {
        let c = lookup("ncclCommFinalize", c)?;
        if let Ok((lib, nc)) = c.nccl("ncclCommFinalize") {
            if let Some(f) = lib.comm_finalize {
                // SAFETY: a live NCCL communicator.
                let r = unsafe { f(nc) };
                if r != ffi::SUCCESS {
                    return Err(Failure::new(
                        r,
                        format!("ncclCommFinalize (NCCL): {}", comm::nccl_last(lib)),
                    ));
                }
            }
        }
        Ok(())
    })
}

/// `ncclCommDestroy`.
#[no_mangle]
pub extern "C" fn ncclCommDestroy(c: NcclCommT) -> NcclResult {
    guarded("ncclCommDestroy", || {
        let c = comm::unregister("ncclCommDestroy", c)?;
        match comm::destroy(c, false) {
            ffi::SUCCESS => Ok(()),
            r => Err(Failure::new(
                r,
                "ncclCommDestroy: the real NCCL's destroy failed",
            )),
        }
    })
}

/// `ncclCommAbort`: raises devcomm's abort flag (every device wait returns) and aborts NCCL's.
#[no_mangle]
pub extern "C" fn ncclCommAbort(c: NcclCommT) -> NcclResult {
    guarded("ncclCommAbort", || {
        let c = comm::unregister("ncclCommAbort", c)?;
        comm::destroy(c, true);
        Ok(())
    })
}

/// `ncclCommRevoke`: aborts devcomm's waits and revokes NCCL's communicator.
#[no_mangle]
pub extern "C" fn ncclCommRevoke(c: NcclCommT, flags: c_int) -> NcclResult {
    guarded("ncclCommRevoke", || {
        let c = lookup("ncclCommRevoke", c)?;
        if let Some(dc) = &c.dc {
            dc.abort();
        }
        c.set_async_error(ffi::REMOTE_ERROR);
        if let Ok((lib, nc)) = c.nccl("ncclCommRevoke") {
            if let Some(f) = lib.comm_revoke {
                // SAFETY: a live NCCL communicator.
                unsafe { f(nc, flags) };
            }
        }
        Ok(())
    })
}

/// `ncclCommGetAsyncError`.
#[no_mangle]
pub extern "C" fn ncclCommGetAsyncError(c: NcclCommT, out: *mut NcclResult) -> NcclResult {
    guarded("ncclCommGetAsyncError", || {
        match resolve("ncclCommGetAsyncError", c)? {
            Handle::Shim(c) => write("ncclCommGetAsyncError", out, c.async_error()),
            // The real NCCL asks before each of its operations (`ncclCommEnsureReady`).
            Handle::Inner(nc) => comm::nccl_call("ncclCommGetAsyncError", nc, |lib, nc| {
                // SAFETY: NCCL's prototype, the caller's arguments.
                lib.comm_get_async_error.map(|f| unsafe { f(nc, out) })
            }),
        }
    })
}

/// `ncclCommCount`.
#[no_mangle]
pub extern "C" fn ncclCommCount(c: NcclCommT, count: *mut c_int) -> NcclResult {
    guarded("ncclCommCount", || {
        let c = lookup("ncclCommCount", c)?;
        write("ncclCommCount", count, c.nranks as c_int)
    })
}

/// `ncclCommCuDevice`.
#[no_mangle]
pub extern "C" fn ncclCommCuDevice(c: NcclCommT, device: *mut c_int) -> NcclResult {
    guarded("ncclCommCuDevice", || {
        let c = lookup("ncclCommCuDevice", c)?;
        write("ncclCommCuDevice", device, c.device)
    })
}

/// `ncclCommUserRank`.
#[no_mangle]
pub extern "C" fn ncclCommUserRank(c: NcclCommT, rank: *mut c_int) -> NcclResult {
    guarded("ncclCommUserRank", || {
        let c = lookup("ncclCommUserRank", c)?;
        write("ncclCommUserRank", rank, c.rank as c_int)
    })
}

/// `ncclGetErrorString`.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(r: NcclResult) -> *const c_char {
    ffi::error_string(r).as_ptr()
}

/// `ncclGetLastError`: the last failure's message (of this library or of the real NCCL).
#[no_mangle]
pub extern "C" fn ncclGetLastError(_c: NcclCommT) -> *const c_char {
    error::last_error_ptr()
}

/// `ncclGroupStart`.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    crate::group::start()
}

/// `ncclGroupEnd`.
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    crate::group::end()
}

/// `ncclGroupSimulateEnd`: NCCL's simulation (no estimate without NCCL).
#[no_mangle]
pub extern "C" fn ncclGroupSimulateEnd(info: *mut c_void) -> NcclResult {
    guarded("ncclGroupSimulateEnd", || {
        let lib = crate::fallback::get().map_err(Failure::invalid_usage)?;
        let f = lib
            .group_simulate_end
            .ok_or_else(|| Failure::invalid_usage("ncclGroupSimulateEnd: not in the real NCCL"))?;
        // SAFETY: NCCL's contract for `info`.
        match unsafe { f(info) } {
            ffi::SUCCESS => Ok(()),
            r => Err(Failure::new(r, "ncclGroupSimulateEnd (NCCL) failed")),
        }
    })
}

/// Forwards a call on a communicator to the real NCCL (on the communicator beside this
/// library's, or on the real NCCL's own from a call inside it).
fn forward(
    call: &str,
    c: NcclCommT,
    f: impl FnOnce(&'static crate::fallback::Nccl, NcclCommT) -> Option<NcclResult>,
) -> Result<(), Failure> {
    let nc = match resolve(call, c)? {
        Handle::Inner(nc) => nc,
        Handle::Shim(c) => c.nccl(call)?.1,
    };
    comm::nccl_call(call, nc, f)
}

/// `ncclCommRegister`: NCCL's (local, not collective, unlike devcomm's registration, so it
/// cannot become one).
#[no_mangle]
pub extern "C" fn ncclCommRegister(
    c: NcclCommT,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> NcclResult {
    guarded("ncclCommRegister", || {
        forward("ncclCommRegister", c, |l, nc| {
            l.comm_register
                // SAFETY: NCCL\'s prototype, the caller\'s arguments unchanged.
                .map(|f| unsafe { f(nc, buff, size, handle) })
        })
    })
}

/// `ncclCommDeregister`.
#[no_mangle]
pub extern "C" fn ncclCommDeregister(c: NcclCommT, handle: *mut c_void) -> NcclResult {
    guarded("ncclCommDeregister", || {
        forward("ncclCommDeregister", c, |l, nc| {
            // SAFETY: NCCL\'s prototype, the caller\'s arguments unchanged.
            l.comm_deregister.map(|f| unsafe { f(nc, handle) })
        })
    })
}

/// `ncclCommWindowRegister`: NCCL's window, and the buffer adopted into devcomm's memory pool
/// so that devcomm's calls on it take the zero-copy paths (`window`).
#[no_mangle]
pub extern "C" fn ncclCommWindowRegister(
    c: NcclCommT,
    buff: *mut c_void,
    size: usize,
    win: *mut NcclWindowT,
    flags: c_int,
) -> NcclResult {
    const CALL: &str = "ncclCommWindowRegister";
    guarded(CALL, || match resolve(CALL, c)? {
        Handle::Inner(nc) => comm::nccl_call(CALL, nc, |l, nc| {
            l.comm_window_register
                // SAFETY: NCCL's prototype, the caller's arguments unchanged.
                .map(|f| unsafe { f(nc, buff, size, win, flags) })
        }),
        // SAFETY: NCCL's contract for the buffer and `win`.
        Handle::Shim(comm) => unsafe {
            crate::window::register(&comm, buff, size, win, flags, crate::group::in_group())
        },
    })
}

/// `ncclCommWindowDeregister`.
#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(c: NcclCommT, win: NcclWindowT) -> NcclResult {
    const CALL: &str = "ncclCommWindowDeregister";
    guarded(CALL, || match resolve(CALL, c)? {
        Handle::Inner(nc) => comm::nccl_call(CALL, nc, |l, nc| {
            // SAFETY: NCCL's prototype, the caller's arguments unchanged.
            l.comm_window_deregister.map(|f| unsafe { f(nc, win) })
        }),
        // SAFETY: NCCL's contract for `win`.
        Handle::Shim(comm) => unsafe { crate::window::deregister(&comm, win) },
    })
}

/// `ncclRedOpCreatePreMulSum`: NCCL's operator (calls using it go to NCCL).
#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut NcclRedOp,
    scalar: *mut c_void,
    t: NcclDataType,
    residence: c_int,
    c: NcclCommT,
) -> NcclResult {
    guarded("ncclRedOpCreatePreMulSum", || {
        forward("ncclRedOpCreatePreMulSum", c, |l, nc| {
            l.red_op_create_pre_mul_sum
                // SAFETY: NCCL\'s prototype, the caller\'s arguments unchanged.
                .map(|f| unsafe { f(op, scalar, t, residence, nc) })
        })
    })
}

/// `ncclRedOpDestroy`.
#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: NcclRedOp, c: NcclCommT) -> NcclResult {
    guarded("ncclRedOpDestroy", || {
        forward("ncclRedOpDestroy", c, |l, nc| {
            // SAFETY: NCCL\'s prototype, the caller\'s arguments unchanged.
            l.red_op_destroy.map(|f| unsafe { f(op, nc) })
        })
    })
}

/// `ncclMemAlloc`: NCCL's (it takes no communicator, and devcomm's pool is a communicator's
/// collective allocation).
#[no_mangle]
pub extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    guarded("ncclMemAlloc", || {
        let lib =
            crate::fallback::get().map_err(|e| Failure::system(format!("ncclMemAlloc: {e}")))?;
        let f = lib
            .mem_alloc
            .ok_or_else(|| Failure::invalid_usage("ncclMemAlloc: not in the real NCCL"))?;
        // SAFETY: NCCL's prototype.
        match unsafe { f(ptr, size) } {
            ffi::SUCCESS => Ok(()),
            r => Err(Failure::new(
                r,
                format!(
                    "ncclMemAlloc of {size} bytes (NCCL): {}",
                    comm::nccl_last(lib)
                ),
            )),
        }
    })
}

/// `ncclMemFree`.
#[no_mangle]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> NcclResult {
    guarded("ncclMemFree", || {
        let lib =
            crate::fallback::get().map_err(|e| Failure::system(format!("ncclMemFree: {e}")))?;
        let f = lib
            .mem_free
            .ok_or_else(|| Failure::invalid_usage("ncclMemFree: not in the real NCCL"))?;
        // SAFETY: NCCL's prototype.
        match unsafe { f(ptr) } {
            ffi::SUCCESS => Ok(()),
            r => Err(Failure::new(r, "ncclMemFree (NCCL) failed")),
        }
    })
}

/// `ncclResetDebugInit` (deprecated in NCCL): devcomm's logging reads its variables once.
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {}
