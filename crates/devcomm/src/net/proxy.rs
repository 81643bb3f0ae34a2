//! The progress thread: drains every descriptor queue in order and performs the operations
//! through UCX.
//!
//! Ordering (docs/NETWORK.md explains why it suffices): a put is started with `ucp_put_nbx`;
//! a signal (alone or after a put) is started only after a `ucp_ep_flush_nbx` on the peer's
//! endpoint has *completed*, which UCX defines as every earlier put on the endpoint being
//! complete at the target, the data in place. The signal itself is an aligned 8-byte put of
//! the word's new value (for an add: this rank's running sum, the word having one writer).
//!
//! Failures (an error status, an endpoint error reported by UCX, an operation older than the
//! operation timeout, a descriptor outside its registration) become the abort record
//! (`record::op`), after which the proxy issues nothing more.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::queue::{backoff, QueueRef};
use super::record::{op, STATUS_TIMED_OUT};
use super::ucx::Request;
use super::{Inner, Shared};
use crate::abi::net::{NetDescriptor, NetOp, SignalOp};
use crate::handles::ErrorRecord;

/// Descriptors one queue may start per pass, so that no queue starves the others.
const BURST: usize = 32;

enum Then {
    /// Start the descriptor's signal.
    Signal(NetDescriptor),
    /// Publish `done = seq` for a flush descriptor.
    Done(u64),
}

enum Stage {
    Ready,
    /// A flush is in flight; `then` runs once it completed.
    AwaitFlush {
        req: Request,
        then: Then,
        seq: u64,
        since: Instant,
    },
}

struct QueueState {
    q: QueueRef,
    stage: Stage,
    /// Puts and signals started and not yet complete: (request, seq, started).
    inflight: Vec<(Request, u64, Instant)>,
}

/// A failure to record: (peer, channel, seq, op code, UCX status or op word).
struct Failure {
    peer: usize,
    channel: usize,
    seq: u64,
    code: u32,
    seen: u64,
}

/// Runs until `shared.stop` is set. `queues` are the queues of network peers.
pub(crate) fn run(shared: Arc<Shared>, queues: Vec<QueueRef>) {
    let mut states: Vec<QueueState> = queues
        .into_iter()
        .map(|q| QueueState {
            q,
            stage: Stage::Ready,
            inflight: Vec::new(),
        })
        .collect();
    let mut sums = Sums::new();
    let mut spins = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let busy = {
            let inner = shared.lock();
            let mut busy = inner.worker.progress() > 0;
            if !shared.sink.aborted() && !shared.paused.load(Ordering::Acquire) {
                match pass(&shared, &inner, &mut sums, &mut states) {
                    Ok(b) => busy |= b,
                    Err(f) => record(&shared, &f),
                }
            }
            busy
        };
        if busy {
            spins = 0;
        } else {
            backoff(&mut spins);
        }
    }
    // Let what is in flight finish (or fail) before the owner closes the endpoints.
    let deadline = Instant::now() + Duration::from_millis(500);
    let inner = shared.lock();
    for s in &mut states {
        if let Stage::AwaitFlush { req, .. } = &mut s.stage {
            while inner.worker.poll(req).is_none() && Instant::now() < deadline {
                inner.worker.progress();
            }
        }
        for (req, _, _) in &mut s.inflight {
            while inner.worker.poll(req).is_none() && Instant::now() < deadline {
                inner.worker.progress();
            }
        }
    }
    // Requests that never finished keep their operand words alive until the worker goes.
    for s in states {
        if let Stage::AwaitFlush { req, .. } = s.stage {
            std::mem::forget(req);
        }
        for (req, _, _) in s.inflight {
            if !req.finished() {
                std::mem::forget(req);
            }
        }
    }
}

fn record(shared: &Shared, f: &Failure) {
    shared.sink.record(ErrorRecord {
        op: f.code,
        rank: shared.rank as i32,
        peer: f.peer as i32,
        slot: f.channel as u64,
        expected: f.seq,
        seen: f.seen,
        ..ErrorRecord::default()
    });
}

/// One pass over every queue; `Ok(true)` when anything moved.
fn pass(
    shared: &Shared,
    inner: &Inner,
    sums: &mut Sums,
    states: &mut [QueueState],
) -> Result<bool, Failure> {
    let mut busy = false;
    for s in states.iter_mut() {
        let peer = s.q.peer;
        let status = shared.failed[peer].load(Ordering::Acquire);
        if status != 0 {
            return Err(peer_failure(s, s.q.tail(), status as i8));
        }
        busy |= reap(shared, inner, s)?;
        busy |= advance(shared, inner, sums, s)?;
    }
    Ok(busy)
}

