//! MoE dispatch and combine on the communicator (docs/MOE.md): [`Moe`] holds one layer's
//! scratch and what a dispatch leaves for its combine. Between NVLink peers (the direct path)
//! a dispatch is three kernels, the first writing each row straight into the receiving rank's
//! memory, and a combine two, the first writing each sum straight back. With network links in
//! the job (or `DEVCOMM_MOE_DIRECT=0`) a dispatch is four kernels around one all-to-all-v of
//! packed rows (as they are or FP8, `MoeConfig::wire`), a combine two kernels around one
//! all-to-all-v back. Both paths give the same bits; nothing goes through the host, so both
//! are capturable in CUDA graphs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig};

use super::raw::{RawBuffer, RawCounts};
use super::{Comm, HookArgs};
use crate::collective::RawHooks;
use crate::cuda::DeviceBuffer;
use crate::error::{CudaResultExt, Error, Result};
use crate::kernels::KernelKind;
use crate::memory::SymmetricMemory;
use crate::moe::{
    combine_pack_kernel, kernel_expression, launch_cap, DirectArea, MoeArgs, MoeConfig, MoePlan,
    KERNELS,
};

mod typed;

/// The status words the kernels count into (`moe.cu`).
const STATUS_WORDS: usize = 4;
/// Threads of the warp-per-row kernels' blocks.
const THREADS: u32 = 256;
/// Threads of the one-block layout and the block-per-expert positions kernels.
const SCAN_THREADS: u32 = 1024;

/// A dispatch's buffers, as device addresses (see [`Moe::dispatch`] for the typed form).
#[derive(Debug, Clone, Copy)]
pub struct DispatchBuffers {
    /// `[tokens, hidden]` rows to send.
    pub x: u64,
    /// `i64 [tokens, top_k]` expert ids, -1 for none.
    pub topk_idx: u64,
    /// `f32 [tokens, top_k]` weights.
    pub topk_weights: u64,
    /// Tokens (at most `max_tokens`).
    pub tokens: usize,
    /// Written: `[out_rows, hidden]` expert-major rows: of the input type, or `u8` e4m3 codes
    /// when the layer's wire returns FP8.
    pub out_x: u64,
    /// Written when the layer's wire returns FP8 (else unused, may be 0): `f32 [out_rows,
    /// MoePlan::scales]`, each output row's scales.
    pub out_scales: u64,
    /// Written: `f32 [out_rows]`, the weight of each output row.
    pub out_weights: u64,
    /// Rows of `out_x` and `out_weights`.
    pub out_rows: usize,
    /// Written: `i64 [local_experts]`, rows of each local expert (unpadded).
    pub expert_counts: u64,
}

/// What a dispatch leaves for its combine.
#[derive(Debug, Clone, Copy)]
struct Dispatched {
    tokens: usize,
    out_rows: usize,
    expert_counts: u64,
}

/// One MoE layer's dispatch and combine ([`Comm::moe`]).
pub struct Moe {
    plan: MoePlan,
    rank: usize,
    sm_count: u32,
    /// The most blocks of any launch of this layer's kernels: 8 a SM, or the SM budget
    /// ([`Moe::set_sm_budget`]).
    max_blocks: u32,
    /// The packed rows to send and those received.
    send: DeviceBuffer,
    recv: DeviceBuffer,
    /// `i32 [max_tokens, world]`: each token's slot among the rows sent to each rank.
    slot: DeviceBuffer,
    /// `u64 [6, world]`: send counts and offsets, receive counts and offsets (dispatch), then
    /// the combine's receive counts and offsets.
    counts: DeviceBuffer,
    /// `u32 [recv_rows, top_k]`: each received row's place per local expert.
    pos: DeviceBuffer,
    /// The received rows' weighted sums, and those that came back.
    cback: DeviceBuffer,
    back: DeviceBuffer,
    status: DeviceBuffer,
    /// The direct path's area and call counters (`None`: the all-to-all-v path).
    direct: Option<Direct>,
    hooks: RawHooks,
    functions: HashMap<&'static str, CudaFunction>,
    last: Mutex<Option<Dispatched>>,
}

