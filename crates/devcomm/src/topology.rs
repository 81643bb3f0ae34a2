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
    /// Another host: send/recv through the network proxy transport (docs/NETWORK.md); the
    /// other operations refuse it.
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
    /// Indexed by rank: reached over NVLink but tuned like a network peer (forced by
    /// `nvl-as-net` in [`OVERRIDE_ENV`], to test per-peer tuning on one host).
    #[serde(default)]
    pub net_tuned: Vec<bool>,
}

impl Topology {
    /// The link kind to `peer`.
    pub fn kind(&self, peer: usize) -> LinkKind {
        self.kinds[peer]
    }

    /// Whether collectives tune `peer` as a network peer (few blocks, large chunks).
    pub fn tuned_as_net(&self, peer: usize) -> bool {
        self.kinds[peer] == LinkKind::Net || self.net_tuned.get(peer).copied().unwrap_or(false)
    }

    /// Ranks other than this one that kernels can reach with loads and stores.
    pub fn nvl_peers(&self) -> Vec<usize> {
        (0..self.kinds.len())
            .filter(|&p| self.kinds[p] == LinkKind::Nvl)
            .collect()
    }

    /// Ranks on this host (this rank included), whatever their link kind.
    pub fn local_ranks(&self) -> Vec<usize> {
        let me = &self.devices[self.rank].host;
        (0..self.devices.len())
            .filter(|&p| &self.devices[p].host == me)
            .collect()
    }
}

/// Environment variable that forces link kinds, for tests.
///
/// The syntax of `DEVCOMM_TOPOLOGY_OVERRIDE` ([`crate::Config::topology_override`]):
/// comma-separated entries, each applied to both ends of a link, later entries winning:
/// `A-B=kind` sets the link between ranks A and B; `A-*=kind` every link of rank A.
/// Kinds: `nvl`, `shm`, `net`, and `nvl-as-net` (reached over NVLink, tuned like a network
/// peer: tests per-peer tuning and block masking on one host). Example: `DEVCOMM_TOPOLOGY_OVERRIDE="0-3=net,1-*=shm"`.
/// Forcing `nvl` where CUDA reports no peer access is refused.
///
/// `DEVCOMM_DISABLE_P2P` ([`crate::Config::disable_p2p`]) turns same-host peers into `shm`.
/// `DEVCOMM_SHARE_GPU` ([`crate::Config::share_gpu`]) lets several ranks share one GPU, for
/// functional tests on a machine with fewer GPUs than ranks: rank `r` opens device
/// `LOCAL_RANK % device count` (unless the builder names one) and ranks on the same GPU reach
/// each other as `nvl` peers (a kernel reaches memory of its own device mapped from another
/// process with loads and stores, as it would a peer's over NVLink). Without it two ranks on
/// one GPU are refused. Timings taken so say nothing of NVLink, and NCCL refuses such a group:
/// `devcomm bench` does not run with it. Kernels of different processes on one GPU take turns
/// unless an MPS server runs (docs/TESTING.md).
pub const OVERRIDE_ENV: &str = "DEVCOMM_TOPOLOGY_OVERRIDE";
/// The variable of [`crate::Config::disable_p2p`] (named in messages).
pub const DISABLE_P2P_ENV: &str = "DEVCOMM_DISABLE_P2P";
/// The variable of [`crate::Config::share_gpu`] (named in messages).
pub const SHARE_GPU_ENV: &str = "DEVCOMM_SHARE_GPU";

/// One parsed override entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverrideRule {
    /// First rank.
    pub(crate) a: usize,
    /// Second rank, or `None` for every rank.
    pub(crate) b: Option<usize>,
    /// The kind to force.
    pub(crate) kind: LinkKind,
    /// `nvl-as-net`: tune the link like a network link.
    pub(crate) net_tuned: bool,
}

