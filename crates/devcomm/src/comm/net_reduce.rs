//! The reductions and the barrier of a communicator in a job with network links
//! (docs/NETWORK.md, "Reductions with network peers"). Every step that moves data is a launch
//! of the collective kernel, whose roles reach NVLink peers by loads and stores and network
//! peers through the proxy, in one launch; between them `net_step_kernel` reduces this rank's
//! chunk in rank order (the same fixed order as the NVLink kernels, so the results are
//! bitwise the same) and stages data into and out of the scratch. The caller's output is
//! written only by the local steps, which write nothing once the communicator is aborted: an
//! all-to-all step that a peer refused (another call) or that timed out leaves the output as
//! it was (the all-to-all's own-chunk role would write before it knows). Nothing synchronises with
//! the host: back-to-back calls and graph capture work as for the other collectives. The plan
//! (rounds, chunks, step codes) is pure: `reduce::net_plan`.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::Comm;
use crate::abi::reduce_launch::{NetStepKind, NetStepLaunch};
use crate::collective::{CollCall, RawHooks, MODE_DEVICE_COUNTS, MODE_UNIFORM};
use crate::cuda::DeviceBuffer;
use crate::error::{Error, Result};
use crate::group::Group;
use crate::reduce::launch::ReduceCall;
use crate::reduce::net_plan::{net_plan, step_code, NetPlan, NetStep};
use crate::reduce::plan::{Algorithm, Collective, Plan, Shape};
use crate::reduce::{DataType, ReduceOp};

/// The device memory of the reductions and barrier with network peers.
#[derive(Debug)]
pub(crate) struct NetReduce {
    /// Two halves of `half` bytes: A (staging of the caller's data, the gathered round) and B
    /// (the chunks every rank sent this one).
    scratch: DeviceBuffer,
    half: u64,
    /// `u64[world]` of 1 (the all-gather steps send one row to every rank), then `u64[world]`
    /// of 0 (every row from the same place).
    counts: DeviceBuffer,
    /// `u64[2 world]`: the all-gather steps' receive counts and offsets (written, unused).
    recv: DeviceBuffer,
    /// `2 world` bytes: the barrier's byte to every rank, and from every rank.
    barrier: DeviceBuffer,
    /// Byte-copy hooks of the all-to-alls.
    copy: RawHooks,
}

impl NetReduce {
    /// Collective: the scratch (`DEVCOMM_NET_REDUCE_SCRATCH_MIB`, which the ranks agree on) and
    /// the constant counts, on every rank.
    pub(crate) fn new(group: &Arc<Group>) -> Result<Self> {
        let world = group.world_size;
        let half = (u64::from(group.config.net_reduce_scratch_mib) << 20) / 2;
        let local = (|| {
            let ctx = &group.ctx;
            let scratch = DeviceBuffer::zeroed(ctx, 2 * half as usize)?;
            let mut counts = vec![1u64; world];
            counts.extend(std::iter::repeat_n(0u64, world));
            let counts = DeviceBuffer::from_slice(ctx, &counts)?;
            let recv = DeviceBuffer::zeroed(ctx, 2 * world * 8)?;
            let barrier = DeviceBuffer::zeroed(ctx, 2 * world)?;
            crate::cuda::synchronize(ctx)?;
            Ok(Self {
                scratch,
                half,
                counts,
                recv,
                barrier,
                copy: RawHooks::copy_of_size(1),
            })
        })()
        .map_err(|e: Error| crate::cuda::with_rank(e, group.rank));
        group.agree("network reduction scratch", local)
    }
}

/// What one all-to-all step of the network path moves: `chunk` bytes to every rank.
#[derive(Debug, Clone, Copy)]
struct Exchange {
    input: u64,
    output: u64,
    chunk: u64,
    code: u32,
}

impl Comm {
    /// The plan of a reduction of `count` elements on a communicator with network links.
    pub(super) fn net_reduction_plan(
        &self,
        nr: &NetReduce,
        shape: &Shape,
    ) -> std::result::Result<NetPlan, String> {
        net_plan(shape, self.reduce.limits(), nr.half)
    }

