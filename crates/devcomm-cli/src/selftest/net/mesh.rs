//! Send/recv with several peers: a ring over network links (the send and receive roles of one
//! launch with different network peers), calls with a network partner and an NVLink partner
//! in turn on one stream, and a ring whose every call sends over one kind of link and
//! receives over the other (a mixed topology; the launch is split between the two routes).

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use devcomm::p2p::Transfer;

use super::super::harness::{compare, poisoned, Checked, Ctx, Outcome, Skip};
use super::job;

/// Sizes the calls cycle through.
const SIZES: &[usize] = &[8, 4099, (1 << 20) + 5, 65_536, (2 << 20) + 1];

fn upload(cx: &Ctx, who: usize, tag: u64, n: usize) -> Result<CudaSlice<u8>, String> {
    cx.stream
        .clone_htod(&cx.data_of(who, tag, n))
        .map_err(|e| e.to_string())
}

/// `calls` calls, each sending to `next` and receiving from `prev` in one launch, sizes from
/// [`SIZES`] in turn, data tagged from `tag0`; each call checked.
fn ring_calls(cx: &Ctx, next: usize, prev: usize, calls: usize, tag0: u64) -> Result<(), String> {
    let rank = cx.comm.rank();
    for call in 0..calls {
        let n = SIZES[call % SIZES.len()];
        let tag = tag0 + call as u64;
        let src = upload(cx, rank, tag, n)?;
        let mut dst = poisoned(cx, n)?;
        cx.comm
            .sendrecv(&src, next, &mut dst, prev, &cx.stream)
            .map_err(|e| format!("call {call} ({n} B): {e}"))?;
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
        compare(&got, &cx.data_of(prev, tag, n), &format!("call {call} ({n} B)"))?;
    }
    Ok(())
}

/// `calls` calls of a ring: each rank sends to the next and receives from the one before in
/// one launch, every link a network link; each call checked.
pub(super) fn ring(cx: &Ctx, calls: usize) -> Checked {
    let net = match job(cx, "net_ring")? {
        Ok(j) => j,
        Err(skip) => return Ok(skip),
    };
    if !net.ring_is_net {
        return Ok(Outcome::Skip(Skip::Links(
            "not every link of the ring r -> r + 1 is a network link (a mixed topology)".into(),
        )));
    }
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    cx.host_barrier()?;
    ring_calls(cx, next, prev, calls, 3000)?;
    cx.host_barrier()?;
    Ok(Outcome::Pass(format!(
        "{calls} ring calls (to network peer {next}, from network peer {prev}), sizes {SIZES:?} \
         in turn, every byte checked"
    )))
}

/// `rounds` rounds of a call both ways with the network partner, then one with the NVLink
/// partner, enqueued on one stream; checked after each round.
pub(super) fn beside_nvlink(cx: &Ctx, rounds: usize) -> Checked {
    let net = match job(cx, "net_beside_nvlink")? {
        Ok(j) => j,
        Err(skip) => return Ok(skip),
    };
    // Every rank must take part in every round (a rank left out would leave its partners
    // waiting): the ranks agree whether each has both partners.
    let both = net.partner.zip(net.nvl_partner);
    let all = cx
        .comm
        .store()
        .all_gather(
            "__devcomm_cli/net/beside_nvlink",
            &[u8::from(both.is_some())],
            cx.comm.setup_timeout(),
        )
        .map_err(|e| e.to_string())?;
    let Some((np, vp)) = both.filter(|_| all.iter().all(|v| v.as_slice() == [1])) else {
        return Ok(Outcome::Skip(Skip::Links(
            "not every rank has both a network and an NVLink partner (a mixed topology such as \
             0-2=net,0-3=net,1-2=net,1-3=net on 4 ranks has)"
                .into(),
        )));
    };
    let rank = cx.comm.rank();
    cx.host_barrier()?;
    for round in 0..rounds {
        let n = SIZES[round % SIZES.len()];
        let (tn, tv) = (4000 + 2 * round as u64, 4001 + 2 * round as u64);
        let (sn, sv) = (upload(cx, rank, tn, n)?, upload(cx, rank, tv, n)?);
        let (mut dn, mut dv) = (poisoned(cx, n)?, poisoned(cx, n)?);
        cx.comm
            .sendrecv(&sn, np, &mut dn, np, &cx.stream)
            .map_err(|e| format!("round {round}: network call ({n} B): {e}"))?;
        cx.comm
            .sendrecv(&sv, vp, &mut dv, vp, &cx.stream)
            .map_err(|e| format!("round {round}: NVLink call ({n} B): {e}"))?;
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&dn).map_err(|e| e.to_string())?;
        compare(&got, &cx.data_of(np, tn, n), &format!("round {round}: from network peer {np}"))?;
        let got = cx.stream.clone_dtoh(&dv).map_err(|e| e.to_string())?;
        compare(&got, &cx.data_of(vp, tv, n), &format!("round {round}: from NVLink peer {vp}"))?;
    }
    cx.host_barrier()?;
    Ok(Outcome::Pass(format!(
        "{rounds} rounds with network peer {np} then NVLink peer {vp} on one stream, sizes \
         {SIZES:?} in turn, every byte checked"
    )))
}

