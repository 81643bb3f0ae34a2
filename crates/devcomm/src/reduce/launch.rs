//! The reductions' per-communicator state (window, sequence counters, loaded kernels) and
//! their launch: checks, plan, kernel, gate, `cuLaunchKernelEx`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaStream};

use super::config;
use super::net_plan;
use super::plan::{self, Algorithm, Collective, Plan, ReduceLimits, Shape, MAX_BLOCKS, THREADS};
use super::specs::{kernel_expression, module_spec, net_step_expression};
use super::tune::{table_bytes, Buffers, ReduceTuneTable, TunedWindow};
use super::tuned_plan::{plan_tuned, Choice};
use super::types::{DataType, ReduceOp};
use super::zero_copy_plan::{layout_word, zero_copy_plan, Placement};
use crate::abi::reduce_launch::{NetStepLaunch, ReduceLaunch, TWO_SHOT_PUSHED};
use crate::collective::RawHooks;
use crate::cuda::{linear_launch, DeviceBuffer};
use crate::error::{CudaResultExt, Error, Result};
use crate::group::{Group, KernelGate};
use crate::jit::Jit;
use crate::memory::PoolLocation;
use crate::window::Window;

/// One reduction launch, its buffers resolved and checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReduceCall<'h> {
    pub collective: Collective,
    pub dtype: DataType,
    /// `None` for all-gather.
    pub op: Option<ReduceOp>,
    pub input: u64,
    pub output: u64,
    /// All-reduce: elements; reduce-scatter: output elements; all-gather: input elements.
    pub count: u64,
    pub hooks: Option<(&'h RawHooks, u64, u64)>,
    /// The call takes part refused: its announcement carries [`REFUSED_DTYPE`], which fails
    /// every rank's call agreement (its own too) before any output is written.
    pub refused: bool,
    /// The buffers' places in the memory pool, when either lies there: the zero-copy paths'
    /// candidates ([`zero_copy_plan`]).
    pub pool: Option<&'h PoolBuffers>,
    /// A choice made for this call in place of the tuning table's and the default plan (the
    /// tuner's candidate): the call fails when the choice cannot serve it. Every rank must
    /// pass the same.
    pub choice: Option<Choice>,
}

/// What a communicator's reductions are tuned with (`comm/reduce_tuning.rs` decides it at
/// build, alike on every rank).
#[derive(Debug, Clone, Default)]
pub(crate) struct ReduceTuning {
    /// The tuning table, checked against this communicator.
    pub table: Option<ReduceTuneTable>,
    /// Sizes the window must hold beyond the settings' (a tuning run's wider window).
    pub window: Option<TunedWindow>,
}

/// Where a call's buffers lie in the memory pool (each `None` outside it, or without an
/// NVLink mapping of every peer's segment).
#[derive(Debug, Clone, Default)]
pub(crate) struct PoolBuffers {
    pub input: Option<PoolLocation>,
    pub output: Option<PoolLocation>,
}

/// The zero-copy fields of a launch: (in_peers, in_offset, out_peers, out_offset, layout).
fn zero_copy_fields(
    algorithm: Algorithm,
    collective: Collective,
    pool: &PoolBuffers,
) -> (u64, u64, u64, u64, u64) {
    // Which buffers peers reach: the input unless all-gather, the output for the two-shot
    // all-reduce and the all-gather.
    let reads = collective != Collective::AllGather;
    let writes = collective == Collective::AllGather
        || (collective == Collective::AllReduce && algorithm == Algorithm::ZeroCopyTwoShot);
    let input = pool.input.as_ref().filter(|_| reads);
    let output = pool.output.as_ref().filter(|_| writes);
    let place = |l: Option<&PoolLocation>| l.map(|l| (l.segment as u64, l.offset));
    (
        input.map_or(0, |l| l.peer_table),
        input.map_or(0, |l| l.offset),
        output.map_or(0, |l| l.peer_table),
        output.map_or(0, |l| l.offset),
        layout_word(algorithm, collective, place(input), place(output)),
    )
}

/// The element-type code of a refused call's announcement (no type has it:
/// `devcomm::red::kRefusedDtype`).
pub(crate) const REFUSED_DTYPE: u32 = 7;

