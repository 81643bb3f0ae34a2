//! Zero-copy send/recv: the sender writes straight into the receiver's registered buffer
//! (docs/PROTOCOL.md, "Zero-copy").

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DeviceRepr};

use super::Comm;
use crate::error::{Error, Result};
use crate::p2p::ZcRole;

/// A place inside a registered buffer: where a zero-copy message lands.
///
/// `handle` is what [`Comm::register`] returned on *this* rank. Registration is collective, so
/// the same registration names one buffer on every rank: a sender's range addresses the
/// receiver's buffer of that registration, a receiver's range its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisteredRange {
    /// This rank's handle of the registration.
    pub handle: u64,
    /// Byte offset into the registered buffer.
    pub offset: u64,
}

impl RegisteredRange {
    /// The range starting at `offset` bytes into registration `handle`.
    pub fn new(handle: u64, offset: u64) -> Self {
        Self { handle, offset }
    }
}

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
impl Comm {
    /// Sends `buf` to `peer`, straight into `peer`'s buffer of the registration `dst.handle`
    /// at `dst.offset`. The peer must post a matching [`Comm::recv_registered`] (or
    /// [`Comm::sendrecv_registered`]). A range beyond the peer's registered size is refused
    /// before launch.
    pub fn send_registered<T: DeviceRepr, S: DevicePtr<T>>(
        &self,
        buf: &S,
        peer: usize,
        dst: RegisteredRange,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (ptr, _sync) = buf.device_ptr(stream);
        let send = self.zc_send(ptr, buf.num_bytes() as u64, peer, dst)?;
        self.p2p
            .launch_zero_copy(&self.group, &self.jit, Some(send), None, stream)
    }

    /// Receives `bytes` from `peer` into this rank's registered buffer `dst.handle` at
    /// `dst.offset`. When the call's work on `stream` completes, the data is there.
    pub fn recv_registered(
        &self,
        dst: RegisteredRange,
        bytes: u64,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let recv = self.zc_recv(dst, bytes, peer)?;
        self.p2p
            .launch_zero_copy(&self.group, &self.jit, None, Some(recv), stream)
    }

    /// Both at once, in one kernel: sends `buf` into `send_peer`'s registered `send_dst` and
    /// receives `recv_bytes` from `recv_peer` into this rank's `recv_dst`. The peers may be the
    /// same (an exchange) or differ (a ring step).
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv_registered<T: DeviceRepr, S: DevicePtr<T>>(
        &self,
        buf: &S,
        send_peer: usize,
        send_dst: RegisteredRange,
        recv_dst: RegisteredRange,
        recv_bytes: u64,
        recv_peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (ptr, _sync) = buf.device_ptr(stream);
        let send = self.zc_send(ptr, buf.num_bytes() as u64, send_peer, send_dst)?;
        let recv = self.zc_recv(recv_dst, recv_bytes, recv_peer)?;
        self.p2p
            .launch_zero_copy(&self.group, &self.jit, Some(send), Some(recv), stream)
    }

    /// Resolves and bounds-checks the send role.
    fn zc_send(&self, src: u64, bytes: u64, peer: usize, dst: RegisteredRange) -> Result<ZcRole> {
        let (remote, reg) = self.zc_target("send_registered", dst, bytes, peer)?;
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
    fn zc_recv(&self, dst: RegisteredRange, bytes: u64, peer: usize) -> Result<ZcRole> {
        let (buf, reg) = self.zc_target("recv_registered", dst, bytes, self.rank())?;
        Ok(ZcRole {
            buf,
            bytes,
            peer,
            reg,
            offset: dst.offset,
            remote: 0,
        })
    }

    /// `owner`'s buffer of `dst`'s registration as mapped here, plus `dst.offset`, and the
    /// registration id, after checking that `bytes` fit.
    fn zc_target(
        &self,
        op: &'static str,
        dst: RegisteredRange,
        bytes: u64,
        owner: usize,
    ) -> Result<(u64, u64)> {
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
