//! Group semantics (`ncclGroupStart`/`ncclGroupEnd`, per thread as in NCCL) and the send/recv
//! of a group.
//!
//! Outside a group a collective is issued when called. Inside one, the collectives devcomm
//! answers are kept ([`launch`]) and issued at the outermost `ncclGroupEnd`, as NCCL issues
//! its own (those that go to NCCL are inside the real NCCL's group, which this library opens
//! alongside). Sends and recvs are collected and issued at the outermost `ncclGroupEnd` too
//! (a lone `ncclSend`/`ncclRecv` is a group of one): a communicator whose group holds at most
//! one send and one recv is *eligible* for one devcomm `sendrecv`. A transfer goes to devcomm
//! only when both of its ends are eligible, which each end learns through the store (one key
//! per rank and pair round), so both ends route it alike; every other transfer goes to NCCL's
//! group. devcomm's launches come first on every stream, so no devcomm kernel waits behind an
//! NCCL one.
//!
//! A group that spans several communicators (one thread driving several GPUs:
//! `ncclCommInitAll`, nccl-tests' `-g`) issues each communicator's launches on a thread of
//! its own and waits for them all ([`run_launches`]): devcomm's first launch of a kernel
//! waits on the host until every peer has loaded it, and those peers are this thread's other
//! communicators, whose launches come after it in the group.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

use devcomm::p2p::Transfer;

use crate::comm::{overlap, setup_timeout, staged, ShimComm};
use crate::error::Failure;
use crate::ffi::{self, CudaStreamT, NcclDataType, NcclResult};
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