impl std::fmt::Debug for Moe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Moe")
            .field("plan", &self.plan)
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

/// The direct path's memory: every rank's area, mapped into every peer, and this rank's call
/// counters (`moe.cu`, "The direct path").
struct Direct {
    layout: DirectArea,
    area: SymmetricMemory,
    /// `u64 [7]`: dispatches done, combines done, four arrival counters, failed (`moe.cu`).
    counters: DeviceBuffer,
    error_state: u64,
    mirror: u64,
    timeout_ns: u64,
}

fn bad(reason: String) -> Error {
    Error::InvalidArgument { op: "moe", reason }
}

impl Comm {
    /// Collective: a MoE layer's dispatch and combine for `config` (its kernels loaded, its
    /// scratch allocated: about `4 x max_tokens x world x hidden` elements). Every rank makes
    /// its layers with the same configurations in the same order; between NVLink peers the
    /// scratch is memory every peer writes into, so dropping a layer is collective too (each
    /// rank waits, up to the setup timeout, until every rank has dropped it).
    pub fn moe(&self, config: MoeConfig) -> Result<Moe> {
        let plan = MoePlan::new(config, self.world_size())?;
        let module = crate::kernels::load(
            &self.group,
            &self.jit,
            KernelKind::Moe {
                dtype: config.dtype,
            },
            false,
        )?;
        let mut functions = HashMap::new();
        for k in KERNELS {
            functions.insert(k, module.function(&kernel_expression(k, config.dtype))?);
        }
        let ctx = self.context();
        let (w, k) = (plan.world, config.top_k);
        let zeroed = |bytes: usize| DeviceBuffer::zeroed(ctx, bytes);
        let direct = self.moe_direct(&plan)?;
        // The all-to-all-v path's buffers (one small allocation each on the direct path).
        let staged = |bytes: usize| zeroed(if direct.is_some() { 16 } else { bytes });
        let moe = Moe {
            plan,
            rank: self.rank(),
            sm_count: self.device_info().sm_count.max(1) as u32,
            max_blocks: launch_cap(None, self.device_info().sm_count.max(1) as usize)?,
            send: staged(plan.send_rows * plan.row_bytes)?,
            recv: staged(plan.recv_rows * plan.row_bytes)?,
            slot: zeroed(config.max_tokens * w * 4)?,
            counts: zeroed(6 * w * 8)?,
            pos: zeroed(plan.recv_rows * k * 4)?,
            cback: staged(plan.recv_rows * plan.hidden_bytes)?,
            back: staged(plan.send_rows * plan.hidden_bytes)?,
            status: zeroed(STATUS_WORDS * 8)?,
            direct,
            hooks: RawHooks::copy_of_size(16),
            functions,
            last: Mutex::new(None),
        };
        crate::cuda::synchronize(ctx)?;
        Ok(moe)
    }

    /// The direct path's memory for `plan` when every link of the job is NVLink and
    /// `DEVCOMM_MOE_DIRECT` is on (the same answer on every rank: both are), else `None`.
    fn moe_direct(&self, plan: &MoePlan) -> Result<Option<Direct>> {
        if !self.group.config.moe_direct || self.group.mesh.network_in_job() {
            return Ok(None);
        }
        self.group.mesh.check_nvlink("moe", false)?;
        let layout = plan.direct_area();
        let area = SymmetricMemory::new(&self.group, layout.bytes)?;
        Ok(Some(Direct {
            layout,
            area,
            counters: DeviceBuffer::zeroed(self.context(), 7 * 8)?,
            error_state: self.group.errors.device_ptr(),
            mirror: self.group.errors.mirror_ptr(),
            timeout_ns: u64::try_from(self.group.device_timeout.as_nanos()).unwrap_or(u64::MAX),
        }))
    }
}

impl Moe {
    /// The plan (row layout, buffer rows) of this layer.
    pub fn plan(&self) -> &MoePlan {
        &self.plan
    }

    /// Refuses a communicator other than the one this layer was made on (its rank and world).
    fn same_comm(&self, comm: &Comm) -> Result<()> {
        if comm.rank() != self.rank || comm.world_size() != self.plan.world {
            return Err(bad(format!(
                "this layer was made on rank {} of {}; the call gives rank {} of {}",
                self.rank,
                self.plan.world,
                comm.rank(),
                comm.world_size()
            )));
        }
        Ok(())
    }

