//! Layer 2: the mesh, the transport that carries this rank's operations to each peer, decided
//! once when the communicator is built (docs/ARCHITECTURE.md, "Transports and the mesh").
//!
//! The topology says how a peer is linked ([`LinkKind`]); the mesh says which transport
//! serves it ([`Transport`]) and whether the job uses the network anywhere. Operation
//! families ask the mesh, never a link kind or a network flag of their own: whether a peer
//! is reachable by the NVLink kernels ([`Mesh::check_nvlink`]), which peers the network
//! carries ([`Mesh::network_peers`]), and the route of a send/recv launch
//! ([`Mesh::p2p_route`]). Adding a transport (a host-staged one for `Shm` peers, GPUDirect
//! RDMA) means a variant of [`Transport`], its row in [`transport_of`], and the module that
//! carries it.

use devcomm_bootstrap::Store;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::topology::{LinkKind, Topology};

/// What carries this rank's operations to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// This rank itself.
    Local,
    /// Loads and stores from kernels (NVLink, or PCIe peer access): every family's kernels.
    Nvlink,
    /// Descriptor queues drained by the network proxy (UCX; docs/NETWORK.md): send/recv,
    /// the all-to-all(-v), the reductions' network algorithm, barriers and registrations.
    Network,
    /// No transport serves this link kind yet: every call that needs the peer fails
    /// (`Error::NoPath`).
    Unserved(LinkKind),
}

/// The transport of a link kind: the one place where a link kind becomes a transport.
pub(crate) fn transport_of(kind: LinkKind) -> Transport {
    match kind {
        LinkKind::SelfLink => Transport::Local,
        LinkKind::Nvl => Transport::Nvlink,
        LinkKind::Net => Transport::Network,
        other => Transport::Unserved(other),
    }
}

/// The route of a send/recv launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum P2PRoute {
    /// The NVLink kernels (`p2p`), which refuse other peers themselves.
    Nvlink,
    /// The network kernel: every role with bytes to move has a network peer.
    Network,
    /// One role each: the send role by the network kernel and the receive role by the NVLink
    /// kernels (`send_by_network`), or the other way round; the two run side by side.
    Split {
        /// Whether the send role is the network one.
        send_by_network: bool,
    },
}

/// Each peer's transport as seen from this rank, and whether the job uses the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mesh {
    rank: usize,
    /// Each peer's link kind; its transport is [`transport_of`] it.
    kinds: Vec<LinkKind>,
    network_in_job: bool,
}

/// The store key of the setup step where every rank says whether it has a network peer.
const NETWORK_KEY: &str = "__devcomm/net/any";

impl Mesh {
    /// The mesh of `topology` (pure); `network_in_job`: whether some rank of the job has a
    /// network peer (every rank learns it at setup: [`Mesh::agree`]).
    pub(crate) fn decide(topology: &Topology, network_in_job: bool) -> Self {
        Self {
            rank: topology.rank,
            kinds: topology.kinds.clone(),
            network_in_job,
        }
    }

    /// Collective (setup): all-gathers whether each rank has a network peer, then decides.
    pub(crate) fn agree(store: &Store, topology: &Topology, timeout: Duration) -> Result<Self> {
        let mine = topology.kinds.contains(&LinkKind::Net);
        let flags = store.all_gather(NETWORK_KEY, &[u8::from(mine)], timeout)?;
        let any = flags.iter().any(|f| f.first() == Some(&1));
        Ok(Self::decide(topology, any))
    }

    /// The transport to `peer` (`None`: not a rank).
    pub(crate) fn transport(&self, peer: usize) -> Option<Transport> {
        self.kinds.get(peer).map(|&k| transport_of(k))
    }

    /// Whether `peer` is another rank that the network carries.
    pub(crate) fn is_network(&self, peer: usize) -> bool {
        self.transport(peer) == Some(Transport::Network)
    }

    /// The peers the network carries, ascending.
    pub(crate) fn network_peers(&self) -> Vec<usize> {
        (0..self.kinds.len())
            .filter(|&p| self.is_network(p))
            .collect()
    }