/// The planners' view of a call on `world` ranks.
fn shape_of(call: &ReduceCall<'_>, world: usize) -> Shape {
    Shape {
        collective: call.collective,
        count: call.count,
        elem_bytes: call.dtype.size_bytes() as u64,
        world,
        row_len: call.hooks.map(|(_, _, row)| row),
    }
}

/// A loaded module's kernels by name expression, and its gate.
#[derive(Debug, Clone)]
struct Loaded {
    functions: Arc<HashMap<String, (CudaFunction, u32)>>,
    gate: Arc<KernelGate>,
}

/// A module's key: element type, for hooked modules the operation and the hooks' key, and
/// whether it holds the local steps of the network path instead of the NVLink kernels.
type ModuleKey = (DataType, Option<ReduceOp>, u64, bool);

/// Per-communicator state of the reductions.
#[derive(Debug)]
pub(crate) struct Reduce {
    /// What the default plans are made with: the settings' sizes and blocks.
    limits: ReduceLimits,
    /// `limits` with the window's sizes: the settings' and, when larger, the tuning table's
    /// or a tuning run's (tuned choices fit these; the kernels' line areas are laid out by
    /// them).
    window_limits: ReduceLimits,
    /// The tuning table (its choices, by size, where they can serve a call).
    table: Option<ReduceTuneTable>,
    /// One-shot lines (`world` senders x 2 parities), then the two halves of the two-shot area;
    /// `SLOT_KINDS x world x MAX_BLOCKS` signal slots.
    window: Window<u8>,
    /// `u64[3 x MAX_BLOCKS]`: one-shot and two-shot per-block sequence counters, then the
    /// per-block call numbers of the call agreement.
    counters: DeviceBuffer,
    sm_count: u32,
    /// Loaded modules by (type, operation, hooks key, network steps); plain modules use
    /// (type, None, 0, _).
    modules: Mutex<HashMap<ModuleKey, Loaded>>,
}

impl Reduce {
    /// Collective: the reduce window and zeroed counters on every rank, sized by the limits
    /// every rank derives alike from the settings (compared at setup), the smallest GPU and
    /// the tuning (its table's fingerprint compared at setup).
    pub(crate) fn new(group: &Arc<Group>, sm_count: i32, tuning: ReduceTuning) -> Result<Self> {
        let tag = group.next_tag("__devcomm/reduce/sm_count");
        let all =
            group
                .store
                .all_gather(&tag, &sm_count.max(1).to_le_bytes(), group.setup_timeout)?;
        let sms = all
            .iter()
            .filter_map(|b| b.get(..4)?.try_into().ok())
            .map(i32::from_le_bytes)
            .min()
            .unwrap_or(1)
            .max(1) as u32;
        let c = &group.config;
        let limits = config::limits(
            group.world_size,
            c.reduce_max_blocks,
            c.reduce_one_shot_kib,
            c.reduce_zero_copy_one_shot_kib,
            c.reduce_chunk_mib,
            sms,
        );
        let limits = ReduceLimits {
            block_bytes: u64::from(c.reduce_block_kib.max(1)) << 10,
            one_shot_blocks: c
                .reduce_one_shot_blocks
                .clamp(1, MAX_BLOCKS)
                .min(limits.staged_max_blocks),
            line_two_shot_bytes: c
                .reduce_line_two_shot_kib
                .map_or(limits.line_two_shot_bytes, |k| u64::from(k) << 10),
            zero_copy_min_bytes: c
                .reduce_zero_copy_min_kib
                .map_or(limits.zero_copy_min_bytes, |k| u64::from(k) << 10),
            ..limits
        };
        // The window holds the table's and a tuning run's sizes too.
        let window_limits = [tuning.window, tuning.table.as_ref().map(|t| t.window)]
            .iter()
            .flatten()
            .fold(limits, |l, w| w.widen(&l));
        let traced = |l: ReduceLimits| match c.trace {
            true => config::without_lines(
                l,
                c.reduce_one_shot_kib.is_some(),
                c.reduce_line_two_shot_kib.is_some(),
            ),
            false => l,
        };
        let (limits, window_limits) = (traced(limits), traced(window_limits));
        let world = group.world_size;
        let slots = plan::SLOT_KINDS * world.min(plan::MAX_WORLD) * MAX_BLOCKS as usize;
        let bytes = plan::window_bytes(world, &window_limits) as usize;
        let counters = DeviceBuffer::zeroed(&group.ctx, 3 * MAX_BLOCKS as usize * 8)
            .map_err(|e| crate::cuda::with_rank(e, group.rank));
        let counters = group.agree("reductions: counters", counters)?;
        let window = Window::<u8>::new(group, bytes, slots)?;
        Ok(Self {
            limits,
            window_limits,
            table: tuning.table,
            window,
            counters,
            sm_count: sms.max(1),
            modules: Mutex::new(HashMap::new()),
        })
    }

