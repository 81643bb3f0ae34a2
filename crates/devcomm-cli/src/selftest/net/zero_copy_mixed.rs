//! `sendrecv_registered` with one NVLink and one network peer (a mixed topology): a ring over
//! registered buffers whose every rank sends over one kind of link and receives over the other
//! ([`mixed_cycle`](super::mesh::mixed_cycle)), both directions, at sizes on every NVLink
//! zero-copy route; the mixed call against one-role calls of its peers; ranges past a
//! registration refused before anything is launched; replays of a captured graph of such
//! calls. Each range is checked byte for byte, the poison before it and the guard after it
//! untouched.

use std::time::{Duration, Instant};

use cudarc::driver::CudaSlice;
use devcomm::p2p::ZcRoute;
use devcomm::{Error, LinkKind};

use super::super::harness::{compare, poisoned, Checked, Ctx, Outcome, RegBuf, Skip, POISON};
use super::job;

/// Offset of every range in the registration (odd: no alignment is assumed).
const OFF: usize = 37;
/// Poison bytes checked after each range.
const GUARD: usize = 4096;
/// Replays of the captured graph.
const REPLAYS: usize = 10;

/// The ring's sizes: 1 B, a page and 3 B, one byte past the low-latency size, 1 MiB + 3 B,
/// and one on the copy-engine route (at most 64 MiB + 5 B).
fn sizes(cx: &Ctx) -> Vec<usize> {
    let ll = cx.comm.tuning().p2p_limits().ll_max_bytes;
    let ce = cx.comm.tuning().p2p_switches().zc_ce_min.clamp(ll + 2, 64 << 20) as usize;
    vec![1, 4099, ll as usize + 1, (1 << 20) + 3, ce + 5]
}

fn route(cx: &Ctx, bytes: usize) -> &'static str {
    match cx.comm.tuning().zero_copy_route(bytes as u64) {
        ZcRoute::Staged => "staged",
        ZcRoute::Blocks(_) => "SM blocks",
        ZcRoute::CopyEngine => "copy engine",
    }
}

fn upload(cx: &Ctx, who: usize, tag: u64, n: usize) -> Result<CudaSlice<u8>, String> {
    cx.stream
        .clone_htod(&cx.data_of(who, tag, n))
        .map_err(|e| e.to_string())
}

/// `reg` holds `expect` at [`OFF`], the poison before it and in the [`GUARD`] bytes after it.
fn check_range(cx: &Ctx, reg: &RegBuf<'_>, expect: &[u8], what: &str) -> Result<(), String> {
    let end = OFF + expect.len();
    let got = cx.read_ptr(reg.ptr, end + GUARD)?;
    compare(&got[OFF..end], expect, what)?;
    if let Some(i) = got[..OFF].iter().position(|&b| b != POISON) {
        return Err(format!("{what}: byte {i} before the range was written"));
    }
    match got[end..].iter().position(|&b| b != POISON) {
        Some(i) => Err(format!("{what}: guard byte {i} after the range was written")),
        None => Ok(()),
    }
}

pub(super) fn zero_copy_mixed(cx: &Ctx) -> Checked {
    let net = match job(cx, "net_zero_copy_mixed")? {
        Ok(j) => j,
        Err(skip) => return Ok(skip),
    };
    let Some(order) = net.mixed_cycle else {
        return Ok(Outcome::Skip(Skip::Links(
            "no ring in which every rank sends over one kind of link and receives over the \
             other (a mixed topology such as 0-2=net,0-3=net,1-2=net,1-3=net on 4 ranks has \
             one)"
                .into(),
        )));
    };
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let at = order
        .iter()
        .position(|&r| r == rank)
        .ok_or("rank not in the ring")?;
    let (next, prev) = (order[(at + 1) % world], order[(at + world - 1) % world]);
    let sizes = sizes(cx);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let reg = RegBuf::new(cx, OFF + largest + GUARD)?;
    cx.host_barrier()?;
    ring(cx, &reg, &sizes, next, prev).map_err(|e| format!("ring {order:?}: {e}"))?;
    against_one_role_calls(cx, &reg, &order).map_err(|e| format!("one-role peers: {e}"))?;
    refusals(cx, &reg, next, prev).map_err(|e| format!("refusals: {e}"))?;
    // No event tracking for the graph's buffers: captured work must record no events.
    // SAFETY: every use of the buffers made meanwhile is ordered on cx.stream and synchronised.
    unsafe { cx.comm.context().disable_event_tracking() };
    let replayed = graph(cx, &reg, next, prev);
    // SAFETY: restores the default for buffers made later.
    unsafe { cx.comm.context().enable_event_tracking() };
    replayed.map_err(|e| format!("graph: {e}"))?;
    cx.host_barrier()?;
    drop(reg);
    let kind = |p: usize| format!("{:?}", cx.comm.topology().kind(p));
    let routes: Vec<String> = sizes
        .iter()
        .map(|&n| format!("{n} ({})", route(cx, n)))
        .collect();
    Ok(Outcome::Pass(format!(
        "ring {order:?}, to {next} ({}) and from {prev} ({}) and the reverse: {} B, every byte, \
         the poison before and {GUARD} guard bytes after each range checked; the mixed call \
         both ways against one-role calls of its peers; ranges past a registration refused before \
         launch; {REPLAYS} replays of a captured graph of two mixed calls",
        kind(next),
        kind(prev),
        routes.join(", ")
    )))
}

