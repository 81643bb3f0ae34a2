//! The registered-buffer (zero-copy) send/recv of the send/recv family (docs/PROTOCOL.md,
//! "Zero-copy"; `Comm::send_registered` and its kin forward here): each role resolved and
//! bounds-checked against the registry, then the form its peer's transport takes (the mesh's
//! answer): zero-copy over NVLink, or a send/recv of the network route into the registered
//! range (staged), or one of each side by side.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{Transfer, ZcRole, P2P};
use crate::error::{Error, Result};
use crate::group::Group;
use crate::jit::Jit;
use crate::memory::Registry;

/// A registered range as the family sees it (`Comm`'s `RegisteredRange` without its borrow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegRange {
    /// The registration's handle.
    pub(crate) handle: u64,
    /// Byte offset into the registered buffer.
    pub(crate) offset: u64,
    /// Bytes of the range.
    pub(crate) bytes: u64,
}

/// What a registered call needs besides the family itself.
#[derive(Clone, Copy)]
pub(crate) struct RegCtx<'a> {
    pub(crate) group: &'a Group,
    pub(crate) jit: &'a Jit,
    pub(crate) registry: &'a Registry,
}

impl RegCtx<'_> {
    fn rank(&self) -> usize {
        self.group.rank
    }

    fn is_network(&self, peer: usize) -> bool {
        self.group.mesh.is_network(peer)
    }
}

impl P2P {
    /// `Comm::send_registered` of `bytes` at `src` (checked by the caller).
    pub(crate) fn send_registered(
        &self,
        cx: RegCtx<'_>,
        (src, bytes): (u64, u64),
        peer: usize,
        dst: RegRange,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if cx.is_network(peer) {
            let send = zc_net_send(cx, src, bytes, peer, dst)?;
            return self.sendrecv(cx.group, cx.jit, Some(send), None, stream);
        }
        let send = zc_send(cx, src, bytes, peer, dst)?;
        self.launch_zero_copy(cx.group, cx.jit, Some(send), None, stream)
    }

    /// `Comm::recv_registered`.
    pub(crate) fn recv_registered(
        &self,
        cx: RegCtx<'_>,
        dst: RegRange,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if cx.is_network(peer) {
            let recv = zc_net_recv(cx, dst, peer)?;
            return self.sendrecv(cx.group, cx.jit, None, Some(recv), stream);
        }
        let recv = zc_recv(cx, dst, peer)?;
        self.launch_zero_copy(cx.group, cx.jit, None, Some(recv), stream)
    }

    /// `Comm::sendrecv_registered` (the caller checked that the send buffer and this rank's
    /// range do not overlap). Both roles are resolved and their ranges checked before
    /// anything is launched; one role of each kind runs side by side (see there).
    pub(crate) fn sendrecv_registered(
        &self,
        cx: RegCtx<'_>,
        (src, bytes, send_peer, send_dst): (u64, u64, usize, RegRange),
        (recv_dst, recv_peer): (RegRange, usize),
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (group, jit) = (cx.group, cx.jit);
        match zc_path(cx.is_network(send_peer), cx.is_network(recv_peer)) {
            ZcPath::Network => {
                let send = zc_net_send(cx, src, bytes, send_peer, send_dst)?;
                let recv = zc_net_recv(cx, recv_dst, recv_peer)?;
                self.sendrecv(group, jit, Some(send), Some(recv), stream)
            }
            ZcPath::Mixed { send_by_network } => {
                let (network, nvlink) = if send_by_network {
                    let send = zc_net_send(cx, src, bytes, send_peer, send_dst)?;
                    let recv = zc_recv(cx, recv_dst, recv_peer)?;
                    ([Some(send), None], [None, Some(recv)])
                } else {
                    let send = zc_send(cx, src, bytes, send_peer, send_dst)?;
                    let recv = zc_net_recv(cx, recv_dst, recv_peer)?;
                    ([None, Some(recv)], [Some(send), None])
                };
                self.network_for("sendrecv_registered", cx.rank())?
                    .launch_split(
                        self,
                        jit,
                        network,
                        |s| self.launch_zero_copy(group, jit, nvlink[0], nvlink[1], s),
                        stream,
                    )
            }
            ZcPath::Nvlink => {
                let send = zc_send(cx, src, bytes, send_peer, send_dst)?;
                let recv = zc_recv(cx, recv_dst, recv_peer)?;
                self.launch_zero_copy(group, jit, Some(send), Some(recv), stream)
            }
        }
    }
}

/// The send role of a zero-copy call to a network peer, as a send of the network route into
/// the peer's registered range: the range is checked against the size the peer registered
/// (every rank's size is known here), the receiver checks the message's size.
fn zc_net_send(
    cx: RegCtx<'_>,
    src: u64,
    bytes: u64,
    peer: usize,
    dst: RegRange,
) -> Result<Transfer> {
    const OP: &str = "send_registered";
    zc_same_size(cx, bytes, peer, dst)?;
    let Some(sizes) = cx.registry.sizes(dst.handle) else {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: format!(
                "{:#x} is not a registered handle on rank {}",
                dst.handle,
                cx.rank()
            ),
        });
    };
    let capacity = sizes.get(peer).copied().unwrap_or(0);
    if first_too_small(dst.offset, bytes, &[capacity]).is_some() {
        return Err(Error::CapacityExceeded {
            op: OP,
            peer,
            bytes: dst.offset.saturating_add(bytes),
            capacity,
        });
    }
    Ok(Transfer {
        ptr: src,
        bytes,
        peer,
        config: None,
    })
}

