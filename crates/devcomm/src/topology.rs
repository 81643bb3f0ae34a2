//! Layer 3: the link kind of every peer.
//!
//! CONTRACT (owned by the lead): `Topology::discover` all-gathers (host identity, PCI bus id,
//! UUID) and asks CUDA whether peer access is possible; `DEVCOMM_TOPOLOGY_OVERRIDE` forces kinds.

use std::fmt;

/// How this rank reaches a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum LinkKind {
    /// The rank itself.
    #[serde(rename = "self")]
    SelfLink,
    /// Same host with CUDA peer access (NVLink or PCIe P2P): loads and stores from kernels.
    #[serde(rename = "nvl")]
    Nvl,
    /// Same host without peer access (reserved: host-staged transport, not built yet).
    #[serde(rename = "shm")]
    Shm,
    /// Another host (reserved: network transport, not built yet).
    #[serde(rename = "net")]
    Net,
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::SelfLink => "self",
            Self::Nvl => "nvl",
            Self::Shm => "shm",
            Self::Net => "net",
        })
    }
}

/// What every rank knows of one rank's GPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerDevice {
    /// Global rank.
    pub rank: usize,
    /// Host identity (hostname plus boot id).
    pub host: String,
    /// PCI bus id, e.g. `0000:19:00.0`.
    pub pci_bus_id: String,
    /// GPU UUID.
    pub uuid: String,
    /// GPU name.
    pub name: String,
}

/// The link kind of every peer, as seen from this rank.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Topology {
    /// This rank.
    pub rank: usize,
    /// Indexed by rank.
    pub kinds: Vec<LinkKind>,
    /// Indexed by rank.
    pub devices: Vec<PeerDevice>,
}

impl Topology {
    /// The link kind to `peer`.
    pub fn kind(&self, peer: usize) -> LinkKind {
        self.kinds[peer]
    }

    /// Ranks other than this one that kernels can reach with loads and stores.
    pub fn nvl_peers(&self) -> Vec<usize> {
        (0..self.kinds.len()).filter(|&p| self.kinds[p] == LinkKind::Nvl).collect()
    }

    /// Ranks on this host (this rank included), whatever their link kind.
    pub fn local_ranks(&self) -> Vec<usize> {
        let me = &self.devices[self.rank].host;
        (0..self.devices.len()).filter(|&p| &self.devices[p].host == me).collect()
    }
}
