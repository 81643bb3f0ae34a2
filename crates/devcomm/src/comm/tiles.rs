//! Hooked send/recv of [`Comm`] (`send_hooked`, `recv_hooked`, `sendrecv_hooked`).

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

use super::collectives::elems;
use super::{Comm, HookArgs};
use crate::collective::{CollCall, Hooks, RawHooks, MODE_PEER_ROWS};
use crate::error::{Error, Result};

/// One side of a hooked point-to-point transfer: device address, elements, peer.
type TileSide = Option<(u64, u64, usize)>;

/// Hooked send/recv (`send_hooked`, `recv_hooked`): level 2 of the framework, for users who
/// keep their own schedule. The same kernel and hooks as the collectives; a step of the
/// user's schedule is one call, and calls on one stream run in order.
impl Comm {
    /// Sends `buf` to `peer` through `hooks.produce`; the peer posts a matching
    /// [`Comm::recv_hooked`] (or [`Comm::sendrecv_hooked`]) of the same element count.
    pub fn send_hooked<I: DeviceRepr, O, S: DevicePtr<I>>(
        &self,
        hooks: &Hooks<I, O>,
        buf: &S,
        peer: usize,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let n = elems::<I>(buf.num_bytes());
        let (ptr, _s) = self.slice_ptr("send_hooked", buf, stream)?;
        self.tiles(hooks.raw(), Some((ptr, n, peer)), None, args, stream)
    }

    /// Receives from `peer` into `buf` through `hooks.consume`.
    pub fn recv_hooked<I, O: DeviceRepr, R: DevicePtrMut<O>>(
        &self,
        hooks: &Hooks<I, O>,
        buf: &mut R,
        peer: usize,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let n = elems::<O>(buf.num_bytes());
        let (ptr, _r) = self.slice_ptr_mut("recv_hooked", buf, stream)?;
        self.tiles(hooks.raw(), None, Some((ptr, n, peer)), args, stream)
    }

    /// Sends `send` to `send_peer` and receives `recv` from `recv_peer` in one kernel, through
    /// the hooks (the peers may differ: rings and other schedules).
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv_hooked<I: DeviceRepr, O: DeviceRepr, S: DevicePtr<I>, R: DevicePtrMut<O>>(
        &self,
        hooks: &Hooks<I, O>,
        send: &S,
        send_peer: usize,
        recv: &mut R,
        recv_peer: usize,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (ns, nr) = (elems::<I>(send.num_bytes()), elems::<O>(recv.num_bytes()));
        let (sp, _s) = self.slice_ptr("sendrecv_hooked", send, stream)?;
        let (rp, _r) = self.slice_ptr_mut("sendrecv_hooked", recv, stream)?;
        self.tiles(
            hooks.raw(),
            Some((sp, ns, send_peer)),
            Some((rp, nr, recv_peer)),
            args,
            stream,
        )
    }

    fn tiles(
        &self,
        hooks: &RawHooks,
        send: TileSide,
        recv: TileSide,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const OP: &str = "sendrecv_hooked";
        let world = self.world_size();
        let mut peer_rows = [[0u64; 32]; 2];
        let mut call = CollCall {
            op: OP,
            input: 0,
            output: 0,
            in_elems: 0,
            out_elems: 0,
            row_len: 1,
            rows: 0,
            send_counts: 0,
            send_offsets: 0,
            recv_counts: 0,
            recv_offsets: 0,
            user: args.user,
            mode: MODE_PEER_ROWS,
            peer_rows,
            code: 0,
        };
        for (side, t) in [send, recv].into_iter().enumerate() {
            let Some((ptr, n, peer)) = t else { continue };
            if peer >= world || peer == self.rank() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "peer {peer} is not another rank (rank {}, world size {world})",
                        self.rank()
                    ),
                });
            }
            let row_len = args.cols();
            if n % row_len != 0 {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!("row length {row_len} does not divide {n} elements"),
                });
            }
            call.row_len = row_len;
            peer_rows[side][peer] = n / row_len;
            if side == 0 {
                (call.input, call.in_elems) = (ptr, n);
            } else {
                (call.output, call.out_elems) = (ptr, n);
            }
        }
        call.peer_rows = peer_rows;
        if peer_rows.iter().flatten().all(|&r| r == 0) {
            return Ok(()); // nothing to move
        }
        self.launch_collective(hooks, call, stream)
    }
}
