//! Checks of MoE dispatch and combine (docs/MOE.md) against the host reference
//! (`devcomm::moe::reference`), bit for bit: random, skewed, single-rank and partly dropped
//! routings, a rank with no tokens; a token's combined row the same whatever the rest of the
//! batch; graph replays with a new routing each time; out-of-range ids and an output too small
//! reported by `Moe::check`, nothing written past the output. FP8 on the wire: `fp8.rs`.

mod back_to_back;
mod budget;
mod fp8;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use devcomm::moe::reference::{self, Routing};
use devcomm::moe::Wire;
use devcomm::{Comm, DataType, DispatchBuffers, Moe, MoeConfig, MoePlan};
use half::bf16;
use rand::{Rng, SeedableRng};

use super::harness::{verified, Check, Ctx, Ranks};

type Detail = Result<String, String>;

/// The group's checks, in run order.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "moe_routings",
        ranks: Ranks::AtLeast(2),
        about: "dispatch + combine against the host reference, bit for bit, on six routings",
        run: |cx, _| verified(check_routings(cx)),
    },
    Check {
        name: "moe_back_to_back",
        ranks: Ranks::AtLeast(2),
        about: "three dispatches in a row, two combines of the last, then both again: bit for bit",
        run: |cx, _| verified(back_to_back::check_back_to_back(cx)),
    },
    Check {
        name: "moe_batch_invariant",
        ranks: Ranks::AtLeast(2),
        about: "a token's combined row is the same in a batch of 1, half or all tokens",
        run: |cx, _| verified(check_batch_invariant(cx)),
    },
    Check {
        name: "moe_graph",
        ranks: Ranks::AtLeast(2),
        about: "--replays replays of a captured dispatch + combine, a new routing each time",
        run: |cx, p| verified(check_graph(cx, p.replays.min(50))),
    },
    Check {
        name: "moe_errors",
        ranks: Ranks::AtLeast(2),
        about: "bad ids and a too small output reported; nothing written past the output",
        run: |cx, _| verified(check_errors(cx)),
    },
    Check {
        name: "moe_sm_budget",
        ranks: Ranks::AtLeast(2),
        about: "dispatch + combine with every launch held to a few blocks (each rank its own budget), bit for bit; bad budgets refused",
        run: |cx, _| verified(budget::check_sm_budget(cx)),
    },
    Check {
        name: "moe_fp8",
        ranks: Ranks::AtLeast(2),
        about: "FP8 dispatch (per-row and per-128 scales, dequantised and FP8 + scales) and its combine bit for bit against the host reference, within e4m3's error of the rows",
        run: |cx, _| verified(fp8::check_fp8(cx)),
    },
    Check {
        name: "moe_fp8_graph",
        ranks: Ranks::AtLeast(2),
        about: "--replays replays of a captured FP8 dispatch + combine, a new routing each time",
        run: |cx, p| verified(fp8::check_fp8_graph(cx, p.replays.min(50))),
    },
    Check {
        name: "moe_fp8_refused",
        ranks: Ranks::AtLeast(2),
        about: "FP8 layers refuse a hidden size they cannot carry and the other form's call",
        run: |cx, _| verified(fp8::check_fp8_refused(cx)),
    },
];

/// 4,608 bytes of bf16: a row in three 2 KiB parts, the last a partial one (the kernels give
/// a warp a part of a row).
const HIDDEN: usize = 2304;
const TOP_K: usize = 4;
const MAX_TOKENS: usize = 300;
const ALIGN: usize = 8;

fn config(world: usize) -> MoeConfig {
    MoeConfig {
        experts: 4 * world,
        top_k: TOP_K,
        hidden: HIDDEN,
        dtype: DataType::BF16,
        max_tokens: MAX_TOKENS,
        align: ALIGN,
        wire: Wire::Native,
    }
}

