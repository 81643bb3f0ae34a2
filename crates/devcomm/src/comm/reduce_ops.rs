//! The reductions on [`Comm`]: all-reduce, reduce-scatter, all-gather, in a fixed order
//! (docs/COLLECTIVES.md, "Reductions"). Every call is enqueued on the caller's stream (the
//! communicator's one stream: the same binding as send/recv), never synchronises the host,
//! and can be captured in a CUDA graph: the sequence numbers live in device counters.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

use super::{Comm, HookArgs};
use crate::collective::{Hooks, RawHooks};
use crate::error::{Error, Result};
use crate::reduce::args::{count_of, in_place_count};
use crate::reduce::launch::ReduceCall;
use crate::reduce::tuned_plan::Choice;
use crate::reduce::{Collective, DataType, ReduceOp, Reducible};

/// The type an all-gather of `T` moves, and how many of it make one `T`.
fn gather_type<T>(op: &'static str, rank: usize) -> Result<(DataType, u64)> {
    DataType::for_gather(std::mem::size_of::<T>(), std::mem::align_of::<T>())
        .map(|(t, per)| (t, per as u64))
        .ok_or_else(|| Error::InvalidArgument {
            op,
            reason: format!("rank {rank}: the element type has size 0"),
        })
}

/// `InvalidArgument` for operation `c` on `rank`, with `reason`.
pub(super) fn invalid(c: Collective, rank: usize) -> impl Fn(String) -> Error {
    move |reason| Error::InvalidArgument {
        op: c.name(),
        reason: format!("rank {rank}: {reason}"),
    }
}