    /// Whether some peer of this rank is carried by the network.
    pub(crate) fn has_network_peers(&self) -> bool {
        self.kinds
            .iter()
            .any(|&k| transport_of(k) == Transport::Network)
    }

    /// Whether some link of the job, on any rank, is carried by the network (the same
    /// answer on every rank): then the network transport is set up on every rank, and the
    /// reductions and barriers take their network algorithm.
    pub(crate) fn network_in_job(&self) -> bool {
        self.network_in_job
    }

    /// `Ok` when the NVLink kernels reach every peer (`network_ok`: or the network carries
    /// it); else `Error::NoPath` for `op`, naming the first peer neither reaches and its link
    /// kind.
    pub(crate) fn check_nvlink(&self, op: &'static str, network_ok: bool) -> Result<()> {
        let unreached = self.kinds.iter().position(|&k| match transport_of(k) {
            Transport::Local | Transport::Nvlink => false,
            Transport::Network => !network_ok,
            Transport::Unserved(_) => true,
        });
        match unreached {
            None => Ok(()),
            Some(peer) => Err(self.no_path(op, peer)),
        }
    }

    /// `Ok` when `peer` is another rank the NVLink kernels reach; else `Error::NoPath`
    /// naming its link kind (the caller checked that `peer` is another rank).
    pub(crate) fn check_nvlink_peer(&self, op: &'static str, peer: usize) -> Result<()> {
        match self.transport(peer) {
            Some(Transport::Nvlink) => Ok(()),
            _ => Err(self.no_path(op, peer)),
        }
    }

    fn no_path(&self, op: &'static str, peer: usize) -> Error {
        Error::NoPath {
            op,
            rank: self.rank,
            peer,
            kind: self
                .kinds
                .get(peer)
                .map_or_else(|| "none".to_owned(), LinkKind::to_string),
        }
    }