/// Each size, forward (send to `next`, receive from `prev`) then backward, into [`OFF`] of
/// every rank's registration.
fn ring(cx: &Ctx, reg: &RegBuf<'_>, sizes: &[usize], next: usize, prev: usize) -> Result<(), String> {
    let rank = cx.comm.rank();
    for (i, &n) in sizes.iter().enumerate() {
        for (d, (to, from)) in [(next, prev), (prev, next)].into_iter().enumerate() {
            let what = format!("{n} B to {to}, from {from}");
            let tag = 7100 + 2 * i as u64 + d as u64;
            let src = upload(cx, rank, tag, n)?;
            reg.poison(&cx.stream)?;
            cx.sync()?;
            cx.host_barrier()?;
            cx.comm
                .sendrecv_registered(&src, to, reg.at(OFF, n), reg.at(OFF, n), from, &cx.stream)
                .and_then(|()| cx.comm.synchronize(&cx.stream))
                .map_err(|e| format!("{what}: {e}"))?;
            check_range(cx, reg, &cx.data_of(from, tag, n), &what)?;
            cx.host_barrier()?;
        }
    }
    Ok(())
}

/// The ring's first rank makes the mixed call, in both directions of the ring (so with its
/// send role on either kind of link); its send peer receives with a one-role call and its
/// receive peer sends with one: over a network link the plain `recv`/`send`, over NVLink
/// `recv_registered`/`send_registered`. Every other rank waits.
fn against_one_role_calls(cx: &Ctx, reg: &RegBuf<'_>, order: &[usize]) -> Result<(), String> {
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let (lead, after, before) = (order[0], order[1], order[world - 1]);
    // Whether this rank reaches `lead` over the network (as `lead` reaches it).
    let by_net = cx.comm.topology().kind(lead) == LinkKind::Net;
    let cases = [(after, before), (before, after)]
        .into_iter()
        .flat_map(|peers| [4099usize, (1 << 20) + 3].map(|n| (peers, n)));
    for (i, ((to, from), n)) in cases.enumerate() {
        let tag = 7200 + i as u64;
        let src = upload(cx, rank, tag, n)?;
        let mut plain = poisoned(cx, n)?;
        reg.poison(&cx.stream)?;
        cx.sync()?;
        cx.host_barrier()?;
        let what = format!("{n} B, rank {lead} to {to}, from {from}");
        let c = &cx.comm;
        let at = reg.at(OFF, n);
        let r = if rank == lead {
            c.sendrecv_registered(&src, to, at, at, from, &cx.stream)
        } else if rank == to && by_net {
            c.recv(&mut plain, lead, &cx.stream)
        } else if rank == to {
            c.recv_registered(at, lead, &cx.stream)
        } else if rank == from && by_net {
            c.send(&src, lead, &cx.stream)
        } else if rank == from {
            c.send_registered(&src, lead, at, &cx.stream)
        } else {
            Ok(())
        };
        r.and_then(|()| c.synchronize(&cx.stream))
            .map_err(|e| format!("{what}: {e}"))?;
        if rank == lead {
            check_range(cx, reg, &cx.data_of(from, tag, n), &what)?;
        } else if rank == to && by_net {
            let got = cx.stream.clone_dtoh(&plain).map_err(|e| e.to_string())?;
            compare(&got, &cx.data_of(lead, tag, n), &what)?;
        } else if rank == to {
            check_range(cx, reg, &cx.data_of(lead, tag, n), &what)?;
        }
        cx.host_barrier()?;
    }
    Ok(())
}