/// How a case routes tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Uniform,
    /// Nine in ten entries to rank 0's experts.
    Skewed,
    /// Every token to the experts of rank `world - 1` only.
    OneRank,
    /// A third of the entries -1.
    Dropped,
    /// Rank 1 has no tokens.
    EmptyRank,
    /// Each token repeats some experts and adds out-of-range ids (dropped and counted).
    Invalid,
}

/// Rank `rank`'s tokens and routing for `kind` in case `case` (every rank can compute every
/// rank's).
fn routing(cx: &Ctx, plan: &MoePlan, kind: Kind, case: u64, rank: usize) -> (usize, Routing) {
    let c = &plan.config;
    let mut rng = rand::rngs::StdRng::seed_from_u64(cx.seed ^ case.rotate_left(9) ^ rank as u64);
    let tokens = match kind {
        Kind::EmptyRank if rank == 1 => 0,
        _ => rng.gen_range(1..=MAX_TOKENS),
    };
    let mut idx = Vec::with_capacity(tokens * c.top_k);
    let mut weights = Vec::with_capacity(tokens * c.top_k);
    for _ in 0..tokens {
        let mut chosen: Vec<i64> = Vec::new();
        while chosen.len() < c.top_k {
            let e = match kind {
                Kind::Skewed if rng.gen_range(0..10) < 9 => {
                    rng.gen_range(0..plan.local_experts)
                }
                Kind::OneRank => {
                    (plan.world - 1) * plan.local_experts + rng.gen_range(0..plan.local_experts)
                }
                _ => rng.gen_range(0..c.experts),
            } as i64;
            // Entries the case wants as they are: -1, out of range, or a repeat.
            let forced = match kind {
                Kind::Dropped if rng.gen_range(0..3) == 0 => Some(-1),
                Kind::Invalid if chosen.is_empty() || rng.gen_range(0..4) == 0 => {
                    Some(c.experts as i64 + 3)
                }
                Kind::Invalid if rng.gen_range(0..4) == 0 => Some(chosen[chosen.len() - 1]),
                _ => None,
            };
            match forced {
                Some(f) => chosen.push(f),
                None if chosen.contains(&e) => continue,
                None => chosen.push(e),
            }
        }
        idx.extend(chosen);
        weights.extend((0..c.top_k).map(|_| rng.gen_range(0.0f32..1.0)));
    }
    (tokens, Routing { idx, weights })
}

/// Every rank's uniform routing of `case` with exactly `tokens` tokens (the routing repeated,
/// then cut): the graph checks replay a fixed token count with a new routing each time.
fn fixed_routings(cx: &Ctx, plan: &MoePlan, case: u64, tokens: usize) -> Vec<Routing> {
    (0..cx.comm.world_size())
        .map(|r| {
            let (_, mut full) = routing(cx, plan, Kind::Uniform, case, r);
            while full.tokens(TOP_K) < tokens {
                let more = full.clone();
                full.idx.extend(more.idx);
                full.weights.extend(more.weights);
            }
            full.idx.truncate(tokens * TOP_K);
            full.weights.truncate(tokens * TOP_K);
            full
        })
        .collect()
}

/// Rank `rank`'s rows: small values exact in bf16.
fn rows(cx: &Ctx, case: u64, rank: usize, tokens: usize) -> Vec<bf16> {
    cx.data_of(rank, 0x4d0e ^ case, tokens * HIDDEN)
        .into_iter()
        .map(|b| bf16::from_f32((b as f32 - 128.0) / 16.0))
        .collect()
}

/// The stand-in expert: expert `e` scales a row by `1 + e / 8` (rounded to bf16).
fn expert(e: usize, row: &[bf16]) -> Vec<bf16> {
    row.iter()
        .map(|x| bf16::from_f32(x.to_f32() * (1.0 + e as f32 / 8.0)))
        .collect()
}

