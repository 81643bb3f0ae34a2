//! The `net` group: send/recv with peers reached over the network (docs/NETWORK.md), on one
//! machine with forced links (`DEVCOMM_TOPOLOGY_OVERRIDE='0-*=net,1-*=net'`: every link, or a mix such as
//! `0-2=net,0-3=net,1-2=net,1-3=net` on 4 ranks) and UCX over loopback TCP. Every check pairs
//! the ranks joined by a network link ([`net_pairs`]); on a job without network links it is
//! skipped with the reason (the job's shape gives it nothing to do).
//!
//! Files: `calls.rs` (sizes one way and both ways, back-to-back calls, graph replays),
//! `mesh.rs` (a ring over network links, network and NVLink partners in turn, a ring of calls
//! split between the two routes), `errors.rs` (a size mismatch), `zero_copy.rs` (the
//! `*_registered` calls with network peers), `zero_copy_mixed.rs` (`sendrecv_registered` with
//! one NVLink and one network peer), `window.rs` (a user's kernel routing every peer of
//! a window). All-to-all(-v), the hooked collectives and the
//! reductions with network peers are checked by the `collectives` and `reduce` groups and the
//! `mismatch` group run with the same forced links (scripts/gpu-check.sh, `net-coll@N`,
//! `net-red@N`).

use devcomm::LinkKind;

use super::harness::{Check, Ctx, Outcome, Ranks, Skip};

mod calls;
mod errors;
mod mesh;
mod window;
mod zero_copy;
mod zero_copy_mixed;

/// The group's checks.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "net_sendrecv",
        ranks: Ranks::AtLeast(2),
        about: "send/recv with a network peer, one way and both ways, 0 B to 64 MiB: fresh \
                random data, poisoned destinations and guards, every byte checked",
        run: |cx, _| calls::sizes(cx),
    },
    Check {
        name: "net_back_to_back",
        ranks: Ranks::AtLeast(2),
        about: "200 send/recv calls both ways with a network peer, enqueued back to back without \
                a host step, every byte checked",
        run: |cx, _| calls::back_to_back(cx, 200),
    },
    Check {
        name: "net_graph",
        ranks: Ranks::AtLeast(2),
        about: "a CUDA graph of four send/recv calls both ways with a network peer, replayed 50 \
                times on fresh data, every replay checked",
        run: |cx, _| calls::graph(cx, 50),
    },
    Check {
        name: "net_ring",
        ranks: Ranks::AtLeast(3),
        about: "a ring over network links (send to the next rank, receive from the one before, \
                one launch), 50 calls of mixed sizes, every byte checked",
        run: |cx, _| mesh::ring(cx, 50),
    },
    Check {
        name: "net_beside_nvlink",
        ranks: Ranks::AtLeast(4),
        about: "with network and NVLink peers (a mixed topology): calls with the network \
                partner and with the NVLink partner in turn on one stream, 40 calls, every \
                byte checked",
        run: |cx, _| mesh::beside_nvlink(cx, 20),
    },
    Check {
        name: "net_mixed_ring",
        ranks: Ranks::AtLeast(3),
        about: "a ring in which every call sends over one kind of link and receives over the \
                other (NVLink and network roles side by side in one call), 40 calls of mixed \
                sizes and 20 replays of a captured graph of two, every byte checked",
        run: |cx, _| mesh::mixed_ring(cx, 40, 20),
    },
    Check {
        name: "net_zero_copy",
        ranks: Ranks::AtLeast(2),
        about: "send/recv_registered and sendrecv_registered with a network peer (8 B to \
                1 MiB + 3, guard bytes), a range past the peer's buffer refused, \
                all_to_all_registered",
        run: |cx, _| zero_copy::zero_copy(cx),
    },
    Check {
        name: "net_zero_copy_mixed",
        ranks: Ranks::AtLeast(3),
        about: "sendrecv_registered with one NVLink and one network peer (a mixed topology): \
                a ring over registered buffers both ways, 1 B to the copy-engine size, guard \
                bytes; the call against one-role calls of its peers; ranges past a \
                registration refused before launch; 10 replays of a captured graph",
        run: |cx, _| zero_copy_mixed::zero_copy_mixed(cx),
    },
    Check {
        name: "net_window",
        ranks: Ranks::AtLeast(2),
        about: "a user's kernel with a window: puts with signals, counters and flushes to every \
                peer by its route (NVLink stores or the network queues) in one launch, 1 B to \
                3 MiB + 5 over 54 rounds, every byte checked; 50 routed barriers",
        run: |cx, _| window::routed(cx),
    },
    Check {
        name: "net_registered_put",
        ranks: Ranks::AtLeast(2),
        about: "a user's registered buffer carries its network key (lkey); a kernel puts from \
                it into every peer's buffer of the registration by its route, 8 B to 1 MiB + 3, \
                every byte checked",
        run: |cx, _| window::registered(cx),
    },
    Check {
        name: "net_mismatch",
        ranks: Ranks::AtLeast(2),
        about: "send/recv of different sizes with a network peer: CallMismatch naming the peer \
                and both sizes on both sides within the timeout, nothing written; then verified \
                calls on a rebuilt communicator",
        run: |cx, p| errors::mismatch(cx, p.timeout),
    },
];

/// Pairs of ranks joined by a link of one kind (network, or NVLink), in rank order: each rank
/// is paired with the lowest unpaired rank above it that both see over that kind of link
/// (pure). `links[r][s]`: rank `r` sees `s` so. Entry `r` of the result is `r`'s partner.
pub(crate) fn net_pairs(links: &[Vec<bool>]) -> Vec<Option<usize>> {
    let n = links.len();
    let mut partner = vec![None; n];
    for r in 0..n {
        if partner[r].is_some() {
            continue;
        }
        let net = |a: usize, b: usize| links[a].get(b).copied().unwrap_or(false);
        if let Some(s) = (r + 1..n).find(|&s| partner[s].is_none() && net(r, s) && net(s, r)) {
            partner[r] = Some(s);
            partner[s] = Some(r);
        }
    }
    partner
}