impl Comm {
    /// Out-of-place all-reduce: `output[i]` = `input[i]` of rank 0 `op` rank 1 ... in rank
    /// order, on every rank. Both buffers hold the same number of elements and must not
    /// overlap.
    pub fn all_reduce<T: Reducible, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        input: &S,
        output: &mut R,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.out_of_place(
            "all_reduce",
            Collective::AllReduce,
            Some(op),
            input,
            output,
            stream,
        )
    }

    /// In-place all-reduce of `buf`.
    pub fn all_reduce_in_place<T: Reducible, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let count = buf.len() as u64;
        let (p, _r) = self.slice_ptr_mut("all_reduce_in_place", buf, stream)?;
        self.reduction(
            Collective::AllReduce,
            T::DTYPE,
            Some(op),
            (p, p, count),
            None,
            stream,
        )
    }

    /// Out-of-place reduce-scatter: `input` holds `world_size` shards of `output`'s length;
    /// rank r's `output` gets the reduction of every rank's shard r, in rank order.
    pub fn reduce_scatter<T: Reducible, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        input: &S,
        output: &mut R,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.out_of_place(
            "reduce_scatter",
            Collective::ReduceScatter,
            Some(op),
            input,
            output,
            stream,
        )
    }

    /// In-place reduce-scatter: `buf` holds `world_size` shards; the result lands in this
    /// rank's shard of `buf` (the other shards are left as they were).
    pub fn reduce_scatter_in_place<T: Reducible, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.sharded_in_place(
            "reduce_scatter_in_place",
            Collective::ReduceScatter,
            Some(op),
            buf,
            stream,
        )
    }

    /// Out-of-place all-gather: `output` (`world_size` x `input`'s length) gets every rank's
    /// `input` in rank order. A copy, so the element may be any type (a `u16`, a struct of 16
    /// bytes): it moves as the widest integer that divides its size and alignment
    /// ([`DataType::for_gather`]).
    pub fn all_gather<T: DeviceRepr, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        input: &S,
        output: &mut R,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const NAME: &str = "all_gather";
        let c = Collective::AllGather;
        let (dtype, per) = gather_type::<T>(NAME, self.rank())?;
        let count = count_of(c, self.world_size(), input.len(), output.len())
            .map_err(invalid(c, self.rank()))?;
        let (i, _s) = self.slice_ptr(NAME, input, stream)?;
        let (o, _r) = self.slice_ptr_mut(NAME, output, stream)?;
        self.reduction(
            c,
            dtype,
            None,
            (i, o, count.saturating_mul(per)),
            None,
            stream,
        )
    }

    /// In-place all-gather: this rank's shard of `buf` is its input (any element type, as
    /// [`Comm::all_gather`]).
    pub fn all_gather_in_place<T: DeviceRepr, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const NAME: &str = "all_gather_in_place";
        let c = Collective::AllGather;
        let (dtype, per) = gather_type::<T>(NAME, self.rank())?;
        let count =
            in_place_count(c, self.world_size(), buf.len()).map_err(invalid(c, self.rank()))?;
        let (p, _r) = self.slice_ptr_mut(NAME, buf, stream)?;
        self.reduction(
            c,
            dtype,
            None,
            (p, p, count.saturating_mul(per)),
            None,
            stream,
        )
    }

    /// All-reduce on raw device addresses: `count` elements of `dtype`; in place when
    /// `input == output`.
    ///
    /// # Safety
    ///
    /// `input` and `output` must be device addresses of this rank's context, valid for
    /// `count` elements (readable, and writable for `output`) until the work on `stream` is
    /// done, and nothing else may write them meanwhile.
    pub unsafe fn all_reduce_raw(
        &self,
        input: u64,
        output: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllReduce;
        self.reduction(
            c,
            dtype,
            Some(op),
            (input, output, count as u64),
            None,
            stream,
        )
    }

    /// Reduce-scatter on raw device addresses: `input` holds `world_size x out_count`
    /// elements, `output` gets `out_count`. In place when `input == output`: the result goes
    /// to this rank's shard of that buffer.
    ///
    /// # Safety
    ///
    /// As [`Comm::all_reduce_raw`], for `world_size x out_count` input elements and
    /// `out_count` output elements (in place: the one buffer of `world_size x out_count`).
    pub unsafe fn reduce_scatter_raw(
        &self,
        input: u64,
        output: u64,
        out_count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::ReduceScatter;
        self.reduction(
            c,
            dtype,
            Some(op),
            (input, output, out_count as u64),
            None,
            stream,
        )
    }

    /// All-gather on raw device addresses: `output` (`world_size x in_count` elements) gets
    /// every rank's `in_count` elements. In place when `input == output`: this rank's shard of
    /// that buffer is the input.
    ///
    /// # Safety
    ///
    /// As [`Comm::all_reduce_raw`], for `in_count` input elements and `world_size x in_count`
    /// output elements (in place: the one buffer of `world_size x in_count`).
    pub unsafe fn all_gather_raw(
        &self,
        input: u64,
        output: u64,
        in_count: usize,
        dtype: DataType,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllGather;
        self.reduction(
            c,
            dtype,
            None,
            (input, output, in_count as u64),
            None,
            stream,
        )
    }

    /// All-reduce with an epilogue hook (docs/COLLECTIVES.md, "Epilogue hooks"): `hooks` names
    /// a struct of CUDA C++ source with
    /// `using T = <element type>;` and
    /// `static __device__ void epilogue(const devcomm::red::RowCtx& c, T* row)`, called by
    /// one row group (a warp, or the hook's `kRowThreads` threads) for every row of
    /// `args.row_len` elements after the row is reduced and before it is written anywhere;
    /// what it leaves in `row` is what every rank receives (`cuda/devcomm/reduce.cuh`,
    /// "Epilogue hooks"). `args.user` is handed to it as `c.user`. The buffers hold whole
    /// rows; each rank reduces whole rows, so the hook sees whole rows. Out of place or in place
    /// (`input == output` through [`Comm::all_reduce_hooked_raw`]).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_hooked<T: Reducible, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        hooks: &Hooks<T>,
        input: &S,
        output: &mut R,
        op: ReduceOp,
        args: &HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllReduce;
        let count = count_of(c, self.world_size(), input.len(), output.len())
            .map_err(invalid(c, self.rank()))?;
        let (i, _s) = self.slice_ptr("all_reduce_hooked", input, stream)?;
        let (o, _r) = self.slice_ptr_mut("all_reduce_hooked", output, stream)?;
        // SAFETY: both addresses come from cudarc slices of `count` elements of T, which the
        // guards above keep alive and ordered on `stream`.
        unsafe {
            self.all_reduce_hooked_raw(
                hooks.raw(),
                i,
                o,
                count as usize,
                T::DTYPE,
                op,
                args,
                stream,
            )
        }
    }

    /// [`Comm::all_reduce_hooked`] in place: `buf` is reduced, hooked and overwritten (the
    /// hook's `RowCtx::dest` is then this rank's own input row).
    pub fn all_reduce_hooked_in_place<T: Reducible, R: DevicePtrMut<T>>(
        &self,
        hooks: &Hooks<T>,
        buf: &mut R,
        op: ReduceOp,
        args: &HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllReduce;
        let name = "all_reduce_hooked_in_place";
        self.hooked_in_place(name, c, hooks, buf, (op, args), stream)
    }

    /// [`Comm::all_reduce_hooked`] on raw device addresses; in place when `input == output`.
    ///
    /// # Safety
    ///
    /// As [`Comm::all_reduce_raw`]; `args.user` must stay valid until the work is done.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_hooked_raw(
        &self,
        hooks: &RawHooks,
        input: u64,
        output: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        args: &HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::AllReduce;
        self.hooked(
            c,
            dtype,
            op,
            (input, output, count as u64),
            (hooks, args),
            stream,
        )
    }

    /// Reduce-scatter with an epilogue hook (as [`Comm::all_reduce_hooked`]): the hook sees
    /// each row of this rank's reduced shard before it is written to `output`, and
    /// `RowCtx::dest` points to that row of `output` as it was before the call, so an
    /// accumulate hook (`row[j] += dest[j]`, `examples/hooks/accumulate.cu`) adds the result
    /// to what `output` held. `output`'s length must be a multiple of `args.row_len`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter_hooked<T: Reducible, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        hooks: &Hooks<T>,
        input: &S,
        output: &mut R,
        op: ReduceOp,
        args: &HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::ReduceScatter;
        let count = count_of(c, self.world_size(), input.len(), output.len())
            .map_err(invalid(c, self.rank()))?;
        let (i, _s) = self.slice_ptr("reduce_scatter_hooked", input, stream)?;
        let (o, _r) = self.slice_ptr_mut("reduce_scatter_hooked", output, stream)?;
        self.hooked(c, T::DTYPE, op, (i, o, count), (hooks.raw(), args), stream)
    }

    /// [`Comm::reduce_scatter_hooked`] in place: `buf` holds `world_size` shards; the hooked
    /// result lands in this rank's shard (the hook's `RowCtx::dest` is then that shard's row as
    /// it was: this rank's own input row), the other shards are left as they were.
    /// `buf.len() / world_size` must be a multiple of `args.row_len`.
    pub fn reduce_scatter_hooked_in_place<T: Reducible, R: DevicePtrMut<T>>(
        &self,
        hooks: &Hooks<T>,
        buf: &mut R,
        op: ReduceOp,
        args: &HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::ReduceScatter;
        let name = "reduce_scatter_hooked_in_place";
        self.hooked_in_place(name, c, hooks, buf, (op, args), stream)
    }

    /// [`Comm::reduce_scatter_hooked`] on raw device addresses (`input`: `world_size x
    /// out_count` elements); in place when `input == output`.
    ///
    /// # Safety
    ///
    /// As [`Comm::reduce_scatter_raw`]; `args.user` must stay valid until the work is done.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter_hooked_raw(
        &self,
        hooks: &RawHooks,
        input: u64,
        output: u64,
        out_count: usize,
        dtype: DataType,
        op: ReduceOp,
        args: &HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = Collective::ReduceScatter;
        self.hooked(
            c,
            dtype,
            op,
            (input, output, out_count as u64),
            (hooks, args),
            stream,
        )
    }

    /// Checks a hooked call's hooks and row length, then runs it.
    fn hooked(
        &self,
        c: Collective,
        dtype: DataType,
        op: ReduceOp,
        buffers: (u64, u64, u64),
        (hooks, args): (&RawHooks, &HookArgs),
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let size = Some(dtype.size_bytes());
        hooks.check_sizes(c.name(), size, size)?;
        let Some(row_len) = args.row_len else {
            return Err(invalid(c, self.rank())(
                "HookArgs::row_len is None: an epilogue works on rows, so their length must be \
                 given"
                    .into(),
            ));
        };
        let hook = Some((hooks, args.user, row_len.get() as u64));
        self.reduction(c, dtype, Some(op), buffers, hook, stream)
    }

    /// Checks and launches one reduction. `(input, output, count)` as the raw forms take them.
    fn reduction(
        &self,
        collective: Collective,
        dtype: DataType,
        op: Option<ReduceOp>,
        buffers: (u64, u64, u64),
        hooks: Option<(&RawHooks, u64, u64)>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.reduction_with(collective, dtype, op, buffers, hooks, None, stream)
    }

    /// [`Comm::reduction`] with `choice` in place of the tuning table's and the default plan
    /// (the tuner's candidate: an error when it cannot serve the call), or without (`None`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduction_with(
        &self,
        collective: Collective,
        dtype: DataType,
        op: Option<ReduceOp>,
        (input, output, count): (u64, u64, u64),
        hooks: Option<(&RawHooks, u64, u64)>,
        choice: Option<Choice>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        // Not `check`: a soft error of an earlier call belongs to that call's synchronise;
        // returning it here would leave the peers, which launch, to time out.
        self.group.errors.check_before_launch()?;
        let es = dtype.size_bytes() as u64;
        let r = match self.resolve_buffers(collective, (input, output, count), es) {
            Ok(r) => r,
            Err(refusal) => {
                let e = invalid(collective, self.rank())(refusal.reason);
                if refusal.a_peer_may_accept && !self.reduce.by_network() {
                    // The shard's owner may have accepted this very layout as its in-place
                    // call and launched: take part, refused, so that every rank's call fails
                    // at once (docs/PROTOCOL.md, "Refused buffers") instead of the owner
                    // waiting out the device timeout. Nothing is written.
                    self.p2p.bind(&self.group, stream)?;
                    let refused = ReduceCall {
                        collective,
                        dtype,
                        op,
                        input,
                        output: input,
                        count,
                        hooks,
                        refused: true,
                        pool: None,
                        choice: None,
                    };
                    self.reduce
                        .launch(&self.group, &self.jit, refused, stream)?;
                }
                return Err(e);
            }
        };
        if r.count == 0 {
            // Every rank passes the same count, so every rank skips alike: counters and
            // signals are untouched and the ranks stay in step.
            return Ok(());
        }
        self.p2p.bind(&self.group, stream)?;
        let pool = if !self.reduce.by_network() && self.group.config.reduce_zero_copy {
            self.pool_buffers(collective, (r.input, r.output, r.count), es)
        } else {
            None
        };
        let call = ReduceCall {
            collective,
            dtype,
            op,
            input: r.input,
            output: r.output,
            count: r.count,
            hooks,
            refused: false,
            pool: pool.as_ref(),
            choice,
        };
        self.reduce.run(&self.families(), call, stream)
    }
}

