//! The abort record as the network layer writes and reads it.
//!
//! The proxy (and the host stand-in for a device producer) report a failure exactly as a
//! device wait does (`cuda/devcomm/wait.cuh`, `record_wait_failure`): claim the record with a
//! CAS on `flag`, fill it in, fence, raise `abort`. So every wait of the communicator, on the
//! device or the host, gives up at once, and the host call that checks the record returns an
//! error naming the peer.

use std::sync::atomic::{fence, AtomicU32, Ordering};

use crate::error::net::NetError;
use crate::handles::{DeviceErrorState, ErrorRecord};

pub(crate) use crate::error::net::{from_record as to_error, op, STATUS_TIMED_OUT};

/// A writer and reader of one `DeviceErrorState` that lives elsewhere (host-mapped pinned
/// memory owned by the communicator's `ErrorState`, or host memory in tests).
#[derive(Debug, Clone, Copy)]
pub struct ErrorSink {
    state: *mut DeviceErrorState,
}

// SAFETY: the pointee is only accessed through atomics and volatile accesses (the device
// writes it concurrently anyway); the owner keeps it alive while any sink exists (see `new`).
unsafe impl Send for ErrorSink {}
// SAFETY: as above.
unsafe impl Sync for ErrorSink {}

impl ErrorSink {
    /// A sink for the state at `state`.
    ///
    /// # Safety
    /// `state` must be valid, 8-byte aligned and outlive every copy of the sink (and every
    /// proxy or producer given one).
    pub unsafe fn new(state: *mut DeviceErrorState) -> Self {
        Self { state }
    }

    fn abort_word(&self) -> &AtomicU32 {
        // SAFETY: `state` is valid and aligned (contract of `new`); `abort` is a u32 that the
        // host only touches atomically.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.state).abort)) }
    }

    /// True once anything raised the abort flag.
    pub(crate) fn aborted(&self) -> bool {
        self.abort_word().load(Ordering::Acquire) != 0
    }

    /// Records a failure (the first one of the process wins) and raises abort.
    pub(crate) fn record(&self, record: ErrorRecord) {
        // SAFETY: as in `abort_word`; `flag` is the record's first u32.
        let flag =
            unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.state).record.flag)) };
        if flag
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // `op` last, as the kernels write it: the readers take a record whose op is still
            // 0 as one being written (error_state::evaluate).
            let rec = ErrorRecord {
                flag: 1,
                op: 0,
                ..record
            };
            // SAFETY: this thread claimed the record; volatile because the device may read
            // it behind the compiler's back. `flag` is rewritten with the value it has.
            unsafe {
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.state).record), rec);
                fence(Ordering::SeqCst);
                AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.state).record.op))
                    .store(record.op, Ordering::Release);
            }
            fence(Ordering::SeqCst);
        }
        self.abort_word().store(1, Ordering::Release);
        fence(Ordering::SeqCst);
    }

    /// A snapshot of the state.
    pub(crate) fn read(&self) -> DeviceErrorState {
        let abort = self.abort_word().load(Ordering::Acquire);
        // `op` first, with acquire: writers store it last (error_state::evaluate).
        // SAFETY: valid and aligned (contract of `new`); `op` is a u32 read atomically here.
        let op = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.state).record.op)) }
            .load(Ordering::Acquire);
        // SAFETY: valid and aligned (contract of `new`); any bit pattern is a valid record.
        let mut record =
            unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*self.state).record)) };
        record.op = op;
        // SAFETY: as above; written by the host before any kernel ran.
        let mirror = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*self.state).mirror)) };
        DeviceErrorState {
            abort,
            reserved: 0,
            record,
            mirror,
        }
    }

    /// `Ok(())` while nothing failed; else the recorded failure as an error.
    pub(crate) fn check(&self, rank: usize) -> Result<(), NetError> {
        let state = self.read();
        if state.abort == 0 {
            return Ok(());
        }
        // A writer raises abort after the record; give one that is between the two a moment.
        for _ in 0..1000 {
            let record = self.read().record;
            if record.flag != 0 && record.op != 0 {
                return Err(to_error(&record));
            }
            std::thread::yield_now();
        }
        Err(NetError::Aborted {
            rank: i32::try_from(rank).unwrap_or(i32::MAX),
            reason: "the abort flag was raised without a record".to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_record_wins_and_converts() {
        let mut state = Box::new(DeviceErrorState::default());
        // SAFETY: the box outlives the sink (both die at the end of the test).
        let sink = unsafe { ErrorSink::new(&mut *state) };
        assert!(sink.check(0).is_ok());
        let rec = |peer| ErrorRecord {
            op: op::PEER_FAILED,
            rank: 1,
            peer,
            slot: 2,
            expected: 9,
            seen: (-25i64) as u64,
            ..ErrorRecord::default()
        };
        sink.record(rec(3));
        sink.record(rec(4));
        assert!(sink.aborted());
        let msg = sink.check(1).unwrap_err().to_string();
        assert!(
            msg.contains("network peer 3") && msg.contains("connection reset"),
            "{msg}"
        );
        assert!(
            msg.contains("channel 2") && msg.contains("descriptor 9"),
            "{msg}"
        );
    }

    #[test]
    fn queue_full_and_foreign_codes() {
        let full = ErrorRecord {
            flag: 1,
            op: op::QUEUE_FULL,
            rank: 0,
            peer: 1,
            slot: 0,
            expected: 4,
            seen: 7,
            elapsed_ns: 2_000_000,
        };
        let msg = to_error(&full).to_string();
        assert!(
            msg.contains("peer 1") && msg.contains("4 descriptors"),
            "{msg}"
        );
        let wait = ErrorRecord { op: 1, ..full };
        assert!(matches!(
            to_error(&wait),
            NetError::Device(crate::Error::PeerTimeout { peer: 1, .. })
        ));
    }
}
