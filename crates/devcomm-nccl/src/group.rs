//! Group semantics (`ncclGroupStart`/`ncclGroupEnd`, per thread as in NCCL) and the send/recv
//! of a group.
//!
//! Outside a group a collective is issued when called. Inside one, the collectives devcomm
//! answers are kept ([`launch`]) and issued at the outermost `ncclGroupEnd`, as NCCL issues
//! its own (those that go to NCCL are inside the real NCCL's group, which this library opens
//! alongside). Sends and recvs are collected and issued at the outermost `ncclGroupEnd` too
//! (a lone `ncclSend`/`ncclRecv` is a group of one): those devcomm answers (every send/recv
//! of an NVLink-only job unless forced to NCCL, the same decision on both ends) as devcomm
//! `sendrecv` launches in the order [`crate::p2p_schedule`] gives, which each rank computes
//! alone; the rest through NCCL's group. devcomm's launches come first on every stream, so
//! no devcomm kernel waits behind an NCCL one.
//!
//! A group that spans several communicators (one thread driving several GPUs:
//! `ncclCommInitAll`, nccl-tests' `-g`) issues each communicator's launches on a thread of
//! its own and waits for them all ([`run_launches`]): devcomm's first launch of a kernel
//! waits on the host until every peer has loaded it, and those peers are this thread's other
//! communicators, whose launches come after it in the group.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::{mpsc, Arc};

use devcomm::p2p::Transfer;

use crate::comm::{overlap, staged, ShimComm};
use crate::error::Failure;
use crate::ffi::{self, CudaStreamT, NcclDataType, NcclResult};
use crate::p2p_schedule::{schedule, Call, Step};
use crate::route::{route, Op, Route};

/// One send or recv of a group.
#[derive(Debug, Clone)]
pub struct P2pCall {
    /// Its communicator.
    pub comm: Arc<ShimComm>,
    /// Send (true) or recv.
    pub send: bool,
    /// Buffer address.
    pub ptr: u64,
    /// Elements.
    pub count: usize,
    /// NCCL type.
    pub dtype: NcclDataType,
    /// The peer.
    pub peer: usize,
    /// The caller's stream.
    pub stream: CudaStreamT,
}

/// Work kept for the end of a group.
pub type Job = Box<dyn FnOnce() -> Result<(), Failure> + Send>;

/// A launch kept for the end of a group, given its communicator.
pub type CommJob = Box<dyn FnOnce(&Arc<ShimComm>) -> Result<(), Failure> + Send>;

/// A devcomm launch kept for the end of the group: what it runs on its communicator.
pub struct Launch {
    /// Its communicator.
    pub comm: Arc<ShimComm>,
    /// The launch (enqueues on the caller's stream).
    pub run: CommJob,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Launch(rank {})", self.comm.rank)
    }
}

#[derive(Default)]
struct State {
    depth: u32,
    pending: Vec<P2pCall>,
    /// devcomm's collectives of the group, in call order.
    launches: Vec<Launch>,
    /// Communicator inits of the group (`ncclCommInitRank` and its forms).
    inits: Vec<Job>,
    /// The first error of a call inside the group, returned by the outermost end.
    error: Option<Failure>,
}

thread_local! {
    static GROUP: RefCell<State> = RefCell::new(State::default());
}

/// Whether this thread is inside a group.
pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// `ncclGroupStart`.
pub fn start() -> NcclResult {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    if let Ok(lib) = crate::fallback::get() {
        if let Some(f) = lib.group_start {
            // SAFETY: no arguments.
            return unsafe { f() };
        }
    }
    ffi::SUCCESS
}

/// `ncclGroupEnd`: at the outermost end, issues the group's sends and recvs.
pub fn end() -> NcclResult {
    let outer = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Failure::invalid_usage(
                "ncclGroupEnd: no group started on this thread",
            ));
        }
        g.depth -= 1;
        Ok((g.depth == 0).then(|| {
            let kept = (
                std::mem::take(&mut g.inits),
                std::mem::take(&mut g.pending),
                std::mem::take(&mut g.launches),
            );
            (kept, g.error.take())
        }))
    });
    let outer = match outer {
        Ok(o) => o,
        Err(f) => return crate::error::record(&f),
    };
    let mut result = Ok(());
    if let Some(((inits, pending, launches), earlier)) = outer {
        result = match earlier {
            Some(f) => Err(f),
            None => run_parallel(inits.into_iter().map(|j| vec![j]).collect())
                .and_then(|()| issue(&pending, launches)),
        };
    }
    let end = crate::fallback::get()
        .ok()
        .and_then(|lib| lib.group_end)
        // SAFETY: no arguments; matches the `ncclGroupStart` made by `start`.
        .map_or(ffi::SUCCESS, |f| unsafe { f() });
    match result {
        Err(f) => crate::error::record(&f),
        Ok(()) => end,
    }
}