fn peer_failure(s: &QueueState, seq: u64, status: i8) -> Failure {
    Failure {
        peer: s.q.peer,
        channel: s.q.channel,
        seq,
        code: op::PEER_FAILED,
        seen: i64::from(status) as u64,
    }
}

fn ucx_failure(s: &QueueState, seq: u64, e: &super::NetError) -> Failure {
    peer_failure(s, seq, status_of(e))
}

/// Polls the puts and signals in flight.
fn reap(shared: &Shared, inner: &Inner, s: &mut QueueState) -> Result<bool, Failure> {
    let before = s.inflight.len();
    let mut failure: Option<(u64, i8)> = None;
    s.inflight
        .retain_mut(|(req, seq, since)| match inner.worker.poll(req) {
            None => {
                if since.elapsed() > shared.op_timeout {
                    failure.get_or_insert((*seq, STATUS_TIMED_OUT));
                }
                true
            }
            Some(Ok(())) => false,
            Some(Err(e)) => {
                failure.get_or_insert((*seq, status_of(&e)));
                false
            }
        });
    if let Some((seq, status)) = failure {
        // The endpoint's own error (from UCX's callback) says more than the request's.
        let ep_status = shared.failed[s.q.peer].load(Ordering::Acquire);
        let status = if ep_status != 0 {
            ep_status as i8
        } else {
            status
        };
        return Err(peer_failure(s, seq, status));
    }
    Ok(s.inflight.len() != before)
}

fn status_of(e: &super::NetError) -> i8 {
    match e {
        super::NetError::Ucx { status, .. } => *status,
        _ => -1,
    }
}

/// Moves the queue's head operation forward: finishes a flush, starts descriptors.
fn advance(
    shared: &Shared,
    inner: &Inner,
    sums: &mut Sums,
    s: &mut QueueState,
) -> Result<bool, Failure> {
    let mut busy = false;
    for _ in 0..BURST {
        match &mut s.stage {
            Stage::AwaitFlush {
                req,
                then,
                seq,
                since,
            } => {
                let seq = *seq;
                match inner.worker.poll(req) {
                    None if since.elapsed() > shared.op_timeout => {
                        return Err(peer_failure(s, seq, STATUS_TIMED_OUT));
                    }
                    None => return Ok(busy),
                    Some(Err(e)) => return Err(ucx_failure(s, seq, &e)),
                    Some(Ok(())) => {}
                }
                match std::mem::replace(then, Then::Done(0)) {
                    Then::Signal(d) => {
                        let req = start_signal(inner, sums, s, &d)?;
                        s.inflight.push((req, d.seq, Instant::now()));
                    }
                    Then::Done(seq) => s.q.complete_flush(seq),
                }
                s.stage = Stage::Ready;
                busy = true;
            }
            Stage::Ready => {
                let Some(d) = s.q.peek() else {
                    return Ok(busy);
                };
                start(inner, s, d)?;
                s.q.consume();
                busy = true;
            }
        }
    }
    Ok(busy)
}

fn bad(s: &QueueState, d: &NetDescriptor) -> Failure {
    Failure {
        peer: s.q.peer,
        channel: s.q.channel,
        seq: d.seq,
        code: op::BAD_DESCRIPTOR,
        seen: u64::from(d.op) | u64::from(d.signal_op) << 32,
    }
}

