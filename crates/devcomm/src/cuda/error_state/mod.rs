//! The host-mapped error record and abort flag shared by a communicator's kernels.

use std::ffi::c_void;
use std::mem::size_of;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext};

#[allow(unused_imports)] // the tests below use them too
pub(crate) use super::error_record::{call_mismatch_field, record_to_error};
use super::{bind, check, log_drop_error, with_rank, DeviceBuffer};
use crate::error::{Error, Result};
use crate::handles::{DeviceErrorState, DeviceOp, ErrorRecord};

/// Owns one [`DeviceErrorState`] in pinned host memory that kernels of this process can reach
/// (`cuMemHostAlloc` with `DEVICEMAP | PORTABLE`).
///
/// Kernels write the first failed wait into the record and raise `abort`; the host reads it
/// with [`check`](Self::check) without synchronising any stream. A communicator whose state has
/// fired stays unusable: there is deliberately no reset, it must be rebuilt.
pub(crate) struct ErrorState {
    ctx: Arc<CudaContext>,
    rank: usize,
    /// Host address of the pinned `DeviceErrorState`; valid until drop.
    host: *mut DeviceErrorState,
    /// The same memory as kernels address it.
    device: u64,
    /// Message of the first error `check` reported; once set, `check` returns `Aborted`.
    fired: Mutex<Option<String>>,
    /// Whether the host raised `abort` itself (so no device record is coming).
    host_raised: AtomicBool,
    /// The abort mirror in device memory (`DeviceErrorState::mirror`).
    mirror: Option<DeviceBuffer>,
}

/// How long `check` waits for a record that a kernel is in the middle of writing.
const SETTLE_TIME: Duration = Duration::from_millis(5);

// SAFETY: `host` points to pinned memory owned by this value for its whole life; the host side
// only touches it through atomic loads/stores and volatile reads, which are fine from any
// thread (the device writes it concurrently anyway). `fired` is behind a mutex.
unsafe impl Send for ErrorState {}
// SAFETY: as above; no method hands out references into the pinned memory.
unsafe impl Sync for ErrorState {}

impl std::fmt::Debug for ErrorState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorState")
            .field("rank", &self.rank)
            .field("device_ptr", &format_args!("{:#x}", self.device))
            .field("state", &self.read())
            .finish()
    }
}

impl ErrorState {
    /// Allocates a zeroed state in host-mapped pinned memory for the kernels of `ctx`.
    pub(crate) fn new(ctx: &Arc<CudaContext>, rank: usize) -> Result<Self> {
        Self::alloc(ctx, rank).map_err(|e| with_rank(e, rank))
    }

