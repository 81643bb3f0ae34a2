//! Send/recv methods of [`Comm`] and the send/recv settings it exposes.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

use super::Comm;
use crate::error::Result;
use crate::p2p::Transfer;

/// Send/recv. A call whose peers are network peers (link kind `Net`) goes through the network
/// route (docs/NETWORK.md, "Send/recv over the network"); one launch may not mix an NVLink and
/// a network peer.
impl Comm {
    /// Sends `buf` to `peer` on `stream`. The peer must post a [`Comm::recv`] (or a
    /// [`Comm::sendrecv`] receiving from this rank) of the same size. A send and a recv between
    /// the same two ranks in opposite directions must be one [`Comm::sendrecv`]: as two calls
    /// on one stream each would wait for the other (and time out).
    pub fn send<T: DeviceRepr, S: DevicePtr<T>>(
        &self,
        buf: &S,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (ptr, _sync) = self.slice_ptr("send", buf, stream)?;
        let t = Transfer {
            ptr,
            bytes: buf.num_bytes() as u64,
            peer,
            config: None,
        };
        self.sendrecv_routed(Some(t), None, stream)
    }

    /// Receives from `peer` into `buf` on `stream`; the message must be `buf`'s size.
    pub fn recv<T: DeviceRepr, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let bytes = buf.num_bytes() as u64;
        let (ptr, _sync) = self.slice_ptr_mut("recv", buf, stream)?;
        let t = Transfer {
            ptr,
            bytes,
            peer,
            config: None,
        };
        self.sendrecv_routed(None, Some(t), stream)
    }

    /// Sends `send_buf` to `send_peer` and receives `recv_buf` from `recv_peer` in one kernel.
    /// The peers may be the same (both directions at once) or differ (ring schedules).
    pub fn sendrecv<T: DeviceRepr, U: DeviceRepr, S: DevicePtr<T>, R: DevicePtrMut<U>>(
        &self,
        send_buf: &S,
        send_peer: usize,
        recv_buf: &mut R,
        recv_peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (sp, _s) = self.slice_ptr("sendrecv", send_buf, stream)?;
        let bytes = recv_buf.num_bytes() as u64;
        let (rp, _r) = self.slice_ptr_mut("sendrecv", recv_buf, stream)?;
        let send = Transfer {
            ptr: sp,
            bytes: send_buf.num_bytes() as u64,
            peer: send_peer,
            config: None,
        };
        let recv = Transfer {
            ptr: rp,
            bytes,
            peer: recv_peer,
            config: None,
        };
        self.sendrecv_routed(Some(send), Some(recv), stream)
    }

    /// Refuses, on this rank before anything is launched, a call whose receive buffer
    /// overlaps its send buffer: the peer's data would land while this rank still reads its
    /// own, and the result would depend on timing (`collective::first_written_overlap`).
    pub(super) fn refuse_overlap(
        &self,
        op: &'static str,
        send: Option<(u64, u64)>,
        recv: Option<(u64, u64)>,
    ) -> Result<()> {
        let (Some((sp, sb)), Some((rp, rb))) = (send, recv) else {
            return Ok(());
        };
        let bufs = [
            crate::collective::Buf {
                name: "send",
                ptr: sp,
                bytes: sb,
                written: false,
            },
            crate::collective::Buf {
                name: "recv",
                ptr: rp,
                bytes: rb,
                written: true,
            },
        ];
        match crate::collective::first_written_overlap(&bufs) {
            Some(reason) => Err(crate::Error::InvalidArgument {
                op,
                reason: format!("rank {}: {reason}", self.rank()),
            }),
            None => Ok(()),
        }
    }

    /// Send/recv on raw device addresses with optional explicit launch knobs: either
    /// direction may be absent. The knobs choose NVLink protocols; a call with network peers
    /// takes the network route (docs/NETWORK.md) and does not use them.
    ///
    /// # Safety
    ///
    /// Each `Transfer::ptr` must be a device address of this rank's context valid for
    /// `Transfer::bytes` bytes (readable for `send`, writable for `recv`) until the work on
    /// `stream` completes, and nothing else may write a recv buffer meanwhile.
    pub unsafe fn sendrecv_raw(
        &self,
        send: Option<Transfer>,
        recv: Option<Transfer>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.sendrecv_routed(send, recv, stream)
    }

    /// The settings this communicator was built with (docs/CONFIG.md).
    pub fn config(&self) -> &crate::Config {
        &self.group.config
    }
}

impl Comm {
    /// Send/recv through the send/recv family's route ([`crate::p2p::P2P::sendrecv`]: NVLink,
    /// network, or both side by side), once the two roles' buffers are known not to overlap.
    pub(super) fn sendrecv_routed(
        &self,
        send: Option<Transfer>,
        recv: Option<Transfer>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.refuse_overlap(
            "sendrecv",
            send.map(|t| (t.ptr, t.bytes)),
            recv.map(|t| (t.ptr, t.bytes)),
        )?;
        self.p2p
            .sendrecv(&self.group, &self.jit, send, recv, stream)
    }
}