    /// [`Plan`] of a network-path call, as `Comm::reduction_plan` reports it.
    pub(super) fn net_plan_summary(&self, p: &NetPlan, es: u64) -> Plan {
        Plan {
            algorithm: Algorithm::Network,
            blocks: crate::reduce::net_plan::step_blocks(p.max_chunk * es, self.reduce.sm_count()),
            shard: p.max_chunk,
            chunk: p.max_chunk,
            rounds: p.rounds,
            unit: p.unit,
            pushed: false,
        }
    }

    /// One reduction with network peers (its buffers resolved and checked, `count` > 0, the
    /// stream bound).
    pub(super) fn net_reduction(
        &self,
        nr: &NetReduce,
        call: ReduceCall<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let c = call.collective;
        let dtype = call.dtype;
        let es = dtype.size_bytes() as u64;
        let (me, w) = (self.rank() as u64, self.world_size() as u64);
        let shape = Shape {
            collective: c,
            count: call.count,
            elem_bytes: es,
            world: self.world_size(),
            row_len: call.hooks.map(|(_, _, row)| row),
        };
        let plan =
            self.net_reduction_plan(nr, &shape)
                .map_err(|reason| Error::InvalidArgument {
                    op: c.name(),
                    reason: format!("rank {me}: {reason}"),
                })?;
        let op = call.op.unwrap_or(ReduceOp::Sum);
        let hooked = call.hooks.is_some();
        let scatter = step_code(NetStep::Scatter(c, op), Some(dtype), hooked);
        let gather = step_code(NetStep::Gather(c), Some(dtype), hooked);
        let (a, b) = (nr.scratch.ptr(), nr.scratch.ptr() + nr.half);
        let (input, output, n) = (call.input, call.output, call.count);
        let at = |base: u64, i: u64| base + i * es;
        for k in 0..plan.rounds {
            let r = plan.round(k);
            match c {
                Collective::AllReduce => {
                    let s = r.chunk;
                    let src = if r.direct {
                        at(input, r.base)
                    } else {
                        self.net_copy(dtype, (at(input, r.base), 0), (a, 0), 1, r.len, stream)?;
                        a
                    };
                    let x = Exchange {
                        input: src,
                        output: b,
                        chunk: s * es,
                        code: scatter,
                    };
                    self.net_exchange(nr, c.name(), x, false, stream)?;
                    let mine = at(b, me * s);
                    let first = r.base + me * s;
                    self.net_reduce_step(
                        call,
                        NetStepLaunch {
                            input: b,
                            output: mine,
                            in_stride: s,
                            count: r.valid(c, me),
                            dest: at(output, first),
                            row0: first,
                            step: NetStepKind::Reduce as u32,
                            ..Default::default()
                        },
                        stream,
                    )?;
                    let x = Exchange {
                        input: mine,
                        output: a,
                        chunk: s * es,
                        code: gather,
                    };
                    self.net_exchange(nr, c.name(), x, true, stream)?;
                    self.net_copy(dtype, (a, 0), (at(output, r.base), 0), 1, r.len, stream)?;
                }
                Collective::ReduceScatter => {
                    let src = if r.direct {
                        input
                    } else {
                        let from = (at(input, r.base), n);
                        self.net_copy(dtype, from, (a, r.len), w, r.len, stream)?;
                        a
                    };
                    let x = Exchange {
                        input: src,
                        output: b,
                        chunk: r.len * es,
                        code: scatter,
                    };
                    self.net_exchange(nr, c.name(), x, false, stream)?;
                    // Hooked, the rows are reduced in place in the scratch, hooked, then copied
                    // to the output (whose old rows the hook sees as `dest`).
                    let (to, step) = match hooked {
                        true => (at(b, me * r.len), NetStepKind::ReduceToDest),
                        false => (at(output, r.base), NetStepKind::Reduce),
                    };
                    self.net_reduce_step(
                        call,
                        NetStepLaunch {
                            input: b,
                            output: to,
                            in_stride: r.len,
                            count: r.len,
                            dest: at(output, r.base),
                            row0: r.base,
                            step: step as u32,
                            ..Default::default()
                        },
                        stream,
                    )?;
                }
                Collective::AllGather => {
                    let x = Exchange {
                        input: at(input, r.base),
                        output: a,
                        chunk: r.len * es,
                        code: gather,
                    };
                    self.net_exchange(nr, c.name(), x, true, stream)?;
                    let to = (at(output, r.base), n);
                    self.net_copy(dtype, (a, r.len), to, w, r.len, stream)?;
                }
            }
        }
        Ok(())
    }