/// Keeps an error of a call inside a group for the outermost `ncclGroupEnd`.
pub fn defer_error(f: Failure) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.error.is_none() {
            g.error = Some(f);
        }
    });
}

/// A collective devcomm answers: kept for the outermost `ncclGroupEnd` inside a group, else
/// run now.
pub fn launch(
    comm: &Arc<ShimComm>,
    run: impl FnOnce(&Arc<ShimComm>) -> Result<(), Failure> + Send + 'static,
) -> Result<(), Failure> {
    if in_group() {
        let l = Launch {
            comm: Arc::clone(comm),
            run: Box::new(run),
        };
        GROUP.with(|g| g.borrow_mut().launches.push(l));
        return Ok(());
    }
    run(comm)
}

/// Keeps a communicator init for the outermost `ncclGroupEnd`.
pub fn defer_init(job: Job) {
    GROUP.with(|g| g.borrow_mut().inits.push(job));
}

/// Runs each lane's jobs in order: on this thread when there is at most one lane, else each
/// lane on a worker thread of this thread's own (kept between groups: starting threads at
/// every group end cost more than the calls), all at once. The first failure, in lane order
/// (every lane runs to its end or its first failure).
pub fn run_parallel(lanes: Vec<Vec<Job>>) -> Result<(), Failure> {
    let run_lane = |lane: Vec<Job>| lane.into_iter().try_for_each(|j| j());
    if lanes.len() <= 1 {
        return lanes.into_iter().try_for_each(run_lane);
    }
    let lost = || Failure::system("ncclGroupEnd: a group thread panicked");
    let pending: Vec<mpsc::Receiver<Result<(), Failure>>> = WORKERS.with(|w| {
        let mut w = w.borrow_mut();
        lanes
            .into_iter()
            .enumerate()
            .map(|(i, lane)| {
                let (done, result) = mpsc::channel();
                if w.len() <= i {
                    w.push(Worker::start());
                }
                // A worker whose thread is gone (it could not start) is replaced.
                if let Err(mpsc::SendError((lane, done))) = w[i].jobs.send((lane, done)) {
                    w[i] = Worker::start();
                    let _ = w[i].jobs.send((lane, done));
                }
                result
            })
            .collect()
    });
    let mut first = Ok(());
    for r in pending {
        let r = r.recv().unwrap_or_else(|_| Err(lost()));
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// A lane and where its result goes.
type LaneWork = (Vec<Job>, mpsc::Sender<Result<(), Failure>>);

/// A thread that runs the lanes sent to it, one after another.
struct Worker {
    jobs: mpsc::Sender<LaneWork>,
}

impl Worker {
    fn start() -> Worker {
        let (jobs, rx) = mpsc::channel::<LaneWork>();
        let spawned = std::thread::Builder::new()
            .name("devcomm-nccl-group".into())
            .spawn(move || {
                for (lane, done) in rx {
                    // A panicking job fails its lane; the worker stays for the next group.
                    let run =
                        std::panic::AssertUnwindSafe(|| lane.into_iter().try_for_each(|j| j()));
                    let r = std::panic::catch_unwind(run).unwrap_or_else(|_| {
                        Err(Failure::system("ncclGroupEnd: a group job panicked"))
                    });
                    let _ = done.send(r);
                }
            });
        // A thread that could not start drops `rx`: its lanes' results come back as failures.
        drop(spawned);
        Worker { jobs }
    }
}

thread_local! {
    /// This thread's group workers (they end when it does: their channels close).
    static WORKERS: RefCell<Vec<Worker>> = const { RefCell::new(Vec::new()) };
}

/// Runs `launches` (in order per communicator): on this thread when they all belong to one
/// communicator, else on a thread per communicator (see the module's comment), each with
/// its communicator's context current. The first failure, in communicator order.
pub fn run_launches(launches: Vec<Launch>) -> Result<(), Failure> {
    let mut per_comm: Vec<(Arc<ShimComm>, Vec<Launch>)> = Vec::new();
    for l in launches {
        match per_comm.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &l.comm)) {
            Some((_, v)) => v.push(l),
            None => per_comm.push((Arc::clone(&l.comm), vec![l])),
        }
    }
    let several = per_comm.len() > 1;
    let lanes = per_comm
        .into_iter()
        .map(|(comm, v)| {
            let mut lane: Vec<Job> = Vec::with_capacity(v.len() + 1);
            if several {
                lane.push(Box::new(move || bind(&comm)));
            }
            lane.extend(
                v.into_iter()
                    .map(|l| -> Job { Box::new(move || (l.run)(&l.comm)) }),
            );
            lane
        })
        .collect();
    run_parallel(lanes)
}