    /// The sizes and blocks the default plans are made with.
    pub(crate) fn limits(&self) -> &ReduceLimits {
        &self.limits
    }

    /// [`Reduce::limits`] with the window's sizes, which tuned choices fit.
    pub(crate) fn window_limits(&self) -> &ReduceLimits {
        &self.window_limits
    }

    /// The tuning table, if the communicator loaded one.
    pub(crate) fn tune_table(&self) -> Option<&ReduceTuneTable> {
        self.table.as_ref()
    }

    /// The tuning table's choice for `call` on `world` ranks, by its size and where its
    /// buffers lie.
    fn table_choice(&self, call: &ReduceCall<'_>, world: usize) -> Option<Choice> {
        let buffers = match call.pool {
            Some(_) => Buffers::Pool,
            None => Buffers::Ordinary,
        };
        let es = call.dtype.size_bytes() as u64;
        let bytes = table_bytes(call.collective, call.count, es, world);
        self.table
            .as_ref()?
            .choice_for(call.collective, buffers, bytes)
    }

    fn module(
        &self,
        group: &Group,
        jit: &Jit,
        dtype: DataType,
        hooked: Option<(ReduceOp, &RawHooks)>,
        net: bool,
    ) -> Result<Loaded> {
        let poisoned = || Error::Aborted {
            rank: group.rank as i32,
            reason: "a thread panicked while loading kernels".into(),
        };
        let key = match hooked {
            Some((op, h)) => (dtype, Some(op), h.key(), net),
            None => (dtype, None, 0, net),
        };
        if let Some(l) = self.modules.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(l.clone());
        }
        // Through the one load path: marked as loading, so that peers already at this
        // module's gate wait for the compile instead of giving up after the device timeout.
        let spec = module_spec(dtype, hooked, net, &group.config);
        let module = crate::kernel_load::load(group, jit, &spec)?;
        let mut functions = HashMap::new();
        for expression in module.lowered_names().keys() {
            let f = module.function(expression)?;
            let per_sm = f
                .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
                .cuda(
                    group.rank as i32,
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                )?;
            functions.insert(expression.clone(), (f, per_sm));
        }
        let gate = KernelGate::new(
            format!("reduce-{}-{:?}-{:016x}-{net}", dtype.name(), key.1, key.2),
            group.world_size,
        );
        let loaded = Loaded {
            functions: Arc::new(functions),
            gate: Arc::new(gate),
        };
        self.modules
            .lock()
            .map_err(|_| poisoned())?
            .insert(key, loaded.clone());
        Ok(loaded)
    }

    /// The plan of a call (the buffers already resolved): the call's own choice or the tuning
    /// table's where it can serve the call ([`plan_tuned`]); else zero-copy when its buffers
    /// lie in the pool as [`zero_copy_plan`] needs them (with those buffers), else the staged
    /// one ([`plan::plan`], which also refuses what no path can run).
    pub(crate) fn choose<'h>(
        &self,
        call: &ReduceCall<'h>,
        (rank, world): (usize, usize),
    ) -> Result<(Plan, Option<&'h PoolBuffers>)> {
        let shape = shape_of(call, world);
        let staged = plan::plan(&shape, &self.limits).map_err(|reason| Error::InvalidArgument {
            op: call.collective.name(),
            reason: format!("rank {rank}: {reason}"),
        })?;
        let at = call.pool.map(|pool| Placement {
            input_pooled: pool.input.is_some(),
            output_pooled: pool.output.is_some(),
            in_place: call.input == call.output,
        });
        let choice = match call.choice {
            Some(c) => Some((c, true)),
            None => self.table_choice(call, world).map(|c| (c, false)),
        };
        if let Some((choice, own)) = choice {
            match plan_tuned(&shape, at.as_ref(), &self.window_limits, &choice) {
                Some(p) => {
                    let pool = call.pool.filter(|_| p.algorithm.zero_copy_code() != 0);
                    return Ok((p, pool));
                }
                None if own => {
                    return Err(Error::InvalidArgument {
                        op: call.collective.name(),
                        reason: format!(
                            "rank {rank}: {choice} cannot serve this call ({} elements of {} \
                             bytes on {world} ranks, {} buffers)",
                            call.count,
                            shape.elem_bytes,
                            if call.pool.is_some() {
                                "pool"
                            } else {
                                "ordinary"
                            }
                        ),
                    })
                }
                None => {}
            }
        }
        let zero_copy = call
            .pool
            .zip(at)
            .and_then(|(pool, at)| zero_copy_plan(&shape, &at, &self.limits).map(|p| (p, pool)));
        Ok(match zero_copy {
            Some((p, pool)) => (p, Some(pool)),
            None => (staged, None),
        })
    }

    /// Checks, plans and launches one call on `stream`. Nothing is launched on an error.
    pub(crate) fn launch(
        &self,
        group: &Group,
        jit: &Jit,
        call: ReduceCall<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let op_name = call.collective.name();
        let (rank, world) = (group.rank, group.world_size);
        if world > plan::MAX_WORLD {
            return Err(Error::InvalidArgument {
                op: op_name,
                reason: format!(
                    "world size {world}: reductions support at most {} ranks",
                    plan::MAX_WORLD
                ),
            });
        }
        group.mesh.check_nvlink(op_name, false)?;
        let (pl, zero_copy) = self.choose(&call, (rank, world))?;
        let (in_peers, in_offset, out_peers, out_offset, layout) = match zero_copy {
            Some(pool) => zero_copy_fields(pl.algorithm, call.collective, pool),
            None => (
                0,
                0,
                0,
                0,
                layout_word(pl.algorithm, call.collective, None, None),
            ),
        };
        let op = call.op.unwrap_or(ReduceOp::Sum);
        let hooked = call.hooks.map(|(h, _, _)| (op, h));
        let loaded = self.module(group, jit, call.dtype, hooked, false)?;
        let expression = kernel_expression(
            pl.algorithm,
            call.dtype,
            op,
            call.hooks.map(|(h, _, _)| h.name()),
        );
        let (func, per_sm) =
            loaded
                .functions
                .get(&expression)
                .cloned()
                .ok_or(Error::NotImplemented {
                    feature: "this reduction kernel instantiation",
                })?;
        if pl.blocks > per_sm.max(1) * self.sm_count {
            return Err(Error::InvalidArgument {
                op: op_name,
                reason: format!(
                    "{} blocks of {THREADS} threads cannot all be resident ({per_sm} per SM x {} \
                     SMs); the blocks wait on each other's peers, so this would deadlock",
                    pl.blocks, self.sm_count
                ),
            });
        }
        loaded.gate.pass(group, 0..world)?;
        let es = call.dtype.size_bytes() as u64;
        let total = match call.collective {
            Collective::AllReduce => call.count,
            _ => call.count * world as u64,
        };
        let ll_sender_bytes = plan::ll_sender_bytes(world, &self.window_limits);
        let (user, row) = call.hooks.map_or((0, 0), |(_, user, row)| (user, row));
        let args = ReduceLaunch {
            w: self.window.device_handle(),
            input: call.input,
            output: call.output,
            count: call.count,
            total,
            shard: pl.shard,
            chunk: pl.chunk,
            rounds: pl.rounds,
            unit: pl.unit,
            counters: self.counters.ptr(),
            user,
            row_len: row,
            ll_offset: 0,
            ll_sender_bytes,
            pipe_offset: world as u64 * 2 * ll_sender_bytes,
            half_bytes: self.window_limits.chunk_bytes,
            blocks: pl.blocks,
            mode: call.collective.code(),
            op: op.code(),
            dtype: if call.refused {
                REFUSED_DTYPE
            } else {
                call.dtype.code()
            },
            in_peers,
            in_offset,
            out_peers,
            out_offset,
            layout,
            zc: pl.algorithm.zero_copy_code(),
            flags: if pl.pushed { TWO_SHOT_PUSHED } else { 0 },
        };
        // A pushed round's result slots follow its staging slots in the half.
        debug_assert!(
            pl.chunk * world as u64 * es * if pl.pushed { 2 } else { 1 }
                <= self.window_limits.chunk_bytes
        );
        let cfg = linear_launch(pl.blocks, THREADS);
        let _scope = group.call_scope(stream, || crate::trace::CallInfo {
            op: op_name,
            bytes: call.count * es,
            peers: (0..world).filter(|&q| q != rank).collect(),
            algorithm: format!("{:?}, {} blocks", pl.algorithm, pl.blocks),
        });
        // SAFETY: both kernels take one ReduceLaunch by value and enter through
        // enter_after_previous_kernel. The window and counters live as long as the
        // communicator (this state is dropped before the group). The caller resolved and
        // checked the buffers: the kernel reads `total` (all-reduce, reduce-scatter) or `count`
        // (all-gather) elements of `input` and writes `total` (all-reduce, all-gather) or
        // `count` (reduce-scatter) elements of `output`, nothing else; the plan keeps every
        // round inside the window (asserted above), and every block is resident (checked), so
        // the blocks' waits on their peers cannot deadlock.
        unsafe { crate::cuda::launch_struct(stream, &func, cfg, &args, group.pdl) }
            .cuda(rank as i32, "cuLaunchKernelEx (reduction)")?;
        Ok(())
    }
}

