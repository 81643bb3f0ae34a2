//! Host stand-ins for the device side's waits, used where a host thread plays the device (the
//! CPU tests) and by host code that waits on a network peer's signal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::queue::backoff;
use super::record::ErrorSink;
use crate::error::net::Result;
use crate::handles::ErrorRecord;

/// `DeviceOp::WaitSignal`'s code (`handles.rs`, `DeviceOp::from_code`).
const WAIT_SIGNAL: u32 = 1;

/// Waits until `*word >= expected` (acquire), at most `timeout`, like `wait_until` in
/// `cuda/devcomm/wait.cuh`: gives up at once when abort is raised (returning the recorded
/// failure), and on timeout records a `wait_signal` failure naming `peer` and `slot`.
pub fn wait_signal(
    word: &AtomicU64,
    expected: u64,
    site: (usize, i32, u64),
    sink: &ErrorSink,
    timeout: Duration,
) -> Result<()> {
    let (rank, peer, slot) = site;
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let seen = word.load(Ordering::Acquire);
        if seen >= expected {
            return Ok(());
        }
        if sink.aborted() {
            return sink.check(rank);
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            sink.record(ErrorRecord {
                op: WAIT_SIGNAL,
                rank: rank as i32,
                peer,
                slot,
                expected,
                seen,
                elapsed_ns: elapsed.as_nanos() as u64,
                ..ErrorRecord::default()
            });
            return sink.check(rank);
        }
        backoff(&mut spins);
    }
}