/// Makes `comm`'s device context current on this thread.
fn bind(comm: &ShimComm) -> Result<(), Failure> {
    match comm.dc.as_ref() {
        Some(dc) => dc.context().bind_to_thread().map_err(|e| {
            Failure::new(
                ffi::UNHANDLED_CUDA_ERROR,
                format!("ncclGroupEnd: making the device's context current: {e}"),
            )
        }),
        None => Ok(()),
    }
}

/// `ncclSend`/`ncclRecv`: collected inside a group, else issued as a group of one.
pub fn p2p(call: P2pCall) -> Result<(), Failure> {
    if in_group() {
        GROUP.with(|g| g.borrow_mut().pending.push(call));
        return Ok(());
    }
    let lib = crate::fallback::get().ok();
    // SAFETY: no arguments; the group makes an NCCL fallback of this call one NCCL group.
    lib.and_then(|l| l.group_start).map(|f| unsafe { f() });
    let r = issue(std::slice::from_ref(&call), Vec::new());
    // SAFETY: as above.
    let end = lib
        .and_then(|l| l.group_end)
        .map_or(ffi::SUCCESS, |f| unsafe { f() });
    r?;
    if end != ffi::SUCCESS {
        return Err(Failure::new(end, "ncclGroupEnd of the real NCCL failed"));
    }
    Ok(())
}

/// Issues a group's collectives kept for its end (`launches`), sends and recvs (see the
/// module's comment).
fn issue(calls: &[P2pCall], mut launches: Vec<Launch>) -> Result<(), Failure> {
    for c in calls {
        if c.peer >= c.comm.nranks {
            return Err(Failure::invalid_argument(format!(
                "ncclSend/ncclRecv: peer {} is not a rank of {} ranks (rank {})",
                c.peer, c.comm.nranks, c.comm.rank
            )));
        }
    }
    // The group's communicators, in order of first appearance.
    let mut comms: Vec<&Arc<ShimComm>> = Vec::new();
    for c in calls {
        if !comms.iter().any(|x| Arc::ptr_eq(x, &c.comm)) {
            comms.push(&c.comm);
        }
    }
    // devcomm first, on every communicator (its sendrecv launches after its collectives, in
    // the schedule's order); then the rest through NCCL's group.
    let mut rest: Vec<&P2pCall> = Vec::new();
    for comm in comms {
        let (mine, nccl): (Vec<&P2pCall>, Vec<&P2pCall>) = calls
            .iter()
            .filter(|c| Arc::ptr_eq(&c.comm, comm))
            .partition(|c| {
                comm.dc.is_some()
                    && matches!(
                        route(Op::SendRecv, c.dtype, None, c.comm.job),
                        Route::Devcomm(_)
                    )
            });
        rest.extend(nccl);
        if mine.is_empty() {
            continue;
        }
        let seen: Vec<Call> = mine
            .iter()
            .map(|c| Call {
                send: c.send,
                peer: c.peer,
            })
            .collect();
        let steps = schedule(comm.rank, comm.nranks, &seen)
            .map_err(|e| Failure::invalid_usage(format!("ncclGroupEnd: {e}")))?;
        let owned = Calls(mine.into_iter().cloned().collect());
        launches.push(Launch {
            comm: Arc::clone(comm),
            run: Box::new(move |comm| {
                let owned = owned; // the whole wrapper, not its field (Send)
                run_steps(comm, &owned.0, &steps)
            }),
        });
    }
    run_launches(launches)?;
    for c in rest {
        let (lib, nc) = c.comm.nccl("ncclSend/ncclRecv")?;
        let (count, t, peer) = (c.count, c.dtype, c.peer as i32);
        // SAFETY: NCCL's prototypes; buffers as the caller gave them.
        let r = unsafe {
            if c.send {
                lib.send
                    .map(|f| f(c.ptr as *const c_void, count, t, peer, nc, c.stream))
            } else {
                lib.recv
                    .map(|f| f(c.ptr as *mut c_void, count, t, peer, nc, c.stream))
            }
        }
        .unwrap_or(ffi::SYSTEM_ERROR);
        if r != ffi::SUCCESS {
            return Err(Failure::new(
                r,
                format!("ncclSend/ncclRecv (NCCL): {}", crate::comm::nccl_last(lib)),
            ));
        }
    }
    Ok(())
}