/// The receive role of a zero-copy call from a network peer: a receive of the network route
/// into this rank's registered range (checked here).
fn zc_net_recv(cx: RegCtx<'_>, dst: RegRange, peer: usize) -> Result<Transfer> {
    let (buf, _reg) = zc_target(cx, "recv_registered", dst, cx.rank())?;
    Ok(Transfer {
        ptr: buf,
        bytes: dst.bytes,
        peer,
        config: None,
    })
}

/// Refuses a send whose message and registered range differ in size.
fn zc_same_size(cx: RegCtx<'_>, bytes: u64, peer: usize, dst: RegRange) -> Result<()> {
    if dst.bytes == bytes {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op: "send_registered",
        reason: format!(
            "rank {}: the message to peer {peer} is {bytes} bytes, its registered range {} \
             bytes",
            cx.rank(),
            dst.bytes
        ),
    })
}

/// Resolves and bounds-checks the send role of a zero-copy call over NVLink.
pub(crate) fn zc_send(
    cx: RegCtx<'_>,
    src: u64,
    bytes: u64,
    peer: usize,
    dst: RegRange,
) -> Result<ZcRole> {
    const OP: &str = "send_registered";
    zc_same_size(cx, bytes, peer, dst)?;
    let (remote, reg) = zc_target(cx, OP, dst, peer)?;
    Ok(ZcRole {
        buf: src,
        bytes,
        peer,
        reg,
        offset: dst.offset,
        remote,
    })
}

/// Resolves and bounds-checks the receive role (the peer is checked at launch).
pub(crate) fn zc_recv(cx: RegCtx<'_>, dst: RegRange, peer: usize) -> Result<ZcRole> {
    let (buf, reg) = zc_target(cx, "recv_registered", dst, cx.rank())?;
    Ok(ZcRole {
        buf,
        bytes: dst.bytes,
        peer,
        reg,
        offset: dst.offset,
        remote: 0,
    })
}

/// `owner`'s buffer of `dst`'s registration as mapped here, plus `dst.offset`, and the
/// registration id, after checking that `dst.bytes` fit.
pub(crate) fn zc_target(
    cx: RegCtx<'_>,
    op: &'static str,
    dst: RegRange,
    owner: usize,
) -> Result<(u64, u64)> {
    let bytes = dst.bytes;
    let world = cx.group.world_size;
    if owner >= world {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("peer {owner} is not a rank (world size {world})"),
        });
    }
    let Some(target) = cx.registry.target(dst.handle, owner) else {
        if cx.registry.target(dst.handle, cx.rank()).is_none() {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "{:#x} is not a registered handle on rank {}",
                    dst.handle,
                    cx.rank()
                ),
            });
        }
        return Err(Error::NoPath {
            op,
            rank: cx.rank(),
            peer: owner,
            kind: cx.group.topology.kind(owner).to_string(),
        });
    };
    let end = dst.offset.checked_add(bytes);
    match end {
        Some(end) if end <= target.bytes => Ok((target.ptr + dst.offset, target.id)),
        _ => Err(Error::CapacityExceeded {
            op,
            peer: owner,
            bytes: end.unwrap_or(u64::MAX),
            capacity: target.bytes,
        }),
    }
}

/// How a `sendrecv_registered` call runs, by whether each role's peer is a network peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ZcPath {
    /// Zero-copy over NVLink: neither peer is a network peer (one that is not another rank is
    /// refused by the NVLink path).
    Nvlink,
    /// Both roles through the network route, staged.
    Network,
    /// One role of each kind: the NVLink role zero-copy on the caller's stream, the network
    /// role (the send role when `send_by_network`) staged beside it on the side stream.
    Mixed {
        /// Whether the send role is the network one.
        send_by_network: bool,
    },
}

/// The path of a `sendrecv_registered` call (pure).
fn zc_path(send_net: bool, recv_net: bool) -> ZcPath {
    match (send_net, recv_net) {
        (false, false) => ZcPath::Nvlink,
        (true, true) => ZcPath::Network,
        (send_by_network, _) => ZcPath::Mixed { send_by_network },
    }
}

/// The first rank whose registered size cannot hold `bytes` at `offset`, with that size (pure).
pub(crate) fn first_too_small(offset: u64, bytes: u64, sizes: &[u64]) -> Option<(usize, u64)> {
    let end = offset.checked_add(bytes);
    sizes
        .iter()
        .enumerate()
        .find(|&(_, &cap)| end.is_none_or(|end| end > cap))
        .map(|(rank, &cap)| (rank, cap))
}

#[cfg(test)]
mod tests {
    use super::{first_too_small, zc_path, ZcPath};

    #[test]
    fn a_call_with_one_role_of_each_kind_is_split_by_kind() {
        assert_eq!(zc_path(false, false), ZcPath::Nvlink);
        assert_eq!(zc_path(true, true), ZcPath::Network);
        assert_eq!(
            zc_path(true, false),
            ZcPath::Mixed {
                send_by_network: true
            }
        );
        assert_eq!(
            zc_path(false, true),
            ZcPath::Mixed {
                send_by_network: false
            }
        );
    }

    #[test]
    fn every_rank_registered_size_is_checked() {
        assert_eq!(first_too_small(0, 64, &[64, 64, 64]), None);
        assert_eq!(first_too_small(16, 64, &[128, 64, 128]), Some((1, 64)));
        assert_eq!(first_too_small(0, 65, &[64, 32]), Some((0, 64)));
        assert_eq!(
            first_too_small(u64::MAX, 1, &[u64::MAX]),
            Some((0, u64::MAX))
        );
        assert_eq!(first_too_small(0, 0, &[]), None);
    }
}
