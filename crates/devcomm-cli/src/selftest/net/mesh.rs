//! Send/recv with several peers: a ring over network links (the send and receive roles of one
//! launch with different network peers), and calls with a network partner and an NVLink
//! partner in turn on one stream (a mixed topology).

use cudarc::driver::CudaSlice;

use super::super::harness::{compare, poisoned, Checked, Ctx, Outcome, Skip};
use super::job;

/// Sizes the calls cycle through.
const SIZES: &[usize] = &[8, 4099, (1 << 20) + 5, 65_536, (2 << 20) + 1];

fn upload(cx: &Ctx, who: usize, tag: u64, n: usize) -> Result<CudaSlice<u8>, String> {
    cx.stream
        .clone_htod(&cx.data_of(who, tag, n))
        .map_err(|e| e.to_string())
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
    for call in 0..calls {
        let n = SIZES[call % SIZES.len()];
        let tag = 3000 + call as u64;
        let src = upload(cx, rank, tag, n)?;
        let mut dst = poisoned(cx, n)?;
        cx.comm
            .sendrecv(&src, next, &mut dst, prev, &cx.stream)
            .map_err(|e| format!("call {call} ({n} B): {e}"))?;
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
        compare(&got, &cx.data_of(prev, tag, n), &format!("call {call} ({n} B)"))?;
    }
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