    fn counts_at(&self, i: usize) -> u64 {
        self.counts.ptr() + (i * self.plan.world * 8) as u64
    }

    fn args(&self) -> MoeArgs {
        let mut a = MoeArgs::of(&self.plan, self.rank);
        a.slot = self.slot.ptr();
        a.send_counts = self.counts_at(0);
        a.send_offsets = self.counts_at(1);
        a.recv_counts = self.counts_at(2);
        a.send = self.send.ptr();
        a.recv = self.recv.ptr();
        a.pos = self.pos.ptr();
        a.cback = self.cback.ptr();
        a.back = self.back.ptr();
        a.status = self.status.ptr();
        if let Some(d) = &self.direct {
            a.direct = 1;
            a.cap = self.plan.config.max_tokens as u64;
            a.sym = d.area.local_ptr();
            a.peers = d.area.peer_table();
            a.ctr = d.counters.ptr();
            a.err = d.error_state;
            a.mirror = d.mirror;
            a.timeout_ns = d.timeout_ns;
            a.tok_off = d.layout.tokens_off as u64;
            a.recv_off = d.layout.rows_off as u64;
            a.back_off = d.layout.sums_off as u64;
        }
        a
    }

    /// Whether this layer takes the direct path (every link of the job NVLink, and
    /// `DEVCOMM_MOE_DIRECT` on).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Launches kernel `name` on `blocks` blocks of `threads`.
    fn launch(
        &self,
        name: &'static str,
        blocks: u32,
        threads: u32,
        a: &MoeArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let func = &self.functions[name];
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every kernel of moe.cu takes one MoeArgs; the buffers it names are this
        // layer's (alive as long as it is) or the caller's (alive until the stream's work is
        // done, the raw calls' contract).
        unsafe { crate::cuda::launch_struct(stream, func, cfg, a, false) }
            .cuda(self.rank as i32, "cuLaunchKernel (moe)")
    }

    /// Blocks for `items` warps of work (grid-stride beyond a few waves, or beyond the SM
    /// budget).
    fn blocks_for(&self, items: usize) -> u32 {
        let warps = (THREADS / 32) as usize;
        items.div_ceil(warps).clamp(1, self.max_blocks as usize) as u32
    }

    /// Holds every launch of this layer's kernels to `blocks` blocks, so that its calls occupy
    /// at most that many SMs and leave the rest of the GPU to the kernels beside them
    /// (decode's low-latency mode; the kernels stride over the work, so any budget serves every
    /// call, more slowly the smaller it is); `None`: the whole GPU (8 blocks a SM, the
    /// default). On the all-to-all-v path the budget holds for the MoE kernels, not for the
    /// all-to-all-v's own (`DEVCOMM_P2P_MAX_BLOCKS`). A rank's budget is its own: ranks may
    /// differ. Takes effect from the next call; a refused budget changes nothing.
    pub fn set_sm_budget(&mut self, blocks: Option<usize>) -> Result<()> {
        self.max_blocks = launch_cap(blocks, self.sm_count as usize)?;
        Ok(())
    }

    /// The most blocks a launch of this layer takes ([`Moe::set_sm_budget`]).
    pub fn sm_budget(&self) -> usize {
        self.max_blocks as usize
    }

    /// The all-to-all-v of rows of `row_bytes` (a multiple of 16) from `from` (room for
    /// `rows.0` rows) to `to` (`rows.1`), with the counts and offsets at `counts_at(c..c + 4)`
    /// (send counts and offsets read, receive counts and offsets written): the dispatch's
    /// (0: the layout's counts) or the combine's (2: the dispatch's received counts, back).
    fn exchange(
        &self,
        comm: &Comm,
        (from, to): (u64, u64),
        rows: (usize, usize),
        row_bytes: usize,
        c: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let units = (row_bytes / 16) as u64;
        let buffer = |ptr: u64, rows: usize| RawBuffer {
            ptr,
            elems: rows as u64 * units,
            elem_size: 16,
        };
        let counts = RawCounts {
            send_counts: self.counts_at(c),
            send_offsets: self.counts_at(c + 1),
            recv_counts: self.counts_at(c + 2),
            recv_offsets: self.counts_at(c + 3),
        };
        // SAFETY: this layer's buffers, sized for max_tokens per rank; the counts (the
        // layout's, or the dispatch's received ones) stay within them.
        unsafe {
            comm.all_to_all_v_raw(
                &self.hooks,
                buffer(from, rows.0),
                buffer(to, rows.1),
                counts,
                HookArgs::rows(units as usize),
                stream,
            )
        }
    }