/// A communicator's calls of a group, moved to the thread that issues them.
struct Calls(Vec<P2pCall>);

// SAFETY: the only raw pointer is the CUDA stream, an opaque handle CUDA lets any thread use.
unsafe impl Send for Calls {}

/// Bytes of a send or recv.
fn bytes_of(c: &P2pCall) -> u64 {
    (c.count * ffi::type_size(c.dtype).unwrap_or(1)) as u64
}

/// Runs one communicator's scheduled sends and recvs of a group on the stream of its first
/// call; the group's other streams wait for everything before them first and for the
/// launches after (NCCL's rule: a group's work on several streams starts and ends together).
fn run_steps(comm: &ShimComm, calls: &[P2pCall], steps: &[Step]) -> Result<(), Failure> {
    const CALL: &str = "ncclSend/ncclRecv";
    let Some(first) = calls.first() else {
        return Ok(());
    };
    let (dc, stream) = comm.dc_stream(CALL, first.stream)?;
    let cuda = |e: cudarc::driver::DriverError| {
        Failure::new(
            ffi::UNHANDLED_CUDA_ERROR,
            format!("{CALL}: joining the group's streams: {e}"),
        )
    };
    let mut others: Vec<Arc<cudarc::driver::CudaStream>> = Vec::new();
    for c in calls {
        let raw = c.stream as cudarc::driver::sys::CUstream;
        if raw != stream.cu_stream() && !others.iter().any(|s| s.cu_stream() == raw) {
            // SAFETY: the caller's stream, of the communicator's device, alive during the call.
            let s = unsafe { dc.context().wrap_borrowed_stream(raw) };
            stream.join(&s).map_err(cuda)?;
            others.push(s);
        }
    }
    let transfer = |c: &P2pCall| Transfer {
        ptr: c.ptr,
        bytes: bytes_of(c),
        peer: c.peer,
        config: None,
    };
    for step in steps {
        match *step {
            Step::Local { send, recv } => {
                let (s, r) = (&calls[send], &calls[recv]);
                if bytes_of(s) != bytes_of(r) {
                    return Err(Failure::invalid_argument(format!(
                        "{CALL}: rank {} sends itself {} bytes into a recv of {}",
                        comm.rank,
                        bytes_of(s),
                        bytes_of(r)
                    )));
                }
                if s.ptr != r.ptr && bytes_of(s) > 0 {
                    // SAFETY: both buffers hold `bytes` on this device (NCCL's contract).
                    unsafe {
                        devcomm::testing::memcpy_dtod_async(
                            r.ptr,
                            s.ptr,
                            bytes_of(s) as usize,
                            &stream,
                        )
                    }
                    .map_err(|e| Failure::from_devcomm(CALL, &e))?;
                }
            }
            Step::Peer { send, recv } => sendrecv(
                dc,
                &stream,
                send.map(|i| transfer(&calls[i])),
                recv.map(|i| transfer(&calls[i])),
            )?,
        }
    }
    for s in &others {
        s.join(&stream).map_err(cuda)?;
    }
    Ok(())
}

