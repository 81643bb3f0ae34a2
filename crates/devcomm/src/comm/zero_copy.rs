//! Zero-copy send/recv: the sender writes straight into the receiver's registered buffer
//! (docs/PROTOCOL.md, "Zero-copy").

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DeviceRepr};

use super::{Comm, RegisteredRange};
use crate::error::{Error, Result};
use crate::p2p::registered::{first_too_small, zc_recv, zc_send, zc_target, RegCtx};
use crate::p2p::{zero_copy_route, ZcRoute};

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
        let src = (ptr, buf.num_bytes() as u64);
        self.p2p
            .send_registered(self.reg_cx(), src, peer, dst.plain(), stream)
    }

    /// Receives `dst.bytes` from `peer` into this rank's buffer of `dst`'s registration at
    /// `dst.offset`. When the call's work on `stream` completes, the data is there.
    pub fn recv_registered(
        &self,
        dst: RegisteredRange<'_>,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.p2p
            .recv_registered(self.reg_cx(), dst.plain(), peer, stream)
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
        self.p2p.sendrecv_registered(
            self.reg_cx(),
            (ptr, bytes, send_peer, send_dst.plain()),
            (recv_dst.plain(), recv_peer),
            stream,
        )
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
        let (own, _) = zc_target(self.reg_cx(), OP, recv.plain(), rank)?;
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
                let cx = self.reg_cx();
                let send = zc_send(cx, src + to as u64 * chunk, chunk, to, at(rank).plain())?;
                let recv = zc_recv(cx, at(from).plain(), from)?;
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

    /// What the send/recv family's registered calls need from the communicator.
    fn reg_cx(&self) -> RegCtx<'_> {
        RegCtx {
            group: &self.group,
            jit: &self.jit,
            registry: &self.registry,
        }
    }
}