    fn alloc(ctx: &Arc<CudaContext>, rank: usize) -> Result<Self> {
        bind(ctx)?;
        let bytes = size_of::<DeviceErrorState>();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` is a valid out-pointer; the context is current.
        let status = unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) };
        check(status, "cuMemHostAlloc")?;
        let host = host.cast::<DeviceErrorState>();
        // SAFETY: `host` is a fresh allocation of `bytes` bytes, page-aligned; all-zero bits
        // are a valid `DeviceErrorState` (plain integers).
        unsafe { std::ptr::write_bytes(host, 0, 1) };
        let mut state = Self {
            ctx: ctx.clone(),
            rank,
            host,
            device: 0,
            fired: Mutex::new(None),
            host_raised: AtomicBool::new(false),
            mirror: None,
        };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated by cuMemHostAlloc with DEVICEMAP; flags must be 0.
        // On failure `state` is dropped and frees the allocation.
        let status = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) };
        check(status, "cuMemHostGetDevicePointer")?;
        state.device = device;
        let mirror = DeviceBuffer::zeroed(ctx, size_of::<u64>())?;
        // SAFETY: `host` is valid and no kernel can use the state before it is returned.
        unsafe { std::ptr::addr_of_mut!((*host).mirror).write_volatile(mirror.ptr()) };
        state.mirror = Some(mirror);
        Ok(state)
    }

    /// Device address of the `DeviceErrorState` (for `DeviceWindow::error_state`).
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device
    }

    /// Device address of the abort mirror (`DeviceErrorState::mirror`; 0 if none).
    pub(crate) fn mirror_ptr(&self) -> u64 {
        self.mirror.as_ref().map_or(0, DeviceBuffer::ptr)
    }

    /// Host address of the `DeviceErrorState`, for a host writer of the record (the network
    /// proxy's `ErrorSink`); valid as long as `self`.
    pub(crate) fn host_ptr(&self) -> *mut DeviceErrorState {
        self.host
    }

    /// A snapshot of the state as it is now.
    pub(crate) fn read(&self) -> DeviceErrorState {
        // SAFETY: `host` is valid, aligned and lives as long as `self`; `abort` is a u32 at
        // offset 0 that nothing accesses non-atomically on the host.
        let abort = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.host).abort)) };
        let abort = abort.load(Ordering::Acquire);
        // `op` before the other fields, with acquire: writers store it last, so a non-zero op
        // read here means the fields read after it are the writer's (evaluate).
        // SAFETY: as above; `op` is a u32 that the host writes only atomically (the network
        // proxy's `ErrorSink::record`, `clear_record`).
        let op = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.host).record.op)) }
            .load(Ordering::Acquire);
        fence(Ordering::Acquire);
        // SAFETY: as above; a volatile read because the device writes the memory behind the
        // compiler's back. Any bit pattern is a valid `ErrorRecord`.
        let mut record =
            unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*self.host).record)) };
        record.op = op;
        DeviceErrorState {
            abort,
            reserved: 0,
            record,
            mirror: self.mirror_ptr(),
        }
    }

    /// `Ok(())` while no kernel has failed. The first time it sees a completed record it
    /// returns that failure as [`Error::PeerTimeout`]; from then on (and after
    /// [`raise_abort`](Self::raise_abort)) it returns [`Error::Aborted`].
    pub(crate) fn check(&self) -> Result<()> {
        let mut fired = self.fired.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(reason) = fired.as_ref() {
            return Err(Error::Aborted {
                rank: rank_i32(self.rank),
                reason: reason.clone(),
            });
        }
        let deadline = Instant::now() + SETTLE_TIME;
        let result = loop {
            let state = self.read();
            match evaluate(&state, self.rank, self.host_raised.load(Ordering::Acquire)) {
                Verdict::Clear => break Ok(()),
                Verdict::Failed(e) => break Err(*e),
                // A kernel is between claiming the record and raising abort (or the other
                // way round): give it a moment, then report what is there.
                Verdict::Pending if Instant::now() < deadline => std::thread::yield_now(),
                Verdict::Pending => break settle(&state, self.rank),
            }
        };
        if let Err(Error::CountOverflow { .. } | Error::ZeroCopyMismatch { .. }) = &result {
            // The kernel drained every peer's data and left the protocol's counters
            // consistent: the communicator stays usable. Report this once, then clear it.
            self.clear_record();
            return result;
        }
        if let Err(e) = &result {
            *fired = Some(match e {
                Error::Aborted { reason, .. } => reason.clone(),
                other => other.to_string(),
            });
        }
        result
    }

    /// The check at the start of a call, before it launches: like [`check`](Self::check), but a
    /// soft error of an earlier call (all-to-all-v counts, a refused zero-copy call), which
    /// left the communicator consistent, is left for that call's `synchronize` or `check`:
    /// this call launches as its peers do, instead of returning the other call's error and
    /// leaving them to time out.
    pub(crate) fn check_before_launch(&self) -> Result<()> {
        let unreported = self
            .fired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none();
        if unreported && soft_pending(&self.read()) {
            return Ok(());
        }
        self.check()
    }

    /// Empties the record (after a count error, which leaves nothing aborted).
    fn clear_record(&self) {
        // SAFETY: as in `read`; no kernel writes the record while `flag` is 1 and `abort` 0
        // except the one that claimed it, which wrote `op` last (already seen). `op` goes
        // first, atomically, so that no reader takes the other fields as a record's.
        unsafe {
            AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.host).record.op))
                .store(0, Ordering::Release);
            fence(Ordering::SeqCst);
            std::ptr::write_volatile(
                std::ptr::addr_of_mut!((*self.host).record),
                ErrorRecord::default(),
            )
        };
        fence(Ordering::SeqCst);
    }

    /// Whether this communicator has failed: a device error was reported or recorded, or the
    /// host raised abort. Tear-down then skips the barriers with its peers (one may be dead).
    pub(crate) fn is_aborted(&self) -> bool {
        let reported = self
            .fired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        reported || self.host_raised.load(Ordering::Acquire) || self.read().abort != 0
    }

    /// Raises the abort flag: every device wait of this communicator returns at once, and
    /// later [`check`](Self::check)s fail with [`Error::Aborted`].
    pub(crate) fn raise_abort(&self) {
        self.host_raised.store(true, Ordering::Release);
        // SAFETY: as in `read`.
        let abort = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.host).abort)) };
        abort.store(1, Ordering::Release);
        fence(Ordering::SeqCst);
    }
}

impl Drop for ErrorState {
    fn drop(&mut self) {
        let freed = bind(&self.ctx).and_then(|()| {
            // SAFETY: `host` came from cuMemHostAlloc and is freed once, here. Kernels using
            // it belong to this communicator, which is being dropped.
            let status = unsafe { sys::cuMemFreeHost(self.host.cast()) };
            check(status, "cuMemFreeHost")
        });
        log_drop_error("freeing the error state", freed);
    }
}

fn rank_i32(rank: usize) -> i32 {
    i32::try_from(rank).unwrap_or(i32::MAX)
}

/// What a snapshot of the state means for the host.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// No failure.
    Clear,
    /// A kernel is writing the record right now; read again shortly.
    Pending,
    /// A failure to report.
    Failed(Box<Error>),
}

/// Classifies a snapshot (pure; the heart of [`ErrorState::check`]). Writers claim the record
/// with a CAS on `flag`, fill it in with `op` last, then raise `abort`; a writer that lost the
/// claim raises `abort` at once, while the winner may still be writing. So a record is complete
/// once `flag` and `op` are set. `abort` without a record is final only when the host raised
/// it.
pub(crate) fn evaluate(state: &DeviceErrorState, rank: usize, host_raised: bool) -> Verdict {
    let written = state.record.op != 0;
    match (state.abort != 0, state.record.flag != 0) {
        (false, false) => Verdict::Clear,
        (true, true) if written => Verdict::Failed(Box::new(record_to_error(&state.record))),
        (true, false) if host_raised => Verdict::Failed(Box::new(host_abort(rank))),
        // A count error raises no abort; its writer stores `op` last, so the op marks it whole.
        (false, true)
            if matches!(
                DeviceOp::from_code(state.record.op),
                DeviceOp::CountOverflow | DeviceOp::ZeroCopyMismatch
            ) =>
        {
            Verdict::Failed(Box::new(record_to_error(&state.record)))
        }
        (_, true) | (true, false) => Verdict::Pending,
    }
}

/// Whether the record holds a complete soft error (no abort raised) and nothing else.
pub(crate) fn soft_pending(state: &DeviceErrorState) -> bool {
    state.abort == 0
        && state.record.flag != 0
        && matches!(
            DeviceOp::from_code(state.record.op),
            DeviceOp::CountOverflow | DeviceOp::ZeroCopyMismatch
        )
}

/// Resolves a snapshot that stayed [`Verdict::Pending`]: a claimed record is reported as it
/// is; an abort without a record is reported as such.
fn settle(state: &DeviceErrorState, rank: usize) -> Result<()> {
    if state.record.flag != 0 && state.record.op == 0 {
        Err(Error::Aborted {
            rank: rank_i32(rank),
            reason: "a failure was being recorded and its record stayed incomplete".to_owned(),
        })
    } else if state.record.flag != 0 {
        Err(record_to_error(&state.record))
    } else if state.abort != 0 {
        Err(Error::Aborted {
            rank: rank_i32(rank),
            reason: "a kernel raised the abort flag without recording an error".to_owned(),
        })
    } else {
        Ok(())
    }
}

fn host_abort(rank: usize) -> Error {
    Error::Aborted {
        rank: rank_i32(rank),
        reason: "the host raised the abort flag".to_owned(),
    }
}

#[cfg(test)]
mod tests;