/// One devcomm `sendrecv` of a group.
fn sendrecv(
    dc: &devcomm::Comm,
    stream: &Arc<cudarc::driver::CudaStream>,
    send: Option<Transfer>,
    recv: Option<Transfer>,
) -> Result<(), Failure> {
    const CALL: &str = "ncclSend/ncclRecv";
    let run = |send: Option<Transfer>| {
        // SAFETY: the caller's buffers of `count` elements live on this device until the work
        // on its stream is done (NCCL's contract for ncclSend/ncclRecv).
        unsafe { dc.sendrecv_raw(send, recv, stream) }.map_err(|e| Failure::from_devcomm(CALL, &e))
    };
    // A send whose buffer overlaps the recv's (NCCL allows it): from a copy.
    match (send, recv) {
        (Some(t), Some(r)) if overlap(t.ptr, t.bytes, r.ptr, r.bytes) => {
            staged(CALL, stream, t.ptr, t.bytes as usize, |ptr| {
                run(Some(Transfer { ptr, ..t }))
            })
        }
        _ => run(send),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Lane 0 waits for lane 1's message and lane 1 for lane 0's: only lanes that run at once
    /// get both (one after the other, the first would time out).
    #[test]
    fn lanes_run_at_once_and_the_first_failure_is_returned() {
        let (to1, from0) = mpsc::channel::<u8>();
        let (to0, from1) = mpsc::channel::<u8>();
        let wait = |rx: mpsc::Receiver<u8>| -> Job {
            Box::new(move || {
                rx.recv_timeout(Duration::from_secs(5))
                    .map(|_| ())
                    .map_err(|_| Failure::system("the other lane did not run at the same time"))
            })
        };
        let send = |tx: mpsc::Sender<u8>| -> Job {
            Box::new(move || tx.send(1).map_err(|_| Failure::system("send")))
        };
        let lanes = vec![vec![send(to1), wait(from1)], vec![wait(from0), send(to0)]];
        run_parallel(lanes).unwrap();
        // Failures: the first lane's, though the second lane's came too; jobs after a
        // failure in its lane do not run.
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r2 = Arc::clone(&ran);
        let lanes: Vec<Vec<Job>> = vec![
            vec![Box::new(|| Err(Failure::invalid_usage("lane 0")))],
            vec![
                Box::new(|| Err(Failure::invalid_argument("lane 1"))),
                Box::new(move || {
                    r2.store(true, std::sync::atomic::Ordering::SeqCst);
                    Ok(())
                }),
            ],
        ];
        let e = run_parallel(lanes).unwrap_err();
        assert_eq!(e.code, ffi::INVALID_USAGE);
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
        // One lane runs on this thread, in order.
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let job = |i: u8| -> Job {
            let o = Arc::clone(&order);
            Box::new(move || {
                o.lock().unwrap().push(i);
                Ok(())
            })
        };
        run_parallel(vec![vec![job(0), job(1), job(2)]]).unwrap();
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
    }

    /// A group's lanes run on this thread's workers, the same ones group after group, and a
    /// job that panics fails its lane without taking the worker with it.
    #[test]
    fn lanes_reuse_this_threads_workers() {
        let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = |lane: usize| -> Job {
            let ids = Arc::clone(&ids);
            Box::new(move || {
                ids.lock()
                    .unwrap()
                    .push((lane, std::thread::current().id()));
                Ok(())
            })
        };
        for _ in 0..3 {
            run_parallel(vec![vec![record(0)], vec![record(1)]]).unwrap();
        }
        let seen = ids.lock().unwrap().clone();
        let of = |lane: usize| -> Vec<_> {
            seen.iter()
                .filter(|(l, _)| *l == lane)
                .map(|(_, t)| *t)
                .collect()
        };
        let (zero, one) = (of(0), of(1));
        assert_eq!(zero.len(), 3);
        assert!(zero.iter().all(|t| *t == zero[0]), "lane 0 moved: {zero:?}");
        assert!(one.iter().all(|t| *t == one[0]), "lane 1 moved: {one:?}");
        assert_ne!(zero[0], one[0]);
        assert_ne!(zero[0], std::thread::current().id());
        // A panicking job: its lane fails; the next group runs on the same workers.
        let e = run_parallel(vec![
            vec![Box::new(|| panic!("a job panicked"))],
            vec![record(1)],
        ])
        .unwrap_err();
        assert_eq!(e.code, ffi::SYSTEM_ERROR);
        run_parallel(vec![vec![record(0)], vec![record(1)]]).unwrap();
        let seen = ids.lock().unwrap().clone();
        assert_eq!(seen.len(), 3 * 2 + 1 + 2);
        let last: Vec<_> = seen[seen.len() - 2..].to_vec();
        assert!(
            last.contains(&(0, zero[0])) && last.contains(&(1, one[0])),
            "{last:?}"
        );
    }
}
