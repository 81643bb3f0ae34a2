//! Zero-copy send/recv: the sender writes straight into the receiver's registered buffer
//! (docs/PROTOCOL.md, "Zero-copy").

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DeviceRepr};

use super::{Comm, RegisteredRange};
use crate::error::{Error, Result};
use crate::p2p::{zero_copy_route, Transfer, ZcRole, ZcRoute};

/// Zero-copy send/recv into registered buffers.
///
/// The receiver posts where the message may land (its [`RegisteredRange`] and size) from its
/// stream; the sender waits for that, checks it against its own call, and its blocks write the
/// message straight into the receiver's buffer over NVLink: no staging, no copy on the
/// receiver, and the receiver's call uses one warp. Both sides must name the same
/// registration, offset and size; if they do not, nothing is written and both get
/// [`Error::ZeroCopyMismatch`] (the communicator stays usable). Stream order protects the
/// destination: the sender writes only after every earlier kernel on the receiver's stream
/// (for example one still reading the previous message) has finished.
///
/// Messages up to [`P2PLimits::ll_max_bytes`](crate::p2p::P2PLimits) (256 KiB by default)
/// travel by the low-latency path into the same destination instead: the handshake's extra
/// NVLink round trip would cost more than the receiver's copy saves. There the two sides'
/// ranges are not compared; a size mismatch shows as a timeout naming the peer.
///
/// With a **network peer** a call is a send/recv of the network route into the registered
/// range (staged through host memory, docs/NETWORK.md: not zero-copy): the sender checks the
/// range against the size the peer registered, the receiver its own range and, through the
/// chunk headers, the message's size. Such a call pairs with the peer's `*_registered` call or
/// its plain `recv`/`send` alike. A `sendrecv_registered` with one NVLink and one network peer
/// runs each role as the one-role call to its peer would, side by side (see there).
impl Comm {
    /// Sends `buf` to `peer`, straight into `peer`'s buffer of `dst`'s registration at
    /// `dst.offset` (`dst.bytes` must be `buf`'s size). The peer must post a matching
    /// [`Comm::recv_registered`] (or [`Comm::sendrecv_registered`]). A range beyond the peer's
    /// registered size is refused before launch.
    pub fn send_registered<T: DeviceRepr, S: DevicePtr<T>>(
        &self,
        buf: &S,
        peer: usize,
        dst: RegisteredRange<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (ptr, _sync) = self.slice_ptr("send_registered", buf, stream)?;
        if self.is_net_peer(peer) {
            let send = self.zc_net_send(ptr, buf.num_bytes() as u64, peer, dst)?;
            return self.sendrecv_routed(Some(send), None, stream);
        }
        let send = self.zc_send(ptr, buf.num_bytes() as u64, peer, dst)?;
        self.p2p
            .launch_zero_copy(&self.group, &self.jit, Some(send), None, stream)
    }

