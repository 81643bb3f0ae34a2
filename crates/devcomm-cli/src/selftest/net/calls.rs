//! Send/recv with a network peer: sizes one way and both ways, back-to-back calls, graph
//! replays. Data are fresh per run (the agreed seed), destinations poisoned with guards, every
//! byte checked.


use super::super::harness::{compare, poisoned, Checked, Ctx, Outcome, POISON};
use super::super::p2p::replay_graph_with;
use super::{job, no_partner};

/// Poison bytes before and after each destination.
const GUARD: usize = 4096;

/// Sizes of the size check: empty, one word, a page and one past, a default slot (1 MiB) and
/// past it, many slots, and past 64 MiB.
const SIZES: &[usize] = &[
    0,
    8,
    4096,
    4099,
    1 << 20,
    (1 << 20) + 5,
    16 << 20,
    (64 << 20) + 3,
];

/// One way (the lower rank of each pair sends) and both ways, over [`SIZES`].
pub(super) fn sizes(cx: &Ctx) -> Checked {
    let net = match job(cx, "net_sendrecv")? {
        Ok(j) => j,
        Err(skip) => return Ok(skip),
    };
    let mut checked = 0usize;
    for both in [false, true] {
        for (i, &n) in SIZES.iter().enumerate() {
            cx.host_barrier()?;
            if let Some(peer) = net.partner {
                let tag = 100 + 2 * i as u64 + u64::from(both);
                one_call(cx, peer, n, both, tag)
                    .map_err(|e| format!("{n} B {}: {e}", way(both)))?;
                checked += 1;
            }
            cx.host_barrier()?;
        }
    }
    match net.partner {
        Some(peer) => Ok(Outcome::Pass(format!(
            "{checked} calls with network peer {peer} (0 B to {} B, one way and both ways), \
             every byte and {GUARD} guard bytes each side checked",
            SIZES[SIZES.len() - 1]
        ))),
        None => Ok(no_partner(cx)),
    }
}

fn way(both: bool) -> &'static str {
    if both {
        "both ways"
    } else {
        "one way"
    }
}

/// One call of `n` bytes with `peer`, checked: the destination holds the peer's data and the
/// guards their poison (a rank that does not receive checks that nothing was written).
fn one_call(cx: &Ctx, peer: usize, n: usize, both: bool, tag: u64) -> Result<(), String> {
    let rank = cx.comm.rank();
    let sends = both || rank < peer;
    let recvs = both || rank > peer;
    // One byte more than needed, so that a 0-byte call still has a buffer to view.
    let mut src_data = cx.data_of(rank, tag, n);
    src_data.push(0);
    let src = cx.stream.clone_htod(&src_data).map_err(|e| e.to_string())?;
    let mut dst = poisoned(cx, n + 2 * GUARD)?;
    cx.sync()?;
    {
        let s = src.slice(..n);
        let mut d = dst.slice_mut(GUARD..GUARD + n);
        let c = &cx.comm;
        match (sends, recvs) {
            (true, true) => c.sendrecv(&s, peer, &mut d, peer, &cx.stream),
            (true, false) => c.send(&s, peer, &cx.stream),
            _ => c.recv(&mut d, peer, &cx.stream),
        }
        .map_err(|e| e.to_string())?;
    }
    cx.sync()?;
    let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
    let mut expect = vec![POISON; n + 2 * GUARD];
    if recvs {
        expect[GUARD..GUARD + n].copy_from_slice(&cx.data_of(peer, tag, n));
    }
    compare(&got, &expect, "destination with guards")
}

/// Sizes the back-to-back calls cycle through.
const CYCLE: &[usize] = &[8, 4099, 65_539, (1 << 20) + 5, 3];

/// `calls` calls both ways with the partner, each into its own part of one destination,
/// enqueued back to back; one synchronisation, then every byte checked.
pub(super) fn back_to_back(cx: &Ctx, calls: usize) -> Checked {
    let net = match job(cx, "net_back_to_back")? {
        Ok(j) => j,
        Err(skip) => return Ok(skip),
    };
    cx.host_barrier()?;
    let Some(peer) = net.partner else {
        cx.host_barrier()?;
        return Ok(no_partner(cx));
    };
    let rank = cx.comm.rank();
    let sizes: Vec<usize> = (0..calls).map(|c| CYCLE[c % CYCLE.len()]).collect();
    let total: usize = sizes.iter().sum();
    let src = cx
        .stream
        .clone_htod(&cx.data_of(rank, 7000, total))
        .map_err(|e| e.to_string())?;
    let mut dst = poisoned(cx, total)?;
    cx.sync()?;
    let mut off = 0;
    for (c, &n) in sizes.iter().enumerate() {
        let s = src.slice(off..off + n);
        let mut d = dst.slice_mut(off..off + n);
        cx.comm
            .sendrecv(&s, peer, &mut d, peer, &cx.stream)
            .map_err(|e| format!("call {c} ({n} B): {e}"))?;
        off += n;
    }
    cx.sync()?;
    let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
    compare(&got, &cx.data_of(peer, 7000, total), "the calls' destinations")?;
    cx.host_barrier()?;
    Ok(Outcome::Pass(format!(
        "{calls} calls both ways with network peer {peer} ({total} B in all, sizes {CYCLE:?} in \
         turn), one synchronisation, every byte checked"
    )))
}

/// Sizes of the captured calls.
const GRAPH_SIZES: &[usize] = &[8, 4097, 1 << 20, (3 << 20) + 7];

/// A graph of the [`GRAPH_SIZES`] calls both ways, replayed `replays` times; before each
/// replay the source gets another variant and the destination is zeroed; each replay checked.
pub(super) fn graph(cx: &Ctx, replays: usize) -> Checked {
    let net = match job(cx, "net_graph")? {
        Ok(j) => j,
        Err(skip) => return Ok(skip),
    };
    cx.host_barrier()?;
    let Some(peer) = net.partner else {
        // The barriers of replay_graph_with: one before the capture, one per replay, one last.
        for _ in 0..replays + 2 {
            cx.host_barrier()?;
        }
        return Ok(no_partner(cx));
    };
    replay_graph_with(cx, peer, replays, GRAPH_SIZES, None, 900)?;
    Ok(Outcome::Pass(format!(
        "{replays} replays of a graph of {} calls both ways with network peer {peer} (sizes \
         {GRAPH_SIZES:?}), each on another source variant, every byte checked",
        GRAPH_SIZES.len()
    )))
}
