//! Collectives of [`Comm`] on the send/recv protocol, with hooks (docs/COLLECTIVES.md):
//! all-to-all(-v).

use std::num::NonZeroUsize;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

use super::Comm;
use crate::collective::{
    first_written_overlap, AllToAllVCounts, Buf, CollCall, Hooks, RawHooks, MODE_DEVICE_COUNTS,
    MODE_UNIFORM,
};
use crate::error::{Error, Result};

/// Extra arguments of a hooked collective.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HookArgs {
    /// Device address of the user arguments the hooks see as `ctx.user` (0: none). It must stay
    /// valid until the collective's work on the stream has finished.
    pub user: u64,
    /// Elements per row (`ctx.cols`), the same meaning in every hooked call: a peer's chunk
    /// (all-to-all), a message (`send_hooked` family) or the result (reductions' epilogue) is
    /// cut into rows of this many elements, and all-to-all-v counts rows of it. `None`: rows
    /// of one element, except for an epilogue, which works on rows and refuses `None`.
    /// `NonZeroUsize::new(n)` gives `None` for 0.
    pub row_len: Option<NonZeroUsize>,
}

impl HookArgs {
    /// Arguments with rows of `row_len` elements (0: `None`, rows of one element) and no
    /// user arguments.
    pub fn rows(row_len: usize) -> Self {
        Self {
            user: 0,
            row_len: NonZeroUsize::new(row_len),
        }
    }

    /// The same arguments with `user` as `ctx.user`.
    pub fn with_user(self, user: u64) -> Self {
        Self { user, ..self }
    }

    /// Elements per row as the kernels take it (`None`: 1).
    pub(crate) fn cols(&self) -> u64 {
        self.row_len.map_or(1, |n| n.get() as u64)
    }
}

/// A row length that a call needs explicitly (counts are in rows of it): 0 is refused.
pub(super) fn nonzero_rows(op: &'static str, row_len: usize) -> Result<usize> {
    if row_len == 0 {
        return Err(Error::InvalidArgument {
            op,
            reason: "row_len is 0: counts are in rows of row_len elements (at least 1)".into(),
        });
    }
    Ok(row_len)
}

pub(super) fn elems<T>(bytes: usize) -> u64 {
    (bytes / std::mem::size_of::<T>().max(1)) as u64
}

/// Collectives on the send/recv protocol, with hooks (docs/COLLECTIVES.md).
impl Comm {
    /// Launches one call of the collective kernel, network peers' roles through this
    /// communicator's network staging (docs/NETWORK.md).
    pub(super) fn launch_collective(
        &self,
        hooks: &RawHooks,
        call: CollCall,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (in_size, out_size) = hooks.elem_sizes();
        let counts = self.world_size() as u64 * 8;
        let bufs = [
            Buf {
                name: "send",
                ptr: call.input,
                bytes: call.in_elems.saturating_mul(in_size as u64),
                written: false,
            },
            Buf {
                name: "recv",
                ptr: call.output,
                bytes: call.out_elems.saturating_mul(out_size as u64),
                written: true,
            },
            Buf {
                name: "send_counts",
                ptr: call.send_counts,
                bytes: counts,
                written: false,
            },
            Buf {
                name: "send_offsets",
                ptr: call.send_offsets,
                bytes: counts,
                written: false,
            },
            Buf {
                name: "recv_counts",
                ptr: call.recv_counts,
                bytes: counts,
                written: true,
            },
            Buf {
                name: "recv_offsets",
                ptr: call.recv_offsets,
                bytes: counts,
                written: true,
            },
        ];
        if let Some(reason) = first_written_overlap(&bufs) {
            return Err(Error::InvalidArgument {
                op: call.op,
                reason: format!("rank {}: {reason}", self.rank()),
            });
        }
        let net = self.p2p.coll_net_args();
        self.coll
            .launch(&self.group, &self.jit, &self.p2p, net, hooks, call, stream)
    }