fn err(what: &str) -> impl Fn(devcomm::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn upload<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(s: &Arc<CudaStream>, v: &[T]) -> Result<CudaSlice<T>, String> {
    // At least one element: cudarc refuses empty allocations on some paths.
    if v.is_empty() {
        return s.alloc_zeros::<T>(1).map_err(|e| e.to_string());
    }
    s.clone_htod(v).map_err(|e| e.to_string())
}

/// What outputs hold before a call writes them.
fn poison() -> bf16 {
    bf16::from_f32(-776.0)
}

/// The buffers of one dispatch + combine on this rank.
struct Step {
    x: CudaSlice<bf16>,
    idx: CudaSlice<i64>,
    w: CudaSlice<f32>,
    out_x: CudaSlice<bf16>,
    out_w: CudaSlice<f32>,
    counts: CudaSlice<i64>,
    y: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    tokens: usize,
}

impl Step {
    fn new(cx: &Ctx, plan: &MoePlan, x: &[bf16], r: &Routing, out_rows: usize) -> Result<Self, String> {
        let s = &cx.stream;
        let tokens = r.tokens(TOP_K);
        let poisoned = |n: usize| -> Result<CudaSlice<bf16>, String> {
            s.clone_htod(&vec![poison(); n.max(1)]).map_err(|e| e.to_string())
        };
        Ok(Self {
            x: upload(s, x)?,
            idx: upload(s, &r.idx)?,
            w: upload(s, &r.weights)?,
            out_x: poisoned(out_rows * HIDDEN)?,
            out_w: upload(s, &vec![-1.0f32; out_rows.max(1)])?,
            counts: upload(s, &vec![-1i64; plan.local_experts])?,
            y: poisoned(out_rows * HIDDEN)?,
            out: poisoned(tokens * HIDDEN)?,
            tokens,
        })
    }

    /// Dispatches the step's first `tokens` rows with their routing.
    fn dispatch(&mut self, comm: &Comm, moe: &Moe, s: &Arc<CudaStream>) -> Result<(), String> {
        let n = self.tokens;
        let (x, idx, w) = (
            self.x.slice(..n * HIDDEN),
            self.idx.slice(..n * TOP_K),
            self.w.slice(..n * TOP_K),
        );
        moe.dispatch(comm, &x, &idx, &w, &mut self.out_x, &mut self.out_w, &mut self.counts, s)
            .map_err(err("dispatch"))
    }

    fn combine(&mut self, comm: &Comm, moe: &Moe, s: &Arc<CudaStream>) -> Result<(), String> {
        let mut out = self.out.slice_mut(..self.tokens * HIDDEN);
        moe.combine(comm, &self.y, &mut out, s).map_err(err("combine"))
    }

    fn refs(&self) -> StepRefs<'_> {
        StepRefs {
            x: &self.x,
            idx: &self.idx,
            w: &self.w,
            out_x: &self.out_x,
            out_w: &self.out_w,
            counts: &self.counts,
            y: &self.y,
            out: &self.out,
            tokens: self.tokens,
        }
    }
}

/// Checks rank `me`'s dispatch output against the reference; returns the expected y.
fn check_dispatch(
    plan: &MoePlan,
    xs: &[Vec<bf16>],
    routings: &[Routing],
    me: usize,
    got: (&[bf16], &[f32], &[i64]),
) -> Result<Vec<bf16>, String> {
    let want = reference::received(plan, routings, me);
    let (out_x, out_w, counts) = got;
    let mut y = vec![bf16::from_f32(0.0); out_x.len()];
    for (le, group) in want.groups.iter().enumerate() {
        if counts[le] != group.len() as i64 {
            return Err(format!("expert {le}: {} rows, expected {}", counts[le], group.len()));
        }
        for (i, src) in group.iter().enumerate() {
            let row = want.bases[le] + i;
            let x = &xs[src.rank][src.token * HIDDEN..(src.token + 1) * HIDDEN];
            if out_x[row * HIDDEN..(row + 1) * HIDDEN] != *x {
                return Err(format!(
                    "expert {le} row {i} (output row {row}): not token {} of rank {}",
                    src.token, src.rank
                ));
            }
            let w = routings[src.rank].weights[src.token * TOP_K + src.entry];
            if out_w[row].to_bits() != w.to_bits() {
                return Err(format!("output row {row}: weight {} expected {w}", out_w[row]));
            }
            let e = me * plan.local_experts + le;
            y[row * HIDDEN..(row + 1) * HIDDEN].copy_from_slice(&expert(e, x));
        }
    }
    Ok(y)
}