/// What a check of this group works with.
pub(super) struct NetJob {
    /// This rank's network partner, if it has one.
    pub(super) partner: Option<usize>,
    /// This rank's NVLink partner (pairs over NVLink links), if it has one.
    pub(super) nvl_partner: Option<usize>,
    /// Whether every link of the ring r -> r + 1 is a network link.
    pub(super) ring_is_net: bool,
    /// A ring whose every rank sends over one kind of link and receives over the other.
    pub(super) mixed_cycle: Option<Vec<usize>>,
}

/// This job's network pairs (gathered under a key of `check`, unique per check), or the
/// outcome of a check that has nothing to do: a skip when no link of the job is `net`.
pub(super) fn job(cx: &Ctx, check: &str) -> Result<Result<NetJob, Outcome>, String> {
    let topo = cx.comm.topology();
    let mine: Vec<u8> = topo
        .kinds
        .iter()
        .map(|k| match k {
            LinkKind::Net => 1,
            LinkKind::Nvl => 2,
            _ => 0,
        })
        .collect();
    let all = cx
        .comm
        .store()
        .all_gather(
            &format!("__devcomm_cli/net/links/{check}"),
            &mine,
            cx.comm.setup_timeout(),
        )
        .map_err(|e| e.to_string())?;
    let matrix = |kind: u8| -> Vec<Vec<bool>> {
        all.iter()
            .map(|v| v.iter().map(|&b| b == kind).collect())
            .collect()
    };
    let links = matrix(1);
    if !links.iter().flatten().any(|&b| b) {
        return Ok(Err(Outcome::Skip(Skip::Links(
            "no network link in this job: DEVCOMM_TOPOLOGY_OVERRIDE='0-*=net,1-*=net,...' (or a mix such as \
             '0-2=net,0-3=net,1-2=net,1-3=net') forces them, with UCX found through \
             DEVCOMM_UCX_LIB (docs/NETWORK.md)"
                .into(),
        ))));
    }
    let rank = cx.comm.rank();
    let world = links.len();
    Ok(Ok(NetJob {
        partner: net_pairs(&links)[rank],
        nvl_partner: net_pairs(&matrix(2))[rank],
        ring_is_net: world >= 2 && (0..world).all(|r| links[r][(r + 1) % world]),
        mixed_cycle: mesh::mixed_cycle(&links, &matrix(2)),
    }))
}

/// The outcome of a rank without a network partner in a job that has network links.
pub(super) fn no_partner(cx: &Ctx) -> Outcome {
    Outcome::Skip(Skip::Links(format!(
        "rank {} has no network partner left in this job's pairs",
        cx.comm.rank()
    )))
}

#[cfg(test)]
mod tests {
    use super::mesh::mixed_cycle;
    use super::net_pairs;

    fn links(n: usize, net: &[(usize, usize)]) -> Vec<Vec<bool>> {
        let mut l = vec![vec![false; n]; n];
        for &(a, b) in net {
            l[a][b] = true;
            l[b][a] = true;
        }
        l
    }

    #[test]
    fn ranks_pair_over_network_links_only() {
        // Every link forced to net: 0-1, 2-3.
        let all: Vec<(usize, usize)> = (0..4)
            .flat_map(|a| (a + 1..4).map(move |b| (a, b)))
            .collect();
        assert_eq!(
            net_pairs(&links(4, &all)),
            vec![Some(1), Some(0), Some(3), Some(2)]
        );
        // The mix of the gpu-check step: 0-1 and 2-3 stay NVLink, the rest is net.
        let mix = links(4, &[(0, 2), (0, 3), (1, 2), (1, 3)]);
        assert_eq!(net_pairs(&mix), vec![Some(2), Some(3), Some(0), Some(1)]);
        // Odd world: the last rank is left out.
        assert_eq!(net_pairs(&links(3, &[(0, 1), (0, 2), (1, 2)]))[2], None);
        // No network link: no pairs.
        assert_eq!(net_pairs(&links(2, &[])), vec![None, None]);
        // A link only one side sees as net does not pair them.
        let mut one_sided = links(2, &[]);
        one_sided[0][1] = true;
        assert_eq!(net_pairs(&one_sided), vec![None, None]);
    }

    #[test]
    fn a_mixed_cycle_alternates_link_kinds_at_every_rank() {
        // The halves topology of gpu-check net-mixed@4: {0,1} and {2,3} on NVLink.
        let net = links(4, &[(0, 2), (0, 3), (1, 2), (1, 3)]);
        let nvl = links(4, &[(0, 1), (2, 3)]);
        let c = mixed_cycle(&net, &nvl).expect("a cycle");
        assert_eq!(c.len(), 4);
        let is_net = |a: usize, b: usize| net[a][b];
        for i in 0..4 {
            let (p, r, n) = (c[(i + 3) % 4], c[i], c[(i + 1) % 4]);
            assert_ne!(is_net(p, r), is_net(r, n), "{c:?} at {r}");
        }
        // Every link of one kind: no such cycle.
        let all = links(4, &[(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]);
        assert_eq!(mixed_cycle(&all, &links(4, &[])), None);
        // Two ranks: no cycle of three links or more.
        assert_eq!(mixed_cycle(&links(2, &[(0, 1)]), &links(2, &[])), None);
    }
}