/// Parses [`OVERRIDE_ENV`]'s value; errors name the bad entry.
pub(crate) fn parse_override(spec: &str, world_size: usize) -> Result<Vec<OverrideRule>, String> {
    let mut rules = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (link, kind) = entry
            .split_once('=')
            .ok_or_else(|| format!("entry `{entry}`: expected `A-B=kind`"))?;
        let net_tuned = kind.trim() == "nvl-as-net";
        let kind = match kind.trim() {
            "nvl" | "nvl-as-net" => LinkKind::Nvl,
            "shm" => LinkKind::Shm,
            "net" => LinkKind::Net,
            other => {
                return Err(format!(
                    "entry `{entry}`: unknown kind `{other}` (nvl, shm, net, nvl-as-net)"
                ))
            }
        };
        let (a, b) = link
            .split_once('-')
            .ok_or_else(|| format!("entry `{entry}`: expected `A-B=kind` or `A-*=kind`"))?;
        let rank = |s: &str| -> Result<usize, String> {
            let r: usize = s
                .trim()
                .parse()
                .map_err(|_| format!("entry `{entry}`: `{s}` is not a rank"))?;
            if r >= world_size {
                return Err(format!(
                    "entry `{entry}`: rank {r} >= world size {world_size}"
                ));
            }
            Ok(r)
        };
        let a = rank(a)?;
        let b = if b.trim() == "*" {
            None
        } else {
            Some(rank(b)?)
        };
        if b == Some(a) {
            return Err(format!(
                "entry `{entry}`: a rank's link to itself cannot be forced"
            ));
        }
        rules.push(OverrideRule {
            a,
            b,
            kind,
            net_tuned,
        });
    }
    Ok(rules)
}

/// Decides the link kinds of `rank` from every rank's device, whether CUDA reports peer access
/// to each (`peer_access[p]`, meaningful for same-host peers), the override rules and the
/// disable switch. Pure, so that every rank's view can be tested without GPUs.
#[cfg(test)]
pub(crate) fn decide_kinds(
    rank: usize,
    devices: &[PeerDevice],
    peer_access: &[bool],
    rules: &[OverrideRule],
    disable_p2p: bool,
) -> Result<Vec<LinkKind>, String> {
    decide_links(rank, devices, peer_access, rules, disable_p2p).map(|(kinds, _)| kinds)
}

/// [`decide_kinds`] plus which peers are tuned as network peers (`nvl-as-net`).
pub(crate) fn decide_links(
    rank: usize,
    devices: &[PeerDevice],
    peer_access: &[bool],
    rules: &[OverrideRule],
    disable_p2p: bool,
) -> Result<(Vec<LinkKind>, Vec<bool>), String> {
    let mut net_tuned = vec![false; devices.len()];
    let me = &devices[rank];
    let mut kinds: Vec<LinkKind> = devices
        .iter()
        .enumerate()
        .map(|(p, d)| {
            if p == rank {
                LinkKind::SelfLink
            } else if d.host != me.host {
                LinkKind::Net
            } else if peer_access[p] && !disable_p2p {
                LinkKind::Nvl
            } else {
                LinkKind::Shm
            }
        })
        .collect();
    for rule in rules {
        let peer = match (rule.a == rank, rule.b) {
            (true, Some(b)) => Some(b),
            (false, Some(b)) if b == rank => Some(rule.a),
            (true, None) => None,
            (false, None) => Some(rule.a),
            (false, Some(_)) => continue,
        };
        let targets: Vec<usize> = match peer {
            Some(p) => vec![p],
            None => (0..devices.len()).filter(|&p| p != rank).collect(),
        };
        for p in targets {
            if rule.kind == LinkKind::Nvl && (!peer_access[p] || devices[p].host != me.host) {
                return Err(format!(
                    "{OVERRIDE_ENV} forces nvl between ranks {rank} and {p}, but CUDA reports no \
                     peer access between them"
                ));
            }
            kinds[p] = rule.kind;
            net_tuned[p] = rule.net_tuned;
        }
    }
    Ok((kinds, net_tuned))
}

/// Refuses a peer of `rank` on the same GPU (same host and UUID) unless `share`
/// ([`SHARE_GPU_ENV`]) allows it. Pure, so that the rule can be tested without GPUs.
pub(crate) fn check_shared_gpus(
    rank: usize,
    devices: &[PeerDevice],
    share: bool,
) -> Result<(), String> {
    let me = &devices[rank];
    match devices
        .iter()
        .enumerate()
        .find(|&(p, d)| p != rank && d.host == me.host && d.uuid == me.uuid)
    {
        Some((p, d)) if !share => Err(format!(
            "ranks {rank} and {p} use the same GPU ({}); set {SHARE_GPU_ENV}=1 to allow it for \
             functional tests",
            d.uuid
        )),
        _ => Ok(()),
    }
}