/// Every rank's routing and rows of case `case` (the same on every rank).
fn case_inputs(cx: &Ctx, plan: &MoePlan, kind: Kind, case: u64) -> (Vec<Routing>, Vec<Vec<bf16>>) {
    let world = cx.comm.world_size();
    let routings: Vec<Routing> = (0..world).map(|r| routing(cx, plan, kind, case, r).1).collect();
    let xs = (0..world)
        .map(|r| rows(cx, case, r, routings[r].tokens(TOP_K)))
        .collect();
    (routings, xs)
}

/// Reads a step's dispatch output back and checks it (the stream is waited for); returns
/// the experts' outputs for it.
fn read_dispatch(cx: &Ctx, plan: &MoePlan, step: &Step, xs: &[Vec<bf16>], routings: &[Routing]) -> Result<Vec<bf16>, String> {
    let s = &cx.stream;
    let out_x = s.clone_dtoh(&step.out_x).map_err(|e| e.to_string())?;
    let out_w = s.clone_dtoh(&step.out_w).map_err(|e| e.to_string())?;
    let counts = s.clone_dtoh(&step.counts).map_err(|e| e.to_string())?;
    check_dispatch(plan, xs, routings, cx.comm.rank(), (&out_x, &out_w, &counts))
}

/// Checks `got` (a combine's output) against the reference for rank me's tokens.
fn check_combined(plan: &MoePlan, routing: &Routing, x: &[bf16], got: &[bf16]) -> Result<(), String> {
    let want = reference::combine(plan, routing, |e, t| expert(e, &x[t * HIDDEN..(t + 1) * HIDDEN]));
    let n = routing.tokens(TOP_K) * HIDDEN;
    match (0..n).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        None => Ok(()),
        Some(i) => Err(format!("token {} element {}: {} expected {}", i / HIDDEN, i % HIDDEN, got[i], want[i])),
    }
}

/// One case end to end: dispatch, experts on the host, combine; both checked bit for bit.
fn run_case(cx: &Ctx, moe: &Moe, kind: Kind, case: u64) -> Result<(usize, usize), String> {
    let me = cx.comm.rank();
    let plan = *moe.plan();
    let (routings, xs) = case_inputs(cx, &plan, kind, case);
    let out_rows = plan.worst_case_out_rows();
    let mut step = Step::new(cx, &plan, &xs[me], &routings[me], out_rows)?;
    step.dispatch(&cx.comm, moe, &cx.stream)?;
    let checked = moe.check(&cx.stream);
    // Entries that are neither -1 nor valid: each Invalid token's first entry at least.
    let mine = &routings[me];
    let bad = (0..mine.tokens(TOP_K))
        .flat_map(|t| {
            reference::entries(&mine.idx, TOP_K, plan.config.experts, t)
                .into_iter()
                .zip(&mine.idx[t * TOP_K..(t + 1) * TOP_K])
                .filter(|(e, &i)| e.is_none() && i != -1)
                .collect::<Vec<_>>()
        })
        .count();
    match (bad, checked) {
        (0, Ok(())) => {}
        (n, Err(e)) if n > 0 && e.to_string().contains("dropped") => {}
        (n, other) => return Err(format!("{kind:?}: {n} bad ids, check gave {other:?}")),
    }
    let s = &cx.stream;
    let y = read_dispatch(cx, &plan, &step, &xs, &routings).map_err(|e| format!("{kind:?} dispatch: {e}"))?;
    s.memcpy_htod(&y, &mut step.y).map_err(|e| e.to_string())?;
    step.combine(&cx.comm, moe, s)?;
    cx.sync()?;
    let got = s.clone_dtoh(&step.out).map_err(|e| e.to_string())?;
    check_combined(&plan, &routings[me], &xs[me], &got).map_err(|e| format!("{kind:?} combine: {e}"))?;
    let counts = s.clone_dtoh(&step.counts).map_err(|e| e.to_string())?;
    Ok((step.tokens, counts.iter().sum::<i64>() as usize))
}

