//! The reductions' and the barrier's network algorithm, in a job with network links
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

use super::launch::{Reduce, ReduceCall};
use super::net_plan::{net_plan, step_code, NetPlan, NetStep};
use super::plan::{Algorithm, Collective, Plan, ReduceLimits, Shape};
use super::{DataType, ReduceOp};
use crate::abi::net::NetP2PLaunch;
use crate::abi::reduce_launch::{NetStepKind, NetStepLaunch};
use crate::collective::{
    CollCall, Collective as CollectiveFamily, RawHooks, MODE_DEVICE_COUNTS, MODE_UNIFORM,
};
use crate::cuda::DeviceBuffer;
use crate::error::{Error, Result};
use crate::group::Group;
use crate::jit::Jit;
use crate::p2p::P2P;

/// What the network algorithm launches through: the collective kernel (with the network
/// transport's arguments) for the all-to-all steps, the reductions' local steps.
#[derive(Clone, Copy)]
pub(crate) struct NetCtx<'a> {
    pub(crate) group: &'a Group,
    pub(crate) jit: &'a Jit,
    pub(crate) p2p: &'a P2P,
    pub(crate) coll: &'a CollectiveFamily,
    /// The network transport's arguments of the collective kernel (`None`: the job has no
    /// network links, and the NVLink kernels serve every call).
    pub(crate) net: Option<NetP2PLaunch>,
}

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

impl NetReduce {
    /// The plan of a reduction of `shape` with network links.
    pub(crate) fn plan(
        &self,
        shape: &Shape,
        limits: &ReduceLimits,
    ) -> std::result::Result<NetPlan, String> {
        net_plan(shape, limits, self.half)
    }

    /// [`Plan`] of a network-path call, as the plan queries report it.
    pub(crate) fn summary(p: &NetPlan, es: u64, sm_count: u32) -> Plan {
        Plan {
            algorithm: Algorithm::Network,
            blocks: super::net_plan::step_blocks(p.max_chunk * es, sm_count),
            shard: p.max_chunk,
            chunk: p.max_chunk,
            rounds: p.rounds,
            unit: p.unit,
            pushed: false,
        }
    }

    /// One reduction with network peers (its buffers resolved and checked, `count` > 0, the
    /// stream bound); `reduce` launches the local steps.
    pub(crate) fn run(
        &self,
        cx: &NetCtx<'_>,
        reduce: &Reduce,
        call: ReduceCall<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let nr = self;
        let c = call.collective;
        let dtype = call.dtype;
        let es = dtype.size_bytes() as u64;
        let (me, w) = (cx.group.rank as u64, cx.group.world_size as u64);
        let shape = Shape {
            collective: c,
            count: call.count,
            elem_bytes: es,
            world: cx.group.world_size,
            row_len: call.hooks.map(|(_, _, row)| row),
        };
        let plan = self
            .plan(&shape, reduce.limits())
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
                        copy_step(
                            cx,
                            reduce,
                            dtype,
                            (at(input, r.base), 0),
                            (a, 0),
                            1,
                            r.len,
                            stream,
                        )?;
                        a
                    };
                    let x = Exchange {
                        input: src,
                        output: b,
                        chunk: s * es,
                        code: scatter,
                    };
                    nr.exchange(cx, c.name(), x, false, stream)?;
                    let mine = at(b, me * s);
                    let first = r.base + me * s;
                    reduce_step(
                        cx,
                        reduce,
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
                    nr.exchange(cx, c.name(), x, true, stream)?;
                    copy_step(
                        cx,
                        reduce,
                        dtype,
                        (a, 0),
                        (at(output, r.base), 0),
                        1,
                        r.len,
                        stream,
                    )?;
                }
                Collective::ReduceScatter => {
                    let src = if r.direct {
                        input
                    } else {
                        let from = (at(input, r.base), n);
                        copy_step(cx, reduce, dtype, from, (a, r.len), w, r.len, stream)?;
                        a
                    };
                    let x = Exchange {
                        input: src,
                        output: b,
                        chunk: r.len * es,
                        code: scatter,
                    };
                    nr.exchange(cx, c.name(), x, false, stream)?;
                    // Hooked, the rows are reduced in place in the scratch, hooked, then copied
                    // to the output (whose old rows the hook sees as `dest`).
                    let (to, step) = match hooked {
                        true => (at(b, me * r.len), NetStepKind::ReduceToDest),
                        false => (at(output, r.base), NetStepKind::Reduce),
                    };
                    reduce_step(
                        cx,
                        reduce,
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
                    nr.exchange(cx, c.name(), x, true, stream)?;
                    let to = (at(output, r.base), n);
                    copy_step(cx, reduce, dtype, (a, r.len), to, w, r.len, stream)?;
                }
            }
        }
        Ok(())
    }

    /// `Comm::barrier` with network peers: an all-to-all of one byte per rank (a rank's
    /// receive roles end only once every rank has started the call, after its earlier work).
    pub(crate) fn barrier(&self, cx: &NetCtx<'_>, stream: &Arc<CudaStream>) -> Result<()> {
        cx.p2p.bind(cx.group, stream)?;
        let w = cx.group.world_size as u64;
        let x = Exchange {
            input: self.barrier.ptr(),
            output: self.barrier.ptr() + w,
            chunk: 1,
            code: step_code(NetStep::Barrier, None, false),
        };
        self.exchange(cx, "barrier", x, false, stream)
    }

    /// One all-to-all step of `op`: `x.chunk` bytes to every rank, from consecutive chunks of
    /// `x.input` (`gather`: the same chunk to every rank, an all-to-all-v of one row from offset
    /// 0), into consecutive chunks of `x.output`.
    fn exchange(
        &self,
        cx: &NetCtx<'_>,
        op: &'static str,
        x: Exchange,
        gather: bool,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let w = cx.group.world_size as u64;
        let counts = self.counts.ptr();
        let recv = self.recv.ptr();
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
        // The buffers are this scratch's and the call's own (checked by the reduction's
        // caller), never overlapping: the collective launch's own checks apply.
        cx.coll
            .launch(cx.group, cx.jit, cx.p2p, cx.net, &self.copy, call, stream)
    }
}

/// Copies `pieces` pieces of `count` elements of `dtype` from `(address, stride)` to
/// `(address, stride)` (strides in elements).
#[allow(clippy::too_many_arguments)]
fn copy_step(
    cx: &NetCtx<'_>,
    reduce: &Reduce,
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
        errors: cx.group.errors.device_ptr(),
        pieces: pieces as u32,
        step: NetStepKind::Copy as u32,
        rank: cx.group.rank as i32,
        world: cx.group.world_size as i32,
        ..Default::default()
    };
    reduce.launch_net_step(cx.group, cx.jit, dtype, ReduceOp::Sum, None, &args, stream)
}

/// The local reduction of every rank's copy of this rank's chunk, in rank order (`step`'s
/// buffers, count and hook placement filled in by the caller).
fn reduce_step(
    cx: &NetCtx<'_>,
    reduce: &Reduce,
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
        errors: cx.group.errors.device_ptr(),
        pieces: cx.group.world_size as u32,
        rank: cx.group.rank as i32,
        world: cx.group.world_size as i32,
        ..step
    };
    reduce.launch_net_step(
        cx.group,
        cx.jit,
        call.dtype,
        call.op.unwrap_or(ReduceOp::Sum),
        hooks,
        &args,
        stream,
    )
}