/// This host's identity: hostname plus boot id (two containers on one machine share the boot
/// id but not always the hostname; two machines never share both).
pub(crate) fn host_identity() -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".to_owned());
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    format!("{hostname}/{boot_id}")
}

impl Topology {
    /// Collective: all-gathers every rank's device and host identity, asks CUDA about peer
    /// access to each same-host GPU, applies [`OVERRIDE_ENV`] and [`DISABLE_P2P_ENV`], then
    /// checks that every rank's view agrees (A sees B as NVLink exactly when B sees A so).
    pub(crate) fn discover(
        rank: usize,
        world_size: usize,
        store: &devcomm_bootstrap::Store,
        ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
        info: &crate::cuda::info::DeviceInfo,
        config: &crate::Config,
    ) -> crate::Result<Self> {
        let timeout = config.setup_timeout;
        use crate::Error;
        let me = PeerDevice {
            rank,
            host: host_identity(),
            pci_bus_id: info.pci_bus_id.clone(),
            uuid: info.uuid.clone(),
            name: info.name.clone(),
        };
        let blob = serde_json::to_vec(&me).map_err(|e| Error::InvalidArgument {
            op: "topology",
            reason: e.to_string(),
        })?;
        let gathered = store.all_gather("__devcomm/topology/devices", &blob, timeout)?;
        let devices = gathered
            .iter()
            .enumerate()
            .map(|(r, b)| {
                serde_json::from_slice::<PeerDevice>(b).map_err(|e| Error::Setup {
                    step: "topology".into(),
                    failures: vec![(r, format!("bad device record: {e}"))],
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        check_shared_gpus(rank, &devices, config.share_gpu).map_err(|reason| {
            Error::InvalidArgument {
                op: "topology",
                reason,
            }
        })?;
        let mut peer_access = vec![false; world_size];
        for (p, d) in devices.iter().enumerate() {
            if p != rank && d.host == me.host {
                // The own device is reachable by loads and stores (can_access_peer says so), so
                // ranks that share a GPU are nvl peers.
                peer_access[p] = crate::cuda::info::can_access_peer(ctx, &d.pci_bus_id)
                    .map_err(|e| crate::cuda::with_rank(e, rank))?;
            }
        }
        let rules = match &config.topology_override {
            Some(spec) => {
                parse_override(spec, world_size).map_err(|reason| Error::InvalidArgument {
                    op: "topology",
                    reason: format!("DEVCOMM_TOPOLOGY_OVERRIDE: {reason}"),
                })?
            }
            None => Vec::new(),
        };
        let disable = config.disable_p2p;
        let (kinds, net_tuned) = decide_links(rank, &devices, &peer_access, &rules, disable)
            .map_err(|reason| Error::InvalidArgument {
                op: "topology",
                reason,
            })?;

        let views = store.all_gather(
            "__devcomm/topology/kinds",
            &serde_json::to_vec(&kinds).unwrap_or_default(),
            timeout,
        )?;
        for (p, view) in views.iter().enumerate() {
            let theirs: Vec<LinkKind> = serde_json::from_slice(view).map_err(|e| Error::Setup {
                step: "topology".into(),
                failures: vec![(p, format!("bad link-kind record: {e}"))],
            })?;
            let mine_to_p = kinds[p] == LinkKind::Nvl;
            let theirs_to_me = theirs.get(rank) == Some(&LinkKind::Nvl);
            if mine_to_p != theirs_to_me {
                return Err(Error::Setup {
                    step: "topology".into(),
                    failures: vec![(
                        p,
                        format!(
                            "asymmetric link: rank {rank} sees {} to {p}, rank {p} sees {:?}",
                            kinds[p],
                            theirs.get(rank)
                        ),
                    )],
                });
            }
        }
        Ok(Self {
            rank,
            kinds,
            devices,
            net_tuned,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices(hosts: &[&str]) -> Vec<PeerDevice> {
        hosts
            .iter()
            .enumerate()
            .map(|(r, h)| PeerDevice {
                rank: r,
                host: (*h).to_owned(),
                pci_bus_id: format!("0000:{r:02x}:00.0"),
                uuid: format!("GPU-{r}"),
                name: "test".into(),
            })
            .collect()
    }

    #[test]
    fn same_host_with_peer_access_is_nvl_other_host_is_net() {
        let d = devices(&["a", "a", "a", "b"]);
        let kinds = decide_kinds(0, &d, &[true, true, false, true], &[], false).unwrap();
        assert_eq!(
            kinds,
            vec![
                LinkKind::SelfLink,
                LinkKind::Nvl,
                LinkKind::Shm,
                LinkKind::Net
            ]
        );
    }

    #[test]
    fn disable_p2p_turns_nvl_into_shm() {
        let d = devices(&["a", "a"]);
        let kinds = decide_kinds(1, &d, &[true, true], &[], true).unwrap();
        assert_eq!(kinds, vec![LinkKind::Shm, LinkKind::SelfLink]);
    }

    #[test]
    fn override_applies_to_both_ends() {
        let d = devices(&["a"; 4]);
        let rules = parse_override("0-3=net, 1-*=shm", 4).unwrap();
        let access = [true; 4];
        let k0 = decide_kinds(0, &d, &access, &rules, false).unwrap();
        let k3 = decide_kinds(3, &d, &access, &rules, false).unwrap();
        let k2 = decide_kinds(2, &d, &access, &rules, false).unwrap();
        assert_eq!(
            k0,
            vec![
                LinkKind::SelfLink,
                LinkKind::Shm,
                LinkKind::Nvl,
                LinkKind::Net
            ]
        );
        assert_eq!(
            k3,
            vec![
                LinkKind::Net,
                LinkKind::Shm,
                LinkKind::Nvl,
                LinkKind::SelfLink
            ]
        );
        assert_eq!(
            k2,
            vec![
                LinkKind::Nvl,
                LinkKind::Shm,
                LinkKind::SelfLink,
                LinkKind::Nvl
            ]
        );
        let k1 = decide_kinds(1, &d, &access, &rules, false).unwrap();
        assert_eq!(
            k1,
            vec![
                LinkKind::Shm,
                LinkKind::SelfLink,
                LinkKind::Shm,
                LinkKind::Shm
            ]
        );
    }

    #[test]
    fn ranks_on_one_gpu_only_when_shared() {
        let mut d = devices(&["h", "h", "other"]);
        d[1].uuid = d[0].uuid.clone();
        d[2].uuid = d[0].uuid.clone(); // another host: a different GPU whatever its UUID
        let err = check_shared_gpus(0, &d, false).unwrap_err();
        assert!(
            err.contains("ranks 0 and 1") && err.contains(SHARE_GPU_ENV),
            "{err}"
        );
        assert!(check_shared_gpus(1, &d, false).is_err());
        assert!(check_shared_gpus(2, &d, false).is_ok());
        assert!(check_shared_gpus(0, &d, true).is_ok());
        // Shared, the two ranks reach each other as nvl peers (the device reaches itself).
        let kinds = decide_kinds(0, &d, &[true, true, false], &[], false).unwrap();
        assert_eq!(kinds[1], LinkKind::Nvl);
        assert!(check_shared_gpus(0, &devices(&["h", "h"]), false).is_ok());
    }

    #[test]
    fn override_errors_name_the_entry() {
        assert!(parse_override("0-9=net", 4)
            .unwrap_err()
            .contains("0-9=net"));
        assert!(parse_override("0-1=fast", 4)
            .unwrap_err()
            .contains("unknown kind"));
        assert!(parse_override("1-1=net", 4).unwrap_err().contains("itself"));
        assert!(parse_override("01=net", 4).is_err());
        let d = devices(&["a", "b"]);
        let rules = parse_override("0-1=nvl", 2).unwrap();
        assert!(decide_kinds(0, &d, &[true, true], &rules, false)
            .unwrap_err()
            .contains("no peer"));
    }

    #[test]
    fn nvl_as_net_keeps_nvlink_and_marks_tuning_on_both_ends() {
        let d = devices(&["h", "h", "h"]);
        let rules = parse_override("0-2=nvl-as-net", 3).unwrap();
        let access = [true, true, true];
        let (k0, t0) = decide_links(0, &d, &access, &rules, false).unwrap();
        let (k2, t2) = decide_links(2, &d, &access, &rules, false).unwrap();
        assert_eq!(k0[2], LinkKind::Nvl);
        assert_eq!(k2[0], LinkKind::Nvl);
        assert_eq!(t0, vec![false, false, true]);
        assert_eq!(t2, vec![true, false, false]);
        let (_, t1) = decide_links(1, &d, &access, &rules, false).unwrap();
        assert_eq!(t1, vec![false; 3]);
    }
}