/// On every rank at once: a mixed call whose send range ends past the send peer's
/// registration, then one whose receive range ends past this rank's: refused at once with
/// `CapacityExceeded` naming the owner, nothing launched (the stream synchronises without
/// waiting for a partner, and the next ring call is verified).
fn refusals(cx: &Ctx, reg: &RegBuf<'_>, next: usize, prev: usize) -> Result<(), String> {
    let rank = cx.comm.rank();
    let src = upload(cx, rank, 7300, 64)?;
    let past = reg.at(reg.bytes - 32, 64);
    let fits = reg.at(OFF, 64);
    cx.sync()?;
    cx.host_barrier()?;
    for (what, send_at, recv_at, owner) in [
        ("the send range", past, fits, next),
        ("the receive range", fits, past, rank),
    ] {
        let t = Instant::now();
        match cx
            .comm
            .sendrecv_registered(&src, next, send_at, recv_at, prev, &cx.stream)
        {
            Err(Error::CapacityExceeded { peer, .. }) if peer == owner => {}
            other => {
                return Err(format!(
                    "{what} past rank {owner}'s registration ({} B): {other:?}",
                    reg.bytes
                ))
            }
        }
        if t.elapsed() > Duration::from_secs(1) {
            return Err(format!("the refusal of {what} took over 1 s"));
        }
    }
    cx.sync()
        .and_then(|()| cx.comm.check().map_err(|e| e.to_string()))
        .map_err(|e| format!("after the refusals: {e}"))?;
    cx.host_barrier()?;
    // The pairs' call counts are untouched: a ring call right after is verified.
    reg.poison(&cx.stream)?;
    cx.sync()?;
    cx.host_barrier()?;
    cx.comm
        .sendrecv_registered(&src, next, fits, fits, prev, &cx.stream)
        .and_then(|()| cx.comm.synchronize(&cx.stream))
        .map_err(|e| format!("the call after the refusals: {e}"))?;
    check_range(cx, reg, &cx.data_of(prev, 7300, 64), "the call after the refusals")?;
    cx.host_barrier()
}

/// A captured graph (the registration poisoned, then two mixed ring calls into their own
/// ranges) replayed [`REPLAYS`] times on fresh sources, every replay checked.
fn graph(cx: &Ctx, reg: &RegBuf<'_>, next: usize, prev: usize) -> Result<(), String> {
    let rank = cx.comm.rank();
    let (a, b) = (4099usize, (1usize << 20) + 3);
    let mut src = cx
        .stream
        .alloc_zeros::<u8>(a + b)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    let graph = cx.capture(|| -> Result<(), String> {
        reg.poison(&cx.stream)?;
        let e = |e: Error| e.to_string();
        let (first, second) = (reg.at(OFF, a), reg.at(OFF + a, b));
        let c = &cx.comm;
        c.sendrecv_registered(&src.slice(..a), next, first, first, prev, &cx.stream)
            .map_err(e)?;
        c.sendrecv_registered(&src.slice(a..), next, second, second, prev, &cx.stream)
            .map_err(e)
    })?;
    for r in 0..REPLAYS {
        let tag = 7400 + r as u64;
        cx.stream
            .memcpy_htod(&cx.data_of(rank, tag, a + b), &mut src)
            .map_err(|e| e.to_string())?;
        cx.sync()?;
        cx.host_barrier()?;
        graph.launch().map_err(|e| format!("replay {r}: {e}"))?;
        cx.sync()
            .and_then(|()| cx.comm.check().map_err(|e| e.to_string()))
            .map_err(|e| format!("replay {r}: {e}"))?;
        check_range(cx, reg, &cx.data_of(prev, tag, a + b), &format!("replay {r}"))?;
        cx.host_barrier()?;
    }
    Ok(())
}
