//! NCCL's windows on devcomm's memory pool: `ncclCommWindowRegister` registers the buffer with
//! the real NCCL (for the calls that go there) and adopts it into devcomm's pool
//! ([`devcomm::Comm::pool_adopt`]), so that devcomm's collectives on it take their zero-copy
//! paths; `ncclCommWindowDeregister` undoes both.
//!
//! Both registrations are collective, made in the same order on every rank (NCCL's first).
//! devcomm's adoption fails alike on every rank (its own agreements), and then the window is
//! NCCL's alone: calls on it still work, on devcomm's staged paths. Inside a group, and on a
//! communicator without devcomm, only NCCL registers (one thread registering for several
//! communicators would wait on the first one's peers).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::comm::{nccl_call, ShimComm};
use crate::error::Failure;
use crate::ffi::NcclWindowT;

/// Windows of one communicator: the handle given to the caller and what stands behind it.
#[derive(Debug, Default)]
pub struct Windows {
    map: Mutex<HashMap<usize, Window>>,
}

/// What a window handle stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    /// The real NCCL's window is the handle itself (`false`: a handle of this library's,
    /// made when there is no real NCCL).
    nccl: bool,
    /// devcomm's pool segment of the buffer, when adopted.
    segment: Option<usize>,
}

/// Handles of windows that only devcomm holds (no real NCCL): never dereferenced, unlike any
/// address NCCL hands out (the top of the address space).
const OWN_HANDLE_BASE: usize = 0xdc00_0000_0000_0000;
static OWN_HANDLES: AtomicUsize = AtomicUsize::new(0);

impl Windows {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<usize, Window>>, Failure> {
        self.map
            .lock()
            .map_err(|_| Failure::system("window registry: a thread panicked in devcomm-nccl"))
    }
}

/// `ncclCommWindowRegister` on one of this library's communicators.
///
/// # Safety
///
/// NCCL's contract: `buff` is `size` bytes of device memory of the communicator's device,
/// allocated until the window is deregistered, and `win` is writable.
pub unsafe fn register(
    comm: &ShimComm,
    buff: *mut c_void,
    size: usize,
    win: *mut NcclWindowT,
    flags: c_int,
    in_group: bool,
) -> Result<(), Failure> {
    const CALL: &str = "ncclCommWindowRegister";
    if win.is_null() {
        return Err(Failure::invalid_argument(format!(
            "{CALL}: the window pointer is null"
        )));
    }
    let has_nccl = !comm.nccl_raw().is_null();
    if has_nccl {
        nccl_call(CALL, comm.nccl_raw(), |l, nc| {
            l.comm_window_register
                // SAFETY: NCCL's prototype, the caller's arguments unchanged.
                .map(|f| unsafe { f(nc, buff, size, win, flags) })
        })?;
    }
    let segment = match (&comm.dc, in_group) {
        (Some(dc), false) => {
            // SAFETY: the caller keeps the buffer until ncclCommWindowDeregister, which
            // releases it collectively before NCCL's deregister returns.
            match unsafe { dc.pool_adopt(buff as u64, size) } {
                Ok(s) => Some(s),
                Err(e) => {
                    log::warn!(
                        "devcomm-nccl: rank {}: {CALL}: {size} bytes at {buff:p} stay NCCL's \
                         window only (devcomm's calls on it take the staged paths): {e}",
                        comm.rank
                    );
                    None
                }
            }
        }
        _ => None,
    };
    if !has_nccl {
        let Some(s) = segment else {
            return Err(Failure::invalid_usage(format!(
                "{CALL}: devcomm could not adopt the buffer and there is no NCCL to register it"
            )));
        };
        let own = OWN_HANDLE_BASE + 16 * OWN_HANDLES.fetch_add(1, Ordering::Relaxed);
        // SAFETY: checked non-null above; NCCL's contract makes it writable.
        unsafe { win.write(own as NcclWindowT) };
        log::debug!("rank {}: window {own:#x} is pool segment {s}", comm.rank);
    }
    // SAFETY: written by NCCL or above.
    let handle = unsafe { win.read() } as usize;
    comm.windows.lock()?.insert(
        handle,
        Window {
            nccl: has_nccl,
            segment,
        },
    );
    Ok(())
}

/// `ncclCommWindowDeregister` on one of this library's communicators: devcomm's adoption is
/// released first (collectively), then NCCL's window.
///
/// # Safety
///
/// NCCL's contract: `win` is a window of this communicator (the real NCCL receives it).
pub unsafe fn deregister(comm: &ShimComm, win: NcclWindowT) -> Result<(), Failure> {
    const CALL: &str = "ncclCommWindowDeregister";
    let known = comm.windows.lock()?.remove(&(win as usize));
    let w = known.unwrap_or(Window {
        nccl: true,
        segment: None,
    });
    if let (Some(dc), Some(s)) = (&comm.dc, w.segment) {
        dc.pool_release(s)
            .map_err(|e| Failure::from_devcomm(CALL, &e))?;
    }
    if !w.nccl {
        return Ok(());
    }
    nccl_call(CALL, comm.nccl_raw(), |l, nc| {
        // SAFETY: NCCL's prototype, the caller's arguments unchanged.
        l.comm_window_deregister.map(|f| unsafe { f(nc, win) })
    })
}