/// Starts descriptor `d` (checked against the registrations first).
fn start(inner: &Inner, s: &mut QueueState, d: NetDescriptor) -> Result<(), Failure> {
    let peer = s.q.peer;
    let Some(ep) = inner.eps[peer].as_ref() else {
        return Err(bad(s, &d));
    };
    let op = NetOp::from_code(d.op).ok_or_else(|| bad(s, &d))?;
    if matches!(op, NetOp::Put | NetOp::PutSignal) && d.bytes > 0 {
        let reg = inner.regs.get(&d.key).ok_or_else(|| bad(s, &d))?;
        let (rbase, rlen, rkey) = reg.remote[peer].as_ref().ok_or_else(|| bad(s, &d))?;
        if !fits(d.src_offset, d.bytes, reg.local.len) || !fits(d.dst_offset, d.bytes, *rlen) {
            return Err(bad(s, &d));
        }
        let req = inner
            .worker
            .put(
                ep,
                reg.local.base + d.src_offset,
                d.bytes,
                rbase + d.dst_offset,
                rkey,
            )
            .map_err(|e| ucx_failure(s, d.seq, &e))?;
        s.inflight.push((req, d.seq, Instant::now()));
    }
    let then = match op {
        NetOp::Put => return Ok(()),
        NetOp::PutSignal | NetOp::Signal => {
            check_signal(inner, s, &d)?;
            Then::Signal(d)
        }
        NetOp::Flush => Then::Done(d.seq),
    };
    let req = inner
        .worker
        .flush(ep)
        .map_err(|e| ucx_failure(s, d.seq, &e))?;
    s.stage = Stage::AwaitFlush {
        req,
        then,
        seq: d.seq,
        since: Instant::now(),
    };
    Ok(())
}

fn check_signal(inner: &Inner, s: &QueueState, d: &NetDescriptor) -> Result<(), Failure> {
    let ok = matches!(
        SignalOp::from_code(d.signal_op),
        Some(SignalOp::Set | SignalOp::Add)
    ) && d.signal_offset % 8 == 0
        && inner
            .regs
            .get(&d.signal_key)
            .and_then(|r| r.remote[s.q.peer].as_ref())
            .is_some_and(|(_, len, _)| fits(d.signal_offset, 8, *len));
    if ok {
        Ok(())
    } else {
        Err(bad(s, d))
    }
}

/// Starts the write of a (checked) signal descriptor: an 8-byte put of the word's new value.
/// For `Add` the new value is this rank's running sum for the word (`sums`): a network signal
/// word has exactly one writer, the rank whose slot it is, so the sum is the word's value.
fn start_signal(
    inner: &Inner,
    sums: &mut Sums,
    s: &QueueState,
    d: &NetDescriptor,
) -> Result<Request, Failure> {
    let peer = s.q.peer;
    let ep = inner.eps[peer].as_ref().ok_or_else(|| bad(s, d))?;
    let reg = inner.regs.get(&d.signal_key).ok_or_else(|| bad(s, d))?;
    let (rbase, _, rkey) = reg.remote[peer].as_ref().ok_or_else(|| bad(s, d))?;
    let op = SignalOp::from_code(d.signal_op).ok_or_else(|| bad(s, d))?;
    let value = signal_value(
        sums,
        (peer, d.signal_key, d.signal_offset),
        op,
        d.signal_value,
    );
    inner
        .worker
        .put_word(ep, value, rbase + d.signal_offset, rkey)
        .map_err(|e| ucx_failure(s, d.seq, &e))
}

/// This rank's last value of each remote signal word: (peer, registration, offset).
pub(crate) type Sums = BTreeMap<(usize, u32, u64), u64>;

/// The value a signal writes into its word, and the word's new running value (pure).
pub(crate) fn signal_value(
    sums: &mut Sums,
    word: (usize, u32, u64),
    op: SignalOp,
    operand: u64,
) -> u64 {
    let last = sums.entry(word).or_insert(0);
    *last = match op {
        SignalOp::Add => last.wrapping_add(operand),
        SignalOp::Set | SignalOp::None => operand,
    };
    *last
}

/// `[offset, offset + bytes)` inside `len` bytes, without overflow (pure).
pub(crate) fn fits(offset: u64, bytes: u64, len: u64) -> bool {
    offset <= len && bytes <= len - offset
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_become_the_running_value_of_the_word() {
        let mut sums = Sums::new();
        let w = (1, 2, 8);
        assert_eq!(signal_value(&mut sums, w, SignalOp::Add, 1), 1);
        assert_eq!(signal_value(&mut sums, w, SignalOp::Add, 2), 3);
        assert_eq!(signal_value(&mut sums, (2, 2, 8), SignalOp::Add, 5), 5);
        assert_eq!(signal_value(&mut sums, w, SignalOp::Set, 10), 10);
        assert_eq!(signal_value(&mut sums, w, SignalOp::Add, 1), 11);
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(fits(0, 8, 8) && fits(8, 0, 8) && fits(4, 4, 8));
        assert!(!fits(4, 5, 8) && !fits(9, 0, 8) && !fits(1, u64::MAX, 8));
    }
}