    /// The route of a send/recv launch with roles `send` and `recv`, each `(peer, bytes)`
    /// (pure). Empty roles move nothing and do not count. A launch whose two roles need both
    /// routes is split: each role runs on its own route, side by side. A peer that is not
    /// another rank is left to the NVLink path's own check, unless a network role comes with
    /// it (then it is refused here, naming it).
    pub(crate) fn p2p_route(
        &self,
        send: Option<(usize, u64)>,
        recv: Option<(usize, u64)>,
    ) -> Result<P2PRoute> {
        // The transport of another rank; `None` for this rank or one that is not a rank.
        let of = |peer: usize| (peer != self.rank).then(|| self.transport(peer)).flatten();
        let roles = [send, recv].map(|r| r.filter(|&(_, bytes)| bytes > 0));
        let net = roles.map(|r| r.is_some_and(|(p, _)| of(p) == Some(Transport::Network)));
        let other = roles.map(|r| r.is_some_and(|(p, _)| of(p) != Some(Transport::Network)));
        if net.contains(&true) {
            if let Some((peer, _)) = roles.iter().flatten().find(|&&(p, _)| of(p).is_none()) {
                return Err(Error::InvalidArgument {
                    op: "sendrecv",
                    reason: format!(
                        "rank {}: peer {peer} is not another rank of the world",
                        self.rank
                    ),
                });
            }
        }
        Ok(match (net.contains(&true), other.contains(&true)) {
            (false, _) => P2PRoute::Nvlink,
            (true, false) => P2PRoute::Network,
            (true, true) => P2PRoute::Split {
                send_by_network: net[0],
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LinkKind::{Net, Nvl, SelfLink, Shm};

    fn mesh(rank: usize, kinds: &[LinkKind], network_in_job: bool) -> Mesh {
        Mesh {
            rank,
            kinds: kinds.to_vec(),
            network_in_job,
        }
    }

    #[test]
    fn each_link_kind_has_its_transport() {
        assert_eq!(transport_of(SelfLink), Transport::Local);
        assert_eq!(transport_of(Nvl), Transport::Nvlink);
        assert_eq!(transport_of(Net), Transport::Network);
        assert_eq!(transport_of(Shm), Transport::Unserved(Shm));
    }

    #[test]
    fn the_mesh_answers_per_peer_and_for_the_job() {
        let m = mesh(1, &[Net, SelfLink, Nvl, Net], true);
        assert_eq!(m.transport(0), Some(Transport::Network));
        assert_eq!(m.transport(1), Some(Transport::Local));
        assert_eq!(m.transport(4), None);
        assert!(m.is_network(3) && !m.is_network(2) && !m.is_network(9));
        assert_eq!(m.network_peers(), vec![0, 3]);
        assert!(m.has_network_peers() && m.network_in_job());
        // A rank without network peers in a job that has some elsewhere.
        let m = mesh(0, &[SelfLink, Nvl], true);
        assert!(!m.has_network_peers() && m.network_in_job());
        assert!(m.network_peers().is_empty());
    }

    #[test]
    fn nvlink_only_families_name_the_first_unreached_peer() {
        let m = mesh(0, &[SelfLink, Nvl, Net, Shm], true);
        let e = m.check_nvlink("all_reduce", false).unwrap_err();
        assert!(
            matches!(&e, Error::NoPath { op: "all_reduce", rank: 0, peer: 2, kind } if kind == "net"),
            "{e:?}"
        );
        // The collectives carry network peers: the shared-memory one is the first unreached.
        let e = m.check_nvlink("all_to_all", true).unwrap_err();
        assert!(
            matches!(&e, Error::NoPath { peer: 3, kind, .. } if kind == "shm"),
            "{e:?}"
        );
        assert!(mesh(1, &[Nvl, SelfLink], false)
            .check_nvlink("x", false)
            .is_ok());
        assert!(mesh(0, &[SelfLink, Net], true)
            .check_nvlink("x", true)
            .is_ok());
        assert!(m.check_nvlink_peer("send", 1).is_ok());
        for peer in [2, 3, 7] {
            assert!(
                matches!(m.check_nvlink_peer("send", peer), Err(Error::NoPath { .. })),
                "peer {peer}"
            );
        }
    }

    #[test]
    fn the_send_recv_route_follows_the_peers_transports() {
        // Rank 0: peer 1 over NVLink, 2 over the network, 3 shared memory (unserved).
        let m = mesh(0, &[SelfLink, Nvl, Net, Shm], true);
        let r = |send, recv| m.p2p_route(send, recv).unwrap();
        assert_eq!(r(Some((1, 8)), Some((1, 8))), P2PRoute::Nvlink);
        assert_eq!(r(Some((2, 8)), None), P2PRoute::Network);
        assert_eq!(r(None, Some((2, 8))), P2PRoute::Network);
        assert_eq!(r(Some((2, 8)), Some((2, 8))), P2PRoute::Network);
        // Nothing to move with the network peer: the NVLink role alone decides.
        assert_eq!(r(Some((2, 0)), Some((1, 8))), P2PRoute::Nvlink);
        assert_eq!(r(None, None), P2PRoute::Nvlink);
        // An unserved peer stays with the NVLink path, which refuses it (NoPath).
        assert_eq!(r(Some((3, 8)), None), P2PRoute::Nvlink);
        // Two roles on two routes: split, each on its own.
        assert_eq!(
            r(Some((1, 8)), Some((2, 8))),
            P2PRoute::Split {
                send_by_network: false
            }
        );
        assert_eq!(
            r(Some((2, 8)), Some((1, 8))),
            P2PRoute::Split {
                send_by_network: true
            }
        );
        // A peer that is not another rank beside a network peer is named as such...
        for bad in [9, 0] {
            let e = m
                .p2p_route(Some((bad, 8)), Some((2, 8)))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("peer {bad} is not another rank")),
                "{e}"
            );
            // ... and alone it is left to the NVLink path's own check.
            assert_eq!(r(Some((bad, 8)), None), P2PRoute::Nvlink);
        }
    }
}