    /// Receives `dst.bytes` from `peer` into this rank's buffer of `dst`'s registration at
    /// `dst.offset`. When the call's work on `stream` completes, the data is there.
    pub fn recv_registered(
        &self,
        dst: RegisteredRange<'_>,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if self.is_net_peer(peer) {
            let recv = self.zc_net_recv(dst, peer)?;
            return self.sendrecv_routed(None, Some(recv), stream);
        }
        let recv = self.zc_recv(dst, peer)?;
        self.p2p
            .launch_zero_copy(&self.group, &self.jit, None, Some(recv), stream)
    }

    /// Both at once: sends `send_buf` into `send_peer`'s buffer of `send_dst`'s registration
    /// and receives `recv_dst.bytes` from `recv_peer` into this rank's `recv_dst`. The peers
    /// may be the same (an exchange) or differ (a ring step). The order is that of
    /// [`Comm::sendrecv`], with the send's destination after its peer.
    ///
    /// Two NVLink peers: one zero-copy launch. Two network peers: one launch of the network
    /// route. One of each (a ring across hosts): each role runs exactly as the one-role call
    /// to its peer would ([`Comm::send_registered`] / [`Comm::recv_registered`]), so either
    /// peer's matching call pairs with it, with the same per-peer call counts: the NVLink role
    /// on `stream`, the network role beside it on the communicator's side stream, forked from
    /// and joined back into `stream` as [`Comm::sendrecv`] splits such a pair. Both ranges are
    /// checked before anything is launched.
    ///
    /// Why no cycle of waits can form: a role waits only for its partner's role of the same
    /// kind (an NVLink role for the peer's descriptor, DONE flags or low-latency lines, which
    /// the peer's NVLink role posts; a network role for the peer's chunks or credits, which
    /// the peer's network kernel and proxy post), and every rank enqueues each of its roles
    /// behind its own earlier calls only, never behind its role of the other kind (the two
    /// start together after the fork). A rank with two NVLink peers runs both roles in one
    /// kernel, one with two network peers in one network kernel, so in a ring over mixed links
    /// the NVLink roles complete among themselves and the network roles among themselves.
    pub fn sendrecv_registered<T: DeviceRepr, S: DevicePtr<T>>(
        &self,
        send_buf: &S,
        send_peer: usize,
        send_dst: RegisteredRange<'_>,
        recv_dst: RegisteredRange<'_>,
        recv_peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (ptr, _sync) = self.slice_ptr("sendrecv_registered", send_buf, stream)?;
        let bytes = send_buf.num_bytes() as u64;
        let own = self
            .registry
            .get_nvlink_address(recv_dst.handle, self.rank())
            .map(|base| (base.saturating_add(recv_dst.offset), recv_dst.bytes));
        self.refuse_overlap("sendrecv_registered", Some((ptr, bytes)), own)?;
        match zc_path(self.is_net_peer(send_peer), self.is_net_peer(recv_peer)) {
            ZcPath::Network => {
                let send = self.zc_net_send(ptr, bytes, send_peer, send_dst)?;
                let recv = self.zc_net_recv(recv_dst, recv_peer)?;
                self.sendrecv_routed(Some(send), Some(recv), stream)
            }
            ZcPath::Mixed { send_by_network } => {
                // Both roles resolved and their ranges checked before anything is launched.
                let (network, nvlink) = if send_by_network {
                    let send = self.zc_net_send(ptr, bytes, send_peer, send_dst)?;
                    let recv = self.zc_recv(recv_dst, recv_peer)?;
                    ([Some(send), None], [None, Some(recv)])
                } else {
                    let send = self.zc_send(ptr, bytes, send_peer, send_dst)?;
                    let recv = self.zc_net_recv(recv_dst, recv_peer)?;
                    ([None, Some(recv)], [Some(send), None])
                };
                let (p2p, group, jit) = (&self.p2p, &self.group, &self.jit);
                self.p2p
                    .network_for("sendrecv_registered", self.rank())?
                    .launch_split(
                        p2p,
                        jit,
                        network,
                        |s| p2p.launch_zero_copy(group, jit, nvlink[0], nvlink[1], s),
                        stream,
                    )
            }
            ZcPath::Nvlink => {
                let send = self.zc_send(ptr, bytes, send_peer, send_dst)?;
                let recv = self.zc_recv(recv_dst, recv_peer)?;
                self.p2p
                    .launch_zero_copy(&self.group, &self.jit, Some(send), Some(recv), stream)
            }
        }
    }

    /// All-to-all into a registered output: `send` holds `world_size` equal chunks, chunk `p`
    /// for rank `p`; this rank's buffer of `recv`'s registration gets rank `p`'s chunk for it
    /// at `recv.offset + p x chunk` (`recv.bytes` must be `send`'s size). Every rank names the
    /// same registration and offset.
    ///
    /// The schedule goes by the chunk's zero-copy route
    /// ([`zero_copy_route`](crate::p2p::zero_copy_route)): below the copy-engine size it is
    /// [`Comm::all_to_all`] into the registered memory (one fused kernel); from there each
    /// rank copies its own chunk locally and then, in `world_size - 1` steps, exchanges
    /// straight into the peers' buffers ([`Comm::sendrecv_registered`]: sending to rank
    /// `r + k` while receiving from `r - k`), each chunk one copy-engine transfer. (All
    /// exchanges at once, each on streams of its own, measured 1.6x slower on 4 H200s:
    /// docs/PERFORMANCE.md, c8.) Ranges past any rank's registered buffer are refused before
    /// anything is launched.
    pub fn all_to_all_registered<T: DeviceRepr, S: DevicePtr<T>>(
        &self,
        send: &S,
        recv: RegisteredRange<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.capture_ready("all_to_all_registered", stream)?;
        const OP: &str = "all_to_all_registered";
        let (world, rank) = (self.world_size(), self.rank());
        let total = send.num_bytes() as u64;
        let elem = std::mem::size_of::<T>().max(1) as u64;
        if total % (world as u64 * elem) != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "send holds {total} bytes; it must be world size {world} x a chunk of whole \
                     elements of {elem} bytes"
                ),
            });
        }
        if recv.bytes != total {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "rank {rank}: the registered range holds {} bytes, send {total}",
                    recv.bytes
                ),
            });
        }
        let chunk = total / world as u64;
        // This rank's output range (and the registration) first.
        let (own, _) = self.zc_target(OP, recv, rank)?;
        // Then every rank's, from the sizes all ranks registered: each refuses the same call,
        // on either route, before any launches (a fused launch would wait for a refuser).
        let sizes = self.registry.sizes(recv.handle).unwrap_or_default();
        if let Some((peer, capacity)) = first_too_small(recv.offset, total, &sizes) {
            return Err(Error::CapacityExceeded {
                op: OP,
                peer,
                bytes: recv.offset.saturating_add(total),
                capacity,
            });
        }
        // The fused route writes whole elements of T: the output must be aligned for them.
        let align = std::mem::align_of::<T>() as u64;
        if recv.offset % align != 0 || own % align != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "the registered output at offset {} (address {own:#x}) is not aligned to \
                     {align} bytes, the alignment of {}",
                    recv.offset,
                    std::any::type_name::<T>()
                ),
            });
        }
        if chunk == 0 {
            return Ok(());
        }
        let (src, _sync) = self.slice_ptr("all_to_all_registered", send, stream)?;
        self.refuse_overlap(OP, Some((src, total)), Some((own, total)))?;
        let at = |p: usize| recv.shifted(p as u64 * chunk, chunk);
        // In a job with network links the fused kernel reaches every peer (NVLink and network
        // roles in one launch); the copy-engine steps reach NVLink peers only.
        let route = zero_copy_route(chunk, self.p2p.limits(), self.p2p.switches());
        if route != ZcRoute::CopyEngine || self.group.mesh.network_in_job() {
            let hooks = crate::collective::Hooks::<T>::copy();
            let elems = total / elem;
            return self.all_to_all_at(
                hooks.raw(),
                (src, elems),
                (own, elems),
                super::HookArgs::default(),
                stream,
            );
        }
        // Every step resolved (and bounds-checked on its peers) before anything is enqueued.
        let steps = (1..world)
            .map(|k| {
                let (to, from) = ((rank + k) % world, (rank + world - k) % world);
                let send = self.zc_send(src + to as u64 * chunk, chunk, to, at(rank))?;
                let recv = self.zc_recv(at(from), from)?;
                Ok((send, recv))
            })
            .collect::<Result<Vec<_>>>()?;
        crate::cuda::memcpy_dtod_async(
            own + rank as u64 * chunk,
            src + rank as u64 * chunk,
            chunk as usize,
            stream,
        )
        .map_err(|e| crate::cuda::with_rank(e, rank))?;
        for (send, recv) in steps {
            self.p2p
                .launch_zero_copy(&self.group, &self.jit, Some(send), Some(recv), stream)?;
        }
        Ok(())
    }

    /// Whether `peer` is another rank reached over the network.
    fn is_net_peer(&self, peer: usize) -> bool {
        self.group.mesh.is_network(peer)
    }

    /// The send role of a zero-copy call to a network peer, as a send of the network route
    /// into the peer's registered range: the range is checked against the size the peer
    /// registered (every rank's size is known here), the receiver checks the message's size.
    fn zc_net_send(
        &self,
        src: u64,
        bytes: u64,
        peer: usize,
        dst: RegisteredRange<'_>,
    ) -> Result<Transfer> {
        const OP: &str = "send_registered";
        self.zc_same_size(bytes, peer, dst)?;
        let Some(sizes) = self.registry.sizes(dst.handle) else {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "{:#x} is not a registered handle on rank {}",
                    dst.handle,
                    self.rank()
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

    /// The receive role of a zero-copy call from a network peer: a receive of the network
    /// route into this rank's registered range (checked here).
    fn zc_net_recv(&self, dst: RegisteredRange<'_>, peer: usize) -> Result<Transfer> {
        let (buf, _reg) = self.zc_target("recv_registered", dst, self.rank())?;
        Ok(Transfer {
            ptr: buf,
            bytes: dst.bytes,
            peer,
            config: None,
        })
    }

    /// Refuses a send whose message and registered range differ in size.
    fn zc_same_size(&self, bytes: u64, peer: usize, dst: RegisteredRange<'_>) -> Result<()> {
        if dst.bytes == bytes {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op: "send_registered",
            reason: format!(
                "rank {}: the message to peer {peer} is {bytes} bytes, its registered range {} \
                 bytes",
                self.rank(),
                dst.bytes
            ),
        })
    }

    /// Resolves and bounds-checks the send role.
    fn zc_send(
        &self,
        src: u64,
        bytes: u64,
        peer: usize,
        dst: RegisteredRange<'_>,
    ) -> Result<ZcRole> {
        const OP: &str = "send_registered";
        self.zc_same_size(bytes, peer, dst)?;
        let (remote, reg) = self.zc_target(OP, dst, peer)?;
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
    fn zc_recv(&self, dst: RegisteredRange<'_>, peer: usize) -> Result<ZcRole> {
        let (buf, reg) = self.zc_target("recv_registered", dst, self.rank())?;
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
    fn zc_target(
        &self,
        op: &'static str,
        dst: RegisteredRange<'_>,
        owner: usize,
    ) -> Result<(u64, u64)> {
        let bytes = dst.bytes;
        if owner >= self.world_size() {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "peer {owner} is not a rank (world size {})",
                    self.world_size()
                ),
            });
        }
        let Some(target) = self.registry.target(dst.handle, owner) else {
            if self.registry.target(dst.handle, self.rank()).is_none() {
                return Err(Error::InvalidArgument {
                    op,
                    reason: format!(
                        "{:#x} is not a registered handle on rank {}",
                        dst.handle,
                        self.rank()
                    ),
                });
            }
            return Err(Error::NoPath {
                op,
                rank: self.rank(),
                peer: owner,
                kind: self.topology().kind(owner).to_string(),
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
fn first_too_small(offset: u64, bytes: u64, sizes: &[u64]) -> Option<(usize, u64)> {
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