impl Comm {
    /// The typed out-of-place forms: capture readiness, the lengths checked, then the call.
    fn out_of_place<T: Reducible, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        name: &'static str,
        c: Collective,
        op: Option<ReduceOp>,
        input: &S,
        output: &mut R,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let count = count_of(c, self.world_size(), input.len(), output.len())
            .map_err(invalid(c, self.rank()))?;
        let (i, _s) = self.slice_ptr(name, input, stream)?;
        let (o, _r) = self.slice_ptr_mut(name, output, stream)?;
        self.reduction(c, T::DTYPE, op, (i, o, count), None, stream)
    }

    /// The typed in-place forms whose input is this rank's shard of `buf`.
    /// The typed hooked in-place forms: `buf` is the input and (all-reduce) the output, or
    /// holds this rank's output shard (reduce-scatter).
    fn hooked_in_place<T: Reducible, R: DevicePtrMut<T>>(
        &self,
        name: &'static str,
        c: Collective,
        hooks: &Hooks<T>,
        buf: &mut R,
        (op, args): (ReduceOp, &HookArgs),
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let count =
            in_place_count(c, self.world_size(), buf.len()).map_err(invalid(c, self.rank()))?;
        let (p, _r) = self.slice_ptr_mut(name, buf, stream)?;
        self.hooked(c, T::DTYPE, op, (p, p, count), (hooks.raw(), args), stream)
    }

    fn sharded_in_place<T: Reducible, R: DevicePtrMut<T>>(
        &self,
        name: &'static str,
        c: Collective,
        op: Option<ReduceOp>,
        buf: &mut R,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let count =
            in_place_count(c, self.world_size(), buf.len()).map_err(invalid(c, self.rank()))?;
        let (p, _r) = self.slice_ptr_mut(name, buf, stream)?;
        self.reduction(c, T::DTYPE, op, (p, p, count), None, stream)
    }
}