fn check_routings(cx: &Ctx) -> Detail {
    let moe = cx.comm.moe(config(cx.comm.world_size())).map_err(err("moe"))?;
    let kinds = [Kind::Uniform, Kind::Skewed, Kind::OneRank, Kind::Dropped, Kind::EmptyRank, Kind::Invalid];
    let mut seen = Vec::new();
    for (case, kind) in kinds.into_iter().enumerate() {
        cx.host_barrier()?;
        let (tokens, rows) = run_case(cx, &moe, kind, case as u64)?;
        seen.push(format!("{kind:?} {tokens}->{rows}"));
    }
    Ok(format!(
        "{} path, {} experts, top-{TOP_K}, hidden {HIDDEN} bf16, align {ALIGN}; tokens sent -> expert rows received on this rank: {}; dispatch rows, weights, counts and combined rows bit for bit",
        if moe.is_direct() { "direct" } else { "all-to-all-v" },
        4 * cx.comm.world_size(),
        seen.join(", ")
    ))
}

fn check_batch_invariant(cx: &Ctx) -> Detail {
    let (me, world) = (cx.comm.rank(), cx.comm.world_size());
    let moe = cx.comm.moe(config(world)).map_err(err("moe"))?;
    let plan = *moe.plan();
    let (_, full) = routing(cx, &plan, Kind::Uniform, 40, me);
    let tokens = full.tokens(TOP_K).max(1);
    let x = rows(cx, 40, me, tokens);
    let identity_out = |batch: usize| -> Result<Vec<bf16>, String> {
        let r = Routing {
            idx: full.idx[..batch * TOP_K].to_vec(),
            weights: full.weights[..batch * TOP_K].to_vec(),
        };
        let mut step = Step::new(cx, &plan, &x[..batch * HIDDEN], &r, plan.worst_case_out_rows().min(8192))?;
        cx.host_barrier()?;
        step.dispatch(&cx.comm, &moe, &cx.stream)?;
        // The experts: identity (y = the dispatched rows).
        let out_x = cx.stream.clone_dtoh(&step.out_x).map_err(|e| e.to_string())?;
        cx.stream.memcpy_htod(&out_x, &mut step.y).map_err(|e| e.to_string())?;
        step.combine(&cx.comm, &moe, &cx.stream)?;
        cx.sync()?;
        moe.check(&cx.stream).map_err(|e| e.to_string())?;
        cx.stream.clone_dtoh(&step.out).map_err(|e| e.to_string())
    };
    let all = identity_out(tokens)?;
    let half = identity_out(tokens.div_ceil(2))?;
    let one = identity_out(1)?;
    let row0 = &all[..HIDDEN];
    if half[..HIDDEN] != *row0 || one[..HIDDEN] != *row0 {
        return Err("token 0's combined row differs between batches of 1, half and all tokens".into());
    }
    let h = tokens.div_ceil(2) * HIDDEN;
    if half[..h] != all[..h] {
        return Err("the first half of the tokens combine differently alone".into());
    }
    Ok(format!("batches of 1, {} and {tokens} tokens: the shared tokens' rows identical", tokens.div_ceil(2)))
}