    /// `Comm::barrier` with network peers: an all-to-all of one byte per rank (a rank's
    /// receive roles end only once every rank has started the call, after its earlier work).
    pub(super) fn net_barrier(&self, nr: &NetReduce, stream: &Arc<CudaStream>) -> Result<()> {
        self.p2p.bind(&self.group, stream)?;
        let w = self.world_size() as u64;
        let x = Exchange {
            input: nr.barrier.ptr(),
            output: nr.barrier.ptr() + w,
            chunk: 1,
            code: step_code(NetStep::Barrier, None, false),
        };
        self.net_exchange(nr, "barrier", x, false, stream)
    }

    /// One all-to-all step of `op`: `x.chunk` bytes to every rank, from consecutive chunks of
    /// `x.input` (`gather`: the same chunk to every rank, an all-to-all-v of one row from offset
    /// 0), into consecutive chunks of `x.output`.
    fn net_exchange(
        &self,
        nr: &NetReduce,
        op: &'static str,
        x: Exchange,
        gather: bool,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let w = self.world_size() as u64;
        let counts = nr.counts.ptr();
        let recv = nr.recv.ptr();
        let call = CollCall {
            op,
            input: x.input,
            output: x.output,
            in_elems: if gather { x.chunk } else { w * x.chunk },
            out_elems: w * x.chunk,
            row_len: x.chunk,
            rows: u64::from(!gather),
            send_counts: if gather { counts } else { 0 },
            send_offsets: if gather { counts + 8 * w } else { 0 },
            recv_counts: if gather { recv } else { 0 },
            recv_offsets: if gather { recv + 8 * w } else { 0 },
            user: 0,
            mode: if gather {
                MODE_DEVICE_COUNTS
            } else {
                MODE_UNIFORM
            },
            peer_rows: [[0; 32]; 2],
            code: x.code,
        };
        self.launch_collective(&nr.copy, call, stream)
    }

    /// Copies `pieces` pieces of `count` elements of `dtype` from `(address, stride)` to
    /// `(address, stride)` (strides in elements).
    #[allow(clippy::too_many_arguments)]
    fn net_copy(
        &self,
        dtype: DataType,
        (from, in_stride): (u64, u64),
        (to, out_stride): (u64, u64),
        pieces: u64,
        count: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let args = NetStepLaunch {
            input: from,
            output: to,
            in_stride,
            out_stride,
            count,
            unit: (16 / dtype.size_bytes() as u64).max(1),
            errors: self.group.errors.device_ptr(),
            pieces: pieces as u32,
            step: NetStepKind::Copy as u32,
            rank: self.rank() as i32,
            world: self.world_size() as i32,
            ..Default::default()
        };
        self.reduce.launch_net_step(
            &self.group,
            &self.jit,
            dtype,
            ReduceOp::Sum,
            None,
            &args,
            stream,
        )
    }

    /// The local reduction of every rank's copy of this rank's chunk, in rank order (`step`'s
    /// buffers, count and hook placement filled in by the caller).
    fn net_reduce_step(
        &self,
        call: ReduceCall<'_>,
        step: NetStepLaunch,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let es = call.dtype.size_bytes() as u64;
        let (hooks, user, row_len) = match call.hooks {
            Some((h, user, row)) => (Some(h), user, row),
            None => (None, 0, 0),
        };
        let args = NetStepLaunch {
            unit: if row_len > 0 {
                row_len
            } else {
                (16 / es).max(1)
            },
            user,
            row_len,
            row0: step.row0.checked_div(row_len).unwrap_or(0),
            errors: self.group.errors.device_ptr(),
            pieces: self.world_size() as u32,
            rank: self.rank() as i32,
            world: self.world_size() as i32,
            ..step
        };
        self.reduce.launch_net_step(
            &self.group,
            &self.jit,
            call.dtype,
            call.op.unwrap_or(ReduceOp::Sum),
            hooks,
            &args,
            stream,
        )
    }
}