/// A cycle through every rank (starting at 0) in which each rank's link to the next and its
/// link from the one before are of different kinds, one network (`net[a][b]`) and one NVLink
/// (`nvl[a][b]`), if there is one (pure; tried in order, up to 8 ranks).
pub(crate) fn mixed_cycle(net: &[Vec<bool>], nvl: &[Vec<bool>]) -> Option<Vec<usize>> {
    let n = net.len();
    if !(3..=8).contains(&n) {
        return None;
    }
    let kind = |a: usize, b: usize| -> Option<bool> {
        match (net[a].get(b) == Some(&true), nvl[a].get(b) == Some(&true)) {
            (true, _) => Some(true),
            (false, true) => Some(false),
            _ => None,
        }
    };
    fn extend(
        order: &mut Vec<usize>,
        used: &mut Vec<bool>,
        kind: &dyn Fn(usize, usize) -> Option<bool>,
    ) -> bool {
        let n = used.len();
        let last = order[order.len() - 1];
        let alternates = |a: usize, b: usize, c: usize| match (kind(a, b), kind(b, c)) {
            (Some(x), Some(y)) => x != y,
            _ => false,
        };
        if order.len() == n {
            // Close the cycle: last -> 0 differs from the link into last, and 0's two links.
            let prev = order[n - 2];
            return alternates(prev, last, order[0]) && alternates(last, order[0], order[1]);
        }
        for next in 1..n {
            if used[next] || kind(last, next).is_none() {
                continue;
            }
            if order.len() >= 2 && !alternates(order[order.len() - 2], last, next) {
                continue;
            }
            used[next] = true;
            order.push(next);
            if extend(order, used, kind) {
                return true;
            }
            order.pop();
            used[next] = false;
        }
        false
    }
    let mut order = vec![0];
    let mut used = vec![false; n];
    used[0] = true;
    extend(&mut order, &mut used, &kind).then_some(order)
}

/// `calls` calls of a ring (a [`mixed_cycle`]) whose every launch sends over one kind of link
/// and receives over the other, so that each call runs an NVLink role and a network role side
/// by side; each checked. Then `replays` replays of a captured graph of two such calls.
pub(super) fn mixed_ring(cx: &Ctx, calls: usize, replays: usize) -> Checked {
    let net = match job(cx, "net_mixed_ring")? {
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
    let at = order.iter().position(|&r| r == rank).ok_or("rank not in the ring")?;
    let (next, prev) = (order[(at + 1) % world], order[(at + world - 1) % world]);
    let kind = |p: usize| format!("{:?}", cx.comm.topology().kind(p));
    cx.host_barrier()?;
    ring_calls(cx, next, prev, calls, 5000)?;
    // A graph of two split calls (an event fork and join each), replayed on fresh sources.
    let sizes = [4099usize, (1 << 20) + 5];
    let total: usize = sizes.iter().sum();
    let mut src = cx.stream.alloc_zeros::<u8>(total).map_err(|e| e.to_string())?;
    let mut dst = poisoned(cx, total)?;
    let (sp, dp) = {
        let (s, _a) = src.device_ptr(&cx.stream);
        let (d, _b) = dst.device_ptr_mut(&cx.stream);
        (s, d)
    };
    cx.sync()?;
    let graph = cx.capture(|| -> Result<(), devcomm::Error> {
        let mut off = 0u64;
        for &b in &sizes {
            let t = |ptr: u64, peer: usize| Transfer {
                ptr: ptr + off,
                bytes: b as u64,
                peer,
                config: None,
            };
            // SAFETY: src and dst hold `total` bytes and outlive the graph's replays below.
            unsafe {
                cx.comm
                    .sendrecv_raw(Some(t(sp, next)), Some(t(dp, prev)), &cx.stream)
            }?;
            off += b as u64;
        }
        Ok(())
    })?;
    for r in 0..replays {
        let tag = 6000 + r as u64;
        cx.stream
            .memcpy_htod(&cx.data_of(rank, tag, total), &mut src)
            .map_err(|e| e.to_string())?;
        cx.stream.memset_zeros(&mut dst).map_err(|e| e.to_string())?;
        cx.sync()?;
        cx.host_barrier()?;
        graph.launch().map_err(|e| format!("replay {r}: {e}"))?;
        cx.sync()
            .and_then(|()| cx.comm.check().map_err(|e| e.to_string()))
            .map_err(|e| format!("replay {r}: {e}"))?;
        let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
        compare(&got, &cx.data_of(prev, tag, total), &format!("replay {r}"))?;
    }
    cx.host_barrier()?;
    Ok(Outcome::Pass(format!(
        "ring {order:?}: {calls} calls sending to {next} ({}) and receiving from {prev} ({}) in \
         one call each, sizes {SIZES:?} in turn, then {replays} replays of a graph of two such \
         calls, every byte checked",
        kind(next),
        kind(prev)
    )))
}