    /// All-to-all: `send` holds `world_size` equal chunks, chunk `p` for rank `p` (itself
    /// included); `recv` gets rank `p`'s chunk for this rank at chunk `p`. One fused kernel.
    pub fn all_to_all<T: DeviceRepr, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let hooks = Hooks::<T>::copy();
        self.all_to_all_hooked(&hooks, send, recv, HookArgs::default(), stream)
    }

    /// All-to-all through the user's hooks: `produce` runs on the sender for every tile of a
    /// chunk, `consume` on the receiver. `send` and `recv` hold `world_size` chunks of the same
    /// element count (of `I` and `O`).
    pub fn all_to_all_hooked<I: DeviceRepr, O: DeviceRepr, S: DevicePtr<I>, R: DevicePtrMut<O>>(
        &self,
        hooks: &Hooks<I, O>,
        send: &S,
        recv: &mut R,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (in_elems, out_elems) = (elems::<I>(send.num_bytes()), elems::<O>(recv.num_bytes()));
        let (input, _s) = self.slice_ptr("all_to_all_hooked", send, stream)?;
        let (output, _r) = self.slice_ptr_mut("all_to_all_hooked", recv, stream)?;
        self.all_to_all_at(
            hooks.raw(),
            (input, in_elems),
            (output, out_elems),
            args,
            stream,
        )
    }

    /// The all-to-all of [`Comm::all_to_all_hooked`] on device addresses and element counts
    /// (the hooks' element sizes already checked).
    pub(super) fn all_to_all_at(
        &self,
        hooks: &RawHooks,
        (input, in_elems): (u64, u64),
        (output, out_elems): (u64, u64),
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const OP: &str = "all_to_all";
        let world = self.world_size() as u64;
        if in_elems % world != 0 || out_elems % world != 0 || in_elems != out_elems {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "send holds {in_elems} and recv {out_elems} elements; both must be world size \
                     {world} x the same chunk"
                ),
            });
        }
        let n = in_elems / world;
        if n == 0 {
            return Ok(());
        }
        let row_len = args.cols();
        if n % row_len != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("row length {row_len} does not divide the chunk of {n} elements"),
            });
        }
        let call = CollCall {
            op: OP,
            input,
            output,
            in_elems,
            out_elems,
            row_len,
            rows: n / row_len,
            send_counts: 0,
            send_offsets: 0,
            recv_counts: 0,
            recv_offsets: 0,
            user: args.user,
            mode: MODE_UNIFORM,
            peer_rows: [[0; 32]; 2],
            code: 0,
        };
        self.launch_collective(hooks, call, stream)
    }

    /// All-to-all-v with counts on the GPU: rank `p` gets `counts.send_counts[p]` rows of
    /// `row_len` (at least 1) elements (from `counts.send_offsets[p]`, or packed in rank order). The kernel
    /// exchanges the counts itself and writes `counts.recv_counts` and `counts.recv_offsets`
    /// (data from rank `p` lands packed in rank order): no host synchronisation, so the call
    /// can be captured in a CUDA graph. Counts that would overrun `recv` (or read past `send`)
    /// are caught on the GPU: nothing is written out of bounds and the next check returns
    /// [`Error::CountOverflow`].
    pub fn all_to_all_v<T: DeviceRepr, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &mut AllToAllVCounts,
        row_len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let hooks = Hooks::<T>::copy();
        let args = HookArgs::rows(nonzero_rows("all_to_all_v", row_len)?);
        self.all_to_all_v_hooked(&hooks, send, recv, counts, args, stream)
    }

    /// [`Comm::all_to_all_v`] through the user's hooks.
    pub fn all_to_all_v_hooked<
        I: DeviceRepr,
        O: DeviceRepr,
        S: DevicePtr<I>,
        R: DevicePtrMut<O>,
    >(
        &self,
        hooks: &Hooks<I, O>,
        send: &S,
        recv: &mut R,
        counts: &mut AllToAllVCounts,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const OP: &str = "all_to_all_v";
        let world = self.world_size();
        let short = [
            ("send_counts", counts.send_counts.len()),
            ("recv_counts", counts.recv_counts.len()),
            ("recv_offsets", counts.recv_offsets.len()),
            (
                "send_offsets",
                counts.send_offsets.as_ref().map_or(world, |s| s.len()),
            ),
        ]
        .into_iter()
        .find(|(_, len)| *len < world);
        if let Some((name, len)) = short {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("{name} holds {len} entries; world size {world} are needed"),
            });
        }
        let row_len = args.cols();
        let (in_elems, out_elems) = (elems::<I>(send.num_bytes()), elems::<O>(recv.num_bytes()));
        let (input, _s) = self.slice_ptr("all_to_all_v_hooked", send, stream)?;
        let (output, _r) = self.slice_ptr_mut("all_to_all_v_hooked", recv, stream)?;
        let (send_counts, _a) =
            self.slice_ptr("all_to_all_v_hooked", &counts.send_counts, stream)?;
        let send_offsets = match &counts.send_offsets {
            Some(o) => self.slice_ptr("all_to_all_v_hooked", o, stream)?.0,
            None => 0,
        };
        let (recv_counts, _c) =
            self.slice_ptr_mut("all_to_all_v_hooked", &mut counts.recv_counts, stream)?;
        let (recv_offsets, _d) =
            self.slice_ptr_mut("all_to_all_v_hooked", &mut counts.recv_offsets, stream)?;
        let call = CollCall {
            op: OP,
            input,
            output,
            in_elems,
            out_elems,
            row_len,
            rows: 0,
            send_counts,
            send_offsets,
            recv_counts,
            recv_offsets,
            user: args.user,
            mode: MODE_DEVICE_COUNTS,
            peer_rows: [[0; 32]; 2],
            code: 0,
        };
        self.launch_collective(hooks.raw(), call, stream)
    }
}