impl Reduce {
    /// Launches one local step of a reduction with network peers on `stream`
    /// (`net_step_kernel`; its arguments checked by the caller, `src/reduce/net.rs`).
    /// The step waits on no peer, so it needs no load gate.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_net_step(
        &self,
        group: &Group,
        jit: &Jit,
        dtype: DataType,
        op: ReduceOp,
        hooks: Option<&RawHooks>,
        args: &NetStepLaunch,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if args.count == 0 {
            return Ok(());
        }
        let loaded = self.module(group, jit, dtype, hooks.map(|h| (op, h)), true)?;
        let expression = net_step_expression(dtype, op, hooks.map(|h| h.name()));
        let (func, _) =
            loaded
                .functions
                .get(&expression)
                .cloned()
                .ok_or(Error::NotImplemented {
                    feature: "this network step kernel instantiation",
                })?;
        let bytes = args.count * dtype.size_bytes() as u64;
        let cfg = linear_launch(net_plan::step_blocks(bytes, self.sm_count), THREADS);
        // SAFETY: net_step_kernel takes one NetStep by value (NetStepLaunch is its twin) and
        // enters through enter_after_previous_kernel. The caller checked that `pieces` pieces
        // of `count` elements at the strides lie inside its buffers or the network scratch, and
        // the hooked `dest` rows inside the caller's output; the kernel touches nothing else.
        unsafe { crate::cuda::launch_struct(stream, &func, cfg, args, group.pdl) }.cuda(
            group.rank as i32,
            "cuLaunchKernelEx (network reduction step)",
        )?;
        Ok(())
    }

    /// The SMs of the group's smallest GPU.
    pub(crate) fn sm_count(&self) -> u32 {
        self.sm_count
    }
}

#[cfg(test)]
mod tests {
    use super::REFUSED_DTYPE;
    use crate::reduce::DataType;

    #[test]
    fn no_element_type_has_the_refused_code() {
        // `kRefusedDtype` in reduce.cuh (checked there by tests/reduce_loops.rs).
        assert_eq!(REFUSED_DTYPE, 7);
        assert!(DataType::ALL.iter().all(|t| t.code() != REFUSED_DTYPE));
    }
}