/// Runs each lane's jobs in order: on this thread when there is at most one lane, else on a
/// thread per lane, all at once. The first failure, in lane order (every lane runs to its
/// end or its first failure).
pub fn run_parallel(lanes: Vec<Vec<Job>>) -> Result<(), Failure> {
    let run_lane = |lane: Vec<Job>| lane.into_iter().try_for_each(|j| j());
    if lanes.len() <= 1 {
        return lanes.into_iter().try_for_each(run_lane);
    }
    std::thread::scope(|scope| {
        let threads: Vec<_> = lanes
            .into_iter()
            .map(|lane| scope.spawn(move || run_lane(lane)))
            .collect();
        let mut first = Ok(());
        for t in threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(Failure::system("ncclGroupEnd: a group thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
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

/// Whether a communicator's sends and recvs of one group fit one devcomm `sendrecv`.
pub fn eligible(calls: &[&P2pCall]) -> bool {
    let sends = calls.iter().filter(|c| c.send).count();
    let recvs = calls.len() - sends;
    let Some(first) = calls.first() else {
        return false;
    };
    sends <= 1
        && recvs <= 1
        && calls.iter().all(|c| c.stream == first.stream)
        && calls.iter().all(|c| {
            matches!(
                route(Op::SendRecv, c.dtype, None, c.comm.job),
                Route::Devcomm(_)
            )
        })
}

/// The store key of `rank`'s eligibility in round `round` with `peer`.
fn round_key(rank: usize, peer: usize, round: u64) -> String {
    format!(
        "devcomm-nccl/p2p/{}-{}/{round}/{rank}",
        rank.min(peer),
        rank.max(peer)
    )
}

/// Issues a group's collectives kept for its end (`launches`), sends and recvs (see the
/// module's comment).
fn issue(calls: &[P2pCall], mut launches: Vec<Launch>) -> Result<(), Failure> {
    // The group's communicators, in order of first appearance.
    let mut comms: Vec<&Arc<ShimComm>> = Vec::new();
    for c in calls {
        if !comms.iter().any(|x| Arc::ptr_eq(x, &c.comm)) {
            comms.push(&c.comm);
        }
    }
    let of = |comm: &Arc<ShimComm>| -> Vec<&P2pCall> {
        calls
            .iter()
            .filter(|c| Arc::ptr_eq(&c.comm, comm))
            .collect()
    };
    for c in calls {
        if c.peer >= c.comm.nranks {
            return Err(Failure::invalid_argument(format!(
                "ncclSend/ncclRecv: peer {} is not a rank of {} ranks (rank {})",
                c.peer, c.comm.nranks, c.comm.rank
            )));
        }
    }
    // Publish every communicator's eligibility for each of its peers' rounds first (a thread
    // driving several communicators reads its own keys next), then read the peers'.
    type Plans<'a> = Vec<(&'a Arc<ShimComm>, Vec<(&'a P2pCall, bool)>)>;
    let mut plans: Plans<'_> = Vec::new();
    let mut reads = Vec::new();
    for comm in &comms {
        let mine = of(comm);
        let ok = eligible(&mine);
        let Some(dc) = comm.dc.as_ref() else {
            plans.push((comm, mine.into_iter().map(|c| (c, false)).collect()));
            continue;
        };
        let mut rounds = comm
            .p2p_rounds
            .lock()
            .map_err(|_| Failure::system("ncclGroupEnd: a thread panicked in devcomm-nccl"))?;
        let mut with_peer = Vec::new();
        for c in &mine {
            let round = rounds.entry(c.peer).or_insert(0);
            if !with_peer.contains(&c.peer) {
                *round += 1;
                with_peer.push(c.peer);
                dc.store()
                    .set(&round_key(comm.rank, c.peer, *round), &[ok as u8])
                    .map_err(|e| Failure::from_devcomm("ncclGroupEnd", &e.into()))?;
            }
            reads.push((Arc::clone(comm), c.peer, *round));
        }
        plans.push((comm, mine.into_iter().map(|c| (c, ok)).collect()));
    }
    let mut peer_ok = std::collections::HashMap::new();
    for (comm, peer, round) in reads {
        if let Some(dc) = comm.dc.as_ref() {
            let v = dc
                .store()
                .get(&round_key(peer, comm.rank, round), setup_timeout())
                .map_err(|e| Failure::from_devcomm("ncclGroupEnd", &e.into()))?;
            peer_ok.insert((Arc::as_ptr(&comm) as usize, peer), v.first() == Some(&1));
        }
    }
    // devcomm first, on every communicator; then the rest through NCCL's group.
    let mut rest = Vec::new();
    for (comm, mine) in &plans {
        let (mut send, mut recv) = (None, None);
        for &(c, ok) in mine {
            let both = ok && peer_ok.get(&(Arc::as_ptr(comm) as usize, c.peer)) == Some(&true);
            if !both {
                rest.push(c);
                continue;
            }
            let t = Transfer {
                ptr: c.ptr,
                bytes: (c.count * ffi::type_size(c.dtype).unwrap_or(1)) as u64,
                peer: c.peer,
                config: None,
            };
            if c.send {
                send = Some(t);
            } else {
                recv = Some(t);
            }
        }
        if let Some(c) = mine
            .iter()
            .find(|(c, _)| !rest.iter().any(|r| std::ptr::eq(*r, *c)))
        {
            let stream = c.0.stream as usize;
            launches.push(Launch {
                comm: Arc::clone(comm),
                run: Box::new(move |comm| sendrecv(comm, stream as CudaStreamT, send, recv)),
            });
        }
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

/// One devcomm `sendrecv` of a group on `comm`'s devcomm communicator.
fn sendrecv(
    comm: &ShimComm,
    stream: CudaStreamT,
    send: Option<Transfer>,
    recv: Option<Transfer>,
) -> Result<(), Failure> {
    const CALL: &str = "ncclSend/ncclRecv";
    let (dc, stream) = comm.dc_stream(CALL, stream)?;
    let run = |send: Option<Transfer>| {
        // SAFETY: the caller's buffers of `count` elements live on this device until the work
        // on its stream is done (NCCL's contract for ncclSend/ncclRecv).
        unsafe { dc.sendrecv_raw(send, recv, &stream) }.map_err(|e| Failure::from_devcomm(CALL, &e))
    };
    // A send whose buffer overlaps the recv's (NCCL allows it): from a copy.
    match (send, recv) {
        (Some(t), Some(r)) if overlap(t.ptr, t.bytes, r.ptr, r.bytes) => {
            staged(CALL, &stream, t.ptr, t.bytes as usize, |ptr| {
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
}