    /// Dispatch with device addresses: see [`Moe::dispatch`].
    ///
    /// # Safety
    ///
    /// Each address must be device memory of this communicator's device holding what
    /// [`DispatchBuffers`] says, alive and not otherwise written until the stream's work is
    /// done.
    pub unsafe fn dispatch_raw(
        &self,
        comm: &Comm,
        b: DispatchBuffers,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.same_comm(comm)?;
        // A failed communicator's calls return its error (the direct path's kernels would do
        // nothing), as every other family's do.
        comm.group.errors.check_before_launch()?;
        let c = &self.plan.config;
        if b.tokens > c.max_tokens {
            return Err(bad(format!(
                "{} tokens; this layer takes at most max_tokens = {}",
                b.tokens, c.max_tokens
            )));
        }
        // The buffers a call with these tokens and output rows writes or reads.
        let fp8_out = self.plan.config.wire.outputs_fp8();
        let needed = [
            ("x", b.x, b.tokens > 0),
            ("topk_idx", b.topk_idx, b.tokens > 0),
            ("topk_weights", b.topk_weights, b.tokens > 0),
            ("out_x", b.out_x, b.out_rows > 0),
            ("out_weights", b.out_weights, b.out_rows > 0),
            ("out_scales", b.out_scales, b.out_rows > 0 && fp8_out),
            ("expert_counts", b.expert_counts, true),
        ];
        if let Some((name, _, _)) = needed.into_iter().find(|&(_, p, used)| used && p == 0) {
            return Err(bad(format!("{name} is a null address")));
        }
        let mut a = self.args();
        a.x = b.x;
        a.topk_idx = b.topk_idx;
        a.topk_w = b.topk_weights;
        a.tokens = b.tokens as u64;
        a.out_x = b.out_x;
        a.out_w = b.out_weights;
        a.out_scales = b.out_scales;
        a.out_rows = b.out_rows as u64;
        a.expert_count = b.expert_counts;
        // SAFETY: the status words are this layer's; stream-ordered before the kernels.
        unsafe {
            crate::cuda::graph::memset_d8_async(self.status.ptr(), 0, STATUS_WORDS * 8, stream)?
        };
        let (pack, unpack) = c.wire.kernels();
        let pack_blocks = self.blocks_for(b.tokens * self.plan.kernel_parts(pack));
        if self.direct.is_some() {
            // The pack kernel writes each row into its ranks' areas and signals them.
            self.launch(pack, pack_blocks, THREADS, &a, stream)?;
        } else {
            self.launch("moe_layout", 1, SCAN_THREADS, &a, stream)?;
            self.launch(pack, pack_blocks, THREADS, &a, stream)?;
            let (send, recv) = (self.send.ptr(), self.recv.ptr());
            let rows = (self.plan.send_rows, self.plan.recv_rows);
            self.exchange(comm, (send, recv), rows, self.plan.row_bytes, 0, stream)?;
        }
        let le = (self.plan.local_experts as u32).min(self.max_blocks);
        self.launch("moe_positions", le, SCAN_THREADS, &a, stream)?;
        let rows =
            self.blocks_for(self.plan.expected_rows(b.tokens) * self.plan.kernel_parts(unpack));
        self.launch(unpack, rows, THREADS, &a, stream)?;
        let mut last = self.last.lock().map_err(|_| poisoned())?;
        *last = Some(Dispatched {
            tokens: b.tokens,
            out_rows: b.out_rows,
            expert_counts: b.expert_counts,
        });
        Ok(())
    }

