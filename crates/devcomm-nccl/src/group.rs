//! Group semantics (`ncclGroupStart`/`ncclGroupEnd`, per thread as in NCCL) and the send/recv
//! of a group.
//!
//! Collectives are issued when called (devcomm's calls only enqueue; those that go to NCCL
//! are inside the real NCCL's group, which this library opens alongside). Sends and recvs are
//! collected and issued at the outermost `ncclGroupEnd` (a lone `ncclSend`/`ncclRecv` is a
//! group of one): a communicator whose group holds at most one send and one recv is
//! *eligible* for one devcomm `sendrecv`. A transfer goes to devcomm only when both of its
//! ends are eligible, which each end learns through the store (one key per rank and pair
//! round), so both ends route it alike; every other transfer goes to NCCL's group. devcomm's
//! launches come first on every stream, so no devcomm kernel waits behind an NCCL one.

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

#[derive(Default)]
struct State {
    depth: u32,
    pending: Vec<P2pCall>,
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
        Ok((g.depth == 0).then(|| (std::mem::take(&mut g.pending), g.error.take())))
    });
    let outer = match outer {
        Ok(o) => o,
        Err(f) => return crate::error::record(&f),
    };
    let mut result = Ok(());
    if let Some((pending, earlier)) = outer {
        result = match earlier {
            Some(f) => Err(f),
            None => issue(&pending),
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

/// `ncclSend`/`ncclRecv`: collected inside a group, else issued as a group of one.
pub fn p2p(call: P2pCall) -> Result<(), Failure> {
    if in_group() {
        GROUP.with(|g| g.borrow_mut().pending.push(call));
        return Ok(());
    }
    let lib = crate::fallback::get().ok();
    // SAFETY: no arguments; the group makes an NCCL fallback of this call one NCCL group.
    lib.and_then(|l| l.group_start).map(|f| unsafe { f() });
    let r = issue(std::slice::from_ref(&call));
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

/// Issues a group's sends and recvs (see the module's comment).
fn issue(calls: &[P2pCall]) -> Result<(), Failure> {
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
            const CALL: &str = "ncclSend/ncclRecv";
            let (dc, stream) = comm.dc_stream(CALL, c.0.stream)?;
            let run = |send: Option<Transfer>| {
                // SAFETY: the caller's buffers of `count` elements live on this device until
                // the work on its stream is done (NCCL's contract for ncclSend/ncclRecv).
                unsafe { dc.sendrecv_raw(send, recv, &stream) }
                    .map_err(|e| Failure::from_devcomm(CALL, &e))
            };
            // A send whose buffer overlaps the recv's (NCCL allows it): from a copy.
            match (send, recv) {
                (Some(t), Some(r)) if overlap(t.ptr, t.bytes, r.ptr, r.bytes) => {
                    staged(CALL, &stream, t.ptr, t.bytes as usize, |ptr| {
                        run(Some(Transfer { ptr, ..t }))
                    })?
                }
                _ => run(send)?,
            }
        }
    }
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