/// A step's buffers as a graph check captures them (the bf16 steps of both checks).
struct StepRefs<'a> {
    x: &'a CudaSlice<bf16>,
    idx: &'a CudaSlice<i64>,
    w: &'a CudaSlice<f32>,
    out_x: &'a CudaSlice<bf16>,
    out_w: &'a CudaSlice<f32>,
    counts: &'a CudaSlice<i64>,
    y: &'a CudaSlice<bf16>,
    out: &'a CudaSlice<bf16>,
    tokens: usize,
}

/// The graph of one step of `b.tokens` rows: dispatch (bf16 rows out), identity experts
/// (y = out_x, a device copy) and combine. The device addresses are taken before the capture
/// and the raw calls run inside it (cudarc's event tracking may not record events into a
/// capture).
fn capture_identity_step(cx: &Ctx, moe: &Moe, b: StepRefs<'_>, out_rows: usize) -> Result<cudarc::driver::CudaGraph, String> {
    let (comm, s) = (&cx.comm, &cx.stream);
    let bytes = out_rows * HIDDEN * 2;
    let ptr = |p: (u64, cudarc::driver::SyncOnDrop<'_>)| p.0;
    let buffers = DispatchBuffers {
        x: ptr(b.x.device_ptr(s)),
        topk_idx: ptr(b.idx.device_ptr(s)),
        topk_weights: ptr(b.w.device_ptr(s)),
        tokens: b.tokens,
        out_x: ptr(b.out_x.device_ptr(s)),
        out_scales: 0,
        out_weights: ptr(b.out_w.device_ptr(s)),
        out_rows,
        expert_counts: ptr(b.counts.device_ptr(s)),
    };
    let (y, out) = (ptr(b.y.device_ptr(s)), ptr(b.out.device_ptr(s)));
    cx.capture(|| -> Result<(), String> {
        // SAFETY: every buffer is the step's, sized for `tokens` and `out_rows`, alive until
        // the graph's last replay (the caller keeps the step).
        unsafe {
            moe.dispatch_raw(comm, buffers, s).map_err(err("dispatch"))?;
            devcomm::testing::memcpy_dtod_async(y, buffers.out_x, bytes, s).map_err(|e| e.to_string())?;
            moe.combine_raw(comm, (y, bytes), (out, b.tokens * HIDDEN * 2), s).map_err(err("combine"))
        }
    })
}

/// One replay: this rank's routing and rows into the step's inputs (`idx`, `w`, `x`), the
/// graph launched on every rank, then the layer's error check.
fn replay(
    cx: &Ctx,
    moe: &Moe,
    graph: &cudarc::driver::CudaGraph,
    (idx, w, x): (&mut CudaSlice<i64>, &mut CudaSlice<f32>, &mut CudaSlice<bf16>),
    (r, rows): (&Routing, &[bf16]),
) -> Result<(), String> {
    let s = &cx.stream;
    s.memcpy_htod(&r.idx, idx).map_err(|e| e.to_string())?;
    s.memcpy_htod(&r.weights, w).map_err(|e| e.to_string())?;
    s.memcpy_htod(rows, x).map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    graph.launch().map_err(|e| e.to_string())?;
    cx.sync()?;
    moe.check(s).map_err(|e| e.to_string())
}

fn check_graph(cx: &Ctx, replays: usize) -> Detail {
    let (me, world) = (cx.comm.rank(), cx.comm.world_size());
    let moe = cx.comm.moe(config(world)).map_err(err("moe"))?;
    let plan = *moe.plan();
    let tokens = MAX_TOKENS / 2;
    // Fixed token count, new routings and rows each replay (same buffers).
    let case_of = |i: usize| -> (Vec<Routing>, Vec<Vec<bf16>>) {
        let rs = fixed_routings(cx, &plan, 100 + i as u64, tokens);
        let xs = (0..world).map(|r| rows(cx, 100 + i as u64, r, tokens)).collect();
        (rs, xs)
    };
    let (r0, x0) = case_of(0);
    let out_rows = plan.worst_case_out_rows().min(8192);
    let mut step = Step::new(cx, &plan, &x0[me], &r0[me], out_rows)?;
    cx.host_barrier()?;
    let graph = capture_identity_step(cx, &moe, step.refs(), out_rows)?;
    for i in 0..replays {
        let (rs, xs) = case_of(i);
        let inputs = (&mut step.idx, &mut step.w, &mut step.x);
        replay(cx, &moe, &graph, inputs, (&rs[me], &xs[me])).map_err(|e| format!("replay {i}: {e}"))?;
        let got = cx.stream.clone_dtoh(&step.out).map_err(|e| e.to_string())?;
        let x = &xs[me];
        let want = reference::combine(&plan, &rs[me], |_, t| x[t * HIDDEN..(t + 1) * HIDDEN].to_vec());
        if got[..tokens * HIDDEN].iter().zip(&want).any(|(a, b)| a.to_bits() != b.to_bits()) {
            return Err(format!("replay {i}: the combined rows differ from the reference"));
        }
    }
    Ok(format!("{replays} replays of dispatch + identity experts + combine, {tokens} tokens a rank, a new routing and rows each, every replay bit for bit"))
}

fn check_errors(cx: &Ctx) -> Detail {
    let (me, world) = (cx.comm.rank(), cx.comm.world_size());
    let moe = cx.comm.moe(config(world)).map_err(err("moe"))?;
    let plan = *moe.plan();
    // Too many tokens: refused before anything is enqueued.
    let big = vec![bf16::from_f32(1.0); (MAX_TOKENS + 1) * HIDDEN];
    let big_r = Routing {
        idx: vec![0; (MAX_TOKENS + 1) * TOP_K],
        weights: vec![1.0; (MAX_TOKENS + 1) * TOP_K],
    };
    let mut step = Step::new(cx, &plan, &big, &big_r, 16)?;
    let refused = match step.dispatch(&cx.comm, &moe, &cx.stream) {
        Err(e) if e.contains("max_tokens") => e,
        other => return Err(format!("{} tokens not refused: {other:?}", MAX_TOKENS + 1)),
    };
    // An output of 16 rows for a routing that sends every token to expert 0 (rank 0's):
    // rank 0 needs more, reports it and leaves every row as it was; the combine gives zeros.
    let tokens = 40;
    let r = Routing {
        idx: (0..tokens * TOP_K).map(|i| if i % TOP_K == 0 { 0 } else { -1 }).collect(),
        weights: vec![1.0; tokens * TOP_K],
    };
    let x = rows(cx, 7, me, tokens);
    let mut step = Step::new(cx, &plan, &x, &r, 16)?;
    cx.host_barrier()?;
    step.dispatch(&cx.comm, &moe, &cx.stream)?;
    let reported = moe.check(&cx.stream);
    let out_x = cx.stream.clone_dtoh(&step.out_x).map_err(|e| e.to_string())?;
    if out_x.iter().any(|v| *v != poison()) {
        return Err("an output too small was written to".into());
    }
    let needed = (tokens * world).div_ceil(ALIGN) * ALIGN;
    match (&reported, me) {
        (Err(e), 0) if e.to_string().contains(&format!("needs {needed} rows and holds 16")) => {}
        (Ok(()), r) if r != 0 => {}
        _ => return Err(format!("rank {me}: overflow report {reported:?}")),
    }
    step.combine(&cx.comm, &moe, &cx.stream)?;
    cx.sync()?;
    let out = cx.stream.clone_dtoh(&step.out).map_err(|e| e.to_string())?;
    // Every token went to rank 0 only, whose experts' part comes back as zeros.
    if out[..tokens * HIDDEN].iter().any(|v| v.to_f32() != 0.0) {
        return Err("the combine after an overflow is not all zeros".into());
    }
    cx.host_barrier()?;
    Ok(format!(
        "{} tokens refused ({refused}); an output of 16 rows for {needed} needed: reported on rank 0, nothing written, combine zeros",
        MAX_TOKENS + 1
    ))
}