    /// The last dispatch, with `y_bytes` and `out_bytes` checked against it.
    fn last_for_combine(&self, y_bytes: usize, out_bytes: usize) -> Result<Dispatched> {
        let d = (*self.last.lock().map_err(|_| poisoned())?)
            .ok_or_else(|| bad("combine before any dispatch".into()))?;
        let row = self.plan.hidden_bytes;
        if y_bytes < d.out_rows * row || out_bytes < d.tokens * row {
            return Err(bad(format!(
                "y holds {y_bytes} bytes and out {out_bytes}; the last dispatch ({} output rows, \
                 {} tokens) needs {} and {}",
                d.out_rows,
                d.tokens,
                d.out_rows * row,
                d.tokens * row
            )));
        }
        Ok(d)
    }

    /// Combine with device addresses: see [`Moe::combine`]. `y_bytes` and `out_bytes` are the
    /// buffers' sizes, checked against the last dispatch.
    ///
    /// # Safety
    ///
    /// `y` and `out` must be device memory of this communicator's device of at least those
    /// sizes, alive until the stream's work is done.
    pub unsafe fn combine_raw(
        &self,
        comm: &Comm,
        (y, y_bytes): (u64, usize),
        (out, out_bytes): (u64, usize),
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.same_comm(comm)?;
        comm.group.errors.check_before_launch()?;
        let d = self.last_for_combine(y_bytes, out_bytes)?;
        if (y == 0 && d.out_rows > 0) || (out == 0 && d.tokens > 0) {
            return Err(bad("y or out is a null address".into()));
        }
        let mut a = self.args();
        a.y = y;
        a.out = out;
        a.tokens = d.tokens as u64;
        a.out_rows = d.out_rows as u64;
        a.expert_count = d.expert_counts;
        // On the direct path each sum goes straight back into its sender's area, which is then
        // signalled; else into cback, and the all-to-all-v takes it back.
        let parts = self.plan.kernel_parts("moe_combine_pack");
        let rows = self.blocks_for(self.plan.expected_rows(d.tokens) * parts);
        let kernel = combine_pack_kernel(rows as usize, self.sm_count as usize);
        self.launch(kernel, rows, THREADS, &a, stream)?;
        if self.direct.is_none() {
            // Back the way the rows came: what this rank received goes back to its senders.
            let (cback, back) = (self.cback.ptr(), self.back.ptr());
            let rows = (self.plan.recv_rows, self.plan.send_rows);
            self.exchange(comm, (cback, back), rows, self.plan.hidden_bytes, 2, stream)?;
        }
        let blocks = self.blocks_for(d.tokens * self.plan.kernel_parts("moe_combine_final"));
        self.launch("moe_combine_final", blocks, THREADS, &a, stream)
    }

    /// Waits for `stream` and reports what the last dispatch counted: expert ids out of range,
    /// ids repeated within a token (both dropped), or an output too small (nothing written;
    /// this rank's experts then contribute zeros to the combine).
    pub fn check(&self, stream: &Arc<CudaStream>) -> Result<()> {
        stream
            .synchronize()
            .cuda(self.rank as i32, "cuStreamSynchronize (moe check)")?;
        let mut raw = [0u8; STATUS_WORDS * 8];
        self.status.read(0, &mut raw)?;
        let word =
            |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let mut problems = Vec::new();
        if word(0) > 0 {
            problems.push(format!(
                "{} expert ids outside [-1, {}) (dropped)",
                word(0),
                self.plan.config.experts
            ));
        }
        if word(1) > 0 {
            problems.push(format!(
                "{} expert ids repeated within a token (dropped)",
                word(1)
            ));
        }
        if word(2) > 0 {
            let out_rows = self.last.lock().ok().and_then(|l| l.map(|d| d.out_rows));
            problems.push(format!(
                "the expert-major output needs {} rows and holds {} (nothing written)",
                word(2),
                out_rows.unwrap_or(0)
            ));
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(bad(format!("rank {}: {}", self.rank, problems.join("; "))))
    }
}

fn poisoned() -> Error {
    bad("a thread panicked while using this MoE layer".into())
}
