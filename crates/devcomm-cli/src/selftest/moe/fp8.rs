//! Checks of MoE dispatch with FP8 (e4m3) on the wire (docs/MOE.md, "FP8 on the wire"): the
//! expert-major output bit for bit against the host reference's quantisation
//! (`reference::arrived`, `moe::fp8`) for per-row and per-128 scales, dequantised and as FP8 +
//! scales, and within e4m3's error of the rows sent; the combine after it bit for bit; graph
//! replays with new routings; hidden sizes FP8 cannot carry and the wrong call refused.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use devcomm::moe::fp8::{dequantise_row, quantisation_bound};
use devcomm::moe::reference::{self, Routing};
use devcomm::moe::{Fp8Output, Fp8Scales, Wire};
use devcomm::{Comm, Moe, MoeConfig, MoePlan};
use half::bf16;

use super::{
    capture_identity_step, config, err, expert, fixed_routings, poison, replay, routing, upload, Detail, Kind, StepRefs, HIDDEN, TOP_K,
};
use crate::selftest::Ctx;

/// Every FP8 wire: both scale kinds, both output forms.
const WIRES: [Wire; 4] = [
    Wire::Fp8 {
        scales: Fp8Scales::PerRow,
        output: Fp8Output::Dequantised,
    },
    Wire::Fp8 {
        scales: Fp8Scales::Per128,
        output: Fp8Output::Dequantised,
    },
    Wire::Fp8 {
        scales: Fp8Scales::PerRow,
        output: Fp8Output::Fp8,
    },
    Wire::Fp8 {
        scales: Fp8Scales::Per128,
        output: Fp8Output::Fp8,
    },
];

fn fp8_config(world: usize, wire: Wire) -> MoeConfig {
    MoeConfig {
        wire,
        ..config(world)
    }
}

/// Rank `rank`'s rows with magnitudes over twelve binades (so that a block's small elements
/// take subnormal e4m3 codes and its large ones the top of the range), exact in bf16.
fn rows(cx: &Ctx, case: u64, rank: usize, tokens: usize) -> Vec<bf16> {
    let b = cx.data_of(rank, 0xf8 ^ case, 2 * tokens * HIDDEN);
    b.chunks(2)
        .map(|p| bf16::from_f32((f32::from(p[0]) - 128.0) / 16.0 * 2f32.powi(-i32::from(p[1] % 12))))
        .collect()
}

/// The buffers of one FP8 dispatch + combine on this rank.
struct Step {
    x: CudaSlice<bf16>,
    idx: CudaSlice<i64>,
    w: CudaSlice<f32>,
    /// The dequantised rows (`Fp8Output::Dequantised`).
    out_x: CudaSlice<bf16>,
    /// The codes and scales (`Fp8Output::Fp8`).
    out_q: CudaSlice<u8>,
    out_s: CudaSlice<f32>,
    out_w: CudaSlice<f32>,
    counts: CudaSlice<i64>,
    y: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    tokens: usize,
    out_rows: usize,
}

/// What FP8 outputs hold before a call writes them.
const CODE_POISON: u8 = 0xa5;
const SCALE_POISON: f32 = -5.0;

impl Step {
    fn new(cx: &Ctx, plan: &MoePlan, x: &[bf16], r: &Routing, out_rows: usize) -> Result<Self, String> {
        let s = &cx.stream;
        let tokens = r.tokens(TOP_K);
        let fp8 = plan.config.wire.outputs_fp8();
        // Only the form's output is sized; the other stays one element.
        let (xr, qr) = if fp8 { (0, out_rows) } else { (out_rows, 0) };
        Ok(Self {
            x: upload(s, x)?,
            idx: upload(s, &r.idx)?,
            w: upload(s, &r.weights)?,
            out_x: upload(s, &vec![poison(); xr * HIDDEN])?,
            out_q: upload(s, &vec![CODE_POISON; qr * HIDDEN])?,
            out_s: upload(s, &vec![SCALE_POISON; qr * plan.scales])?,
            out_w: upload(s, &vec![-1.0f32; out_rows])?,
            counts: upload(s, &vec![-1i64; plan.local_experts])?,
            y: upload(s, &vec![poison(); out_rows * HIDDEN])?,
            out: upload(s, &vec![poison(); tokens * HIDDEN])?,
            tokens,
            out_rows,
        })
    }

    fn dispatch(&mut self, comm: &Comm, moe: &Moe, s: &Arc<CudaStream>) -> Result<(), String> {
        let n = self.tokens;
        let (x, idx, w) = (self.x.slice(..n * HIDDEN), self.idx.slice(..n * TOP_K), self.w.slice(..n * TOP_K));
        if moe.plan().config.wire.outputs_fp8() {
            let outs = (&mut self.out_q, &mut self.out_s);
            moe.dispatch_fp8(comm, &x, &idx, &w, outs, &mut self.out_w, &mut self.counts, s)
        } else {
            moe.dispatch(comm, &x, &idx, &w, &mut self.out_x, &mut self.out_w, &mut self.counts, s)
        }
        .map_err(err("dispatch"))
    }

    fn combine(&mut self, comm: &Comm, moe: &Moe, s: &Arc<CudaStream>) -> Result<(), String> {
        let mut out = self.out.slice_mut(..self.tokens * HIDDEN);
        moe.combine(comm, &self.y, &mut out, s).map_err(err("combine"))
    }

    /// Rank `me`'s output rows as the experts see them (dequantised on the host from the
    /// codes and scales for the FP8 form), checked against the reference bit for bit and the
    /// original rows within e4m3's error; returns them for the experts, with the rows
    /// received. With `fresh` (the outputs held the poison before the call), rows of padding
    /// and past the last group must still hold it.
    fn check_dispatch(&self, cx: &Ctx, plan: &MoePlan, xs: &[Vec<bf16>], routings: &[Routing], fresh: bool) -> Result<(Vec<bf16>, usize), String> {
        let s = &cx.stream;
        let me = cx.comm.rank();
        let fetch = |e: cudarc::driver::DriverError| e.to_string();
        let out_w = s.clone_dtoh(&self.out_w).map_err(fetch)?;
        let counts = s.clone_dtoh(&self.counts).map_err(fetch)?;
        let fp8 = plan.config.wire.outputs_fp8();
        let (out_x, out_q, out_s) = if fp8 {
            (Vec::new(), s.clone_dtoh(&self.out_q).map_err(fetch)?, s.clone_dtoh(&self.out_s).map_err(fetch)?)
        } else {
            (s.clone_dtoh(&self.out_x).map_err(fetch)?, Vec::new(), Vec::new())
        };
        let want = reference::received(plan, routings, me);
        let (sc, block) = (plan.scales, plan.scale_block);
        let mut seen = vec![bf16::from_f32(0.0); self.out_rows * HIDDEN];
        for (le, group) in want.groups.iter().enumerate() {
            if counts[le] != group.len() as i64 {
                return Err(format!("expert {le}: {} rows, expected {}", counts[le], group.len()));
            }
            for (i, src) in group.iter().enumerate() {
                let row = want.bases[le] + i;
                let x = &xs[src.rank][src.token * HIDDEN..(src.token + 1) * HIDDEN];
                let arrived = reference::arrived(plan, x);
                let (codes, scales) = arrived.fp8.as_ref().ok_or("no FP8 in the reference")?;
                let at = |what: &str| format!("expert {le} row {i} (output row {row}, token {} of rank {}): {what}", src.token, src.rank);
                // Bit for bit against the reference, then the values the experts see.
                let values: Vec<bf16> = if fp8 {
                    let q = &out_q[row * HIDDEN..(row + 1) * HIDDEN];
                    let sv = &out_s[row * sc..(row + 1) * sc];
                    if let Some(j) = (0..HIDDEN).find(|&j| q[j] != codes[j]) {
                        return Err(at(&format!("code {j} is {:#04x}, expected {:#04x}", q[j], codes[j])));
                    }
                    if let Some(b) = (0..sc).find(|&b| sv[b].to_bits() != scales[b].to_bits()) {
                        return Err(at(&format!("scale {b} is {}, expected {}", sv[b], scales[b])));
                    }
                    dequantise_row(q, sv, block)
                } else {
                    let got = &out_x[row * HIDDEN..(row + 1) * HIDDEN];
                    if let Some(j) = (0..HIDDEN).find(|&j| got[j].to_bits() != arrived.values[j].to_bits()) {
                        return Err(at(&format!("element {j} is {}, expected {}", got[j], arrived.values[j])));
                    }
                    got.to_vec()
                };
                // Within e4m3's error of the unquantised row (bf16: 7 explicit mantissa bits).
                for j in 0..HIDDEN {
                    let (a, b) = (x[j].to_f32(), values[j].to_f32());
                    let bound = quantisation_bound(a, scales[j / block], 7);
                    if (a - b).abs() > bound {
                        return Err(at(&format!("element {j}: {b} for {a}, more than e4m3's error {bound}")));
                    }
                }
                let w = routings[src.rank].weights[src.token * TOP_K + src.entry];
                if out_w[row].to_bits() != w.to_bits() {
                    return Err(at(&format!("weight {} expected {w}", out_w[row])));
                }
                seen[row * HIDDEN..(row + 1) * HIDDEN].copy_from_slice(&values);
            }
        }
        // Rows of padding (no expert's) are left as they were.
        let untouched = |row: usize| {
            if fp8 {
                out_q[row * HIDDEN..(row + 1) * HIDDEN].iter().all(|&q| q == CODE_POISON)
                    && out_s[row * sc..(row + 1) * sc].iter().all(|&v| v == SCALE_POISON)
            } else {
                out_x[row * HIDDEN..(row + 1) * HIDDEN].iter().all(|&v| v == poison())
            }
        };
        let used = *want.bases.last().unwrap_or(&0);
        let spare = (0..plan.local_experts).flat_map(|le| want.bases[le] + want.groups[le].len()..want.bases[le + 1]);
        if let Some(row) = spare.chain(used..self.out_rows).filter(|_| fresh).find(|&r| !untouched(r)) {
            return Err(format!("output row {row} (padding or past the groups) was written"));
        }
        Ok((seen, counts.iter().sum::<i64>() as usize))
    }
}

/// The y of `seen` (the rows the experts see): expert `e` of this rank on its rows.
fn experts_on(plan: &MoePlan, me: usize, seen: &[bf16], counts: &reference::Received) -> Vec<bf16> {
    let mut y = vec![bf16::from_f32(0.0); seen.len()];
    for (le, group) in counts.groups.iter().enumerate() {
        for i in 0..group.len() {
            let row = counts.bases[le] + i;
            let e = me * plan.local_experts + le;
            y[row * HIDDEN..(row + 1) * HIDDEN].copy_from_slice(&expert(e, &seen[row * HIDDEN..(row + 1) * HIDDEN]));
        }
    }
    y
}

/// The reference combine of rank `me`'s tokens when each expert works on the rows as FP8
/// delivered them (`arrived`), `f` the expert.
fn combined(plan: &MoePlan, mine: &Routing, x: &[bf16], f: impl Fn(usize, &[bf16]) -> Vec<bf16>) -> Vec<bf16> {
    reference::combine(plan, mine, |e, t| f(e, &reference::arrived(plan, &x[t * HIDDEN..(t + 1) * HIDDEN]).values))
}

/// One FP8 case end to end: dispatch (checked), experts on the host, combine (checked).
fn run_case(cx: &Ctx, moe: &Moe, kind: Kind, case: u64) -> Result<(usize, usize), String> {
    let (me, world) = (cx.comm.rank(), cx.comm.world_size());
    let plan = *moe.plan();
    let routings: Vec<Routing> = (0..world).map(|r| routing(cx, &plan, kind, case, r).1).collect();
    let xs: Vec<Vec<bf16>> = (0..world).map(|r| rows(cx, case, r, routings[r].tokens(TOP_K))).collect();
    let mut step = Step::new(cx, &plan, &xs[me], &routings[me], plan.worst_case_out_rows())?;
    cx.host_barrier()?;
    step.dispatch(&cx.comm, moe, &cx.stream)?;
    moe.check(&cx.stream).map_err(err("check"))?;
    let (seen, received) = step.check_dispatch(cx, &plan, &xs, &routings, true)?;
    let want = reference::received(&plan, &routings, me);
    let y = experts_on(&plan, me, &seen, &want);
    cx.stream.memcpy_htod(&y, &mut step.y).map_err(|e| e.to_string())?;
    step.combine(&cx.comm, moe, &cx.stream)?;
    cx.sync()?;
    let got = cx.stream.clone_dtoh(&step.out).map_err(|e| e.to_string())?;
    let want = combined(&plan, &routings[me], &xs[me], expert);
    let n = step.tokens * HIDDEN;
    if let Some(i) = (0..n).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        return Err(format!("combine: token {} element {}: {} expected {}", i / HIDDEN, i % HIDDEN, got[i], want[i]));
    }
    Ok((step.tokens, received))
}

pub(super) fn check_fp8(cx: &Ctx) -> Detail {
    let world = cx.comm.world_size();
    let mut seen = Vec::new();
    for (w, wire) in WIRES.into_iter().enumerate() {
        let moe = cx.comm.moe(fp8_config(world, wire)).map_err(err("moe"))?;
        for (k, kind) in [Kind::Uniform, Kind::Dropped, Kind::EmptyRank].into_iter().enumerate() {
            let case = 200 + (w * 3 + k) as u64;
            let (tokens, rows) = run_case(cx, &moe, kind, case).map_err(|e| format!("{} {kind:?}: {e}", wire.name()))?;
            seen.push(format!("{} {kind:?} {tokens}->{rows}", wire.name()));
        }
    }
    Ok(format!(
        "hidden {HIDDEN} bf16 as e4m3; tokens sent -> expert rows received on this rank: {}; codes, scales or dequantised rows, weights, counts and combined rows bit for bit, every element within e4m3's error",
        seen.join(", ")
    ))
}

pub(super) fn check_fp8_graph(cx: &Ctx, replays: usize) -> Detail {
    let (me, world) = (cx.comm.rank(), cx.comm.world_size());
    let wire = Wire::Fp8 {
        scales: Fp8Scales::Per128,
        output: Fp8Output::Dequantised,
    };
    let moe = cx.comm.moe(fp8_config(world, wire)).map_err(err("moe"))?;
    let plan = *moe.plan();
    let tokens = super::MAX_TOKENS / 2;
    // Fixed token count, new routings and rows each replay (same buffers).
    let case_of = |i: usize| -> (Vec<Routing>, Vec<Vec<bf16>>) {
        let rs = fixed_routings(cx, &plan, 300 + i as u64, tokens);
        let xs = (0..world).map(|r| rows(cx, 300 + i as u64, r, tokens)).collect();
        (rs, xs)
    };
    let (r0, x0) = case_of(0);
    let out_rows = plan.worst_case_out_rows().min(8192);
    let mut step = Step::new(cx, &plan, &x0[me], &r0[me], out_rows)?;
    cx.host_barrier()?;
    let s = &cx.stream;
    let refs = StepRefs {
        x: &step.x,
        idx: &step.idx,
        w: &step.w,
        out_x: &step.out_x,
        out_w: &step.out_w,
        counts: &step.counts,
        y: &step.y,
        out: &step.out,
        tokens,
    };
    // Identity experts inside the graph: y = the dequantised rows.
    let graph = capture_identity_step(cx, &moe, refs, out_rows)?;
    for i in 0..replays {
        let (rs, xs) = case_of(i);
        let inputs = (&mut step.idx, &mut step.w, &mut step.x);
        replay(cx, &moe, &graph, inputs, (&rs[me], &xs[me])).map_err(|e| format!("replay {i}: {e}"))?;
        // Every fifth replay: the dispatch's rows too (a host pass over every row; earlier
        // replays' rows may sit in this one's padding).
        if i % 5 == 0 {
            step.check_dispatch(cx, &plan, &xs, &rs, false).map_err(|e| format!("replay {i} dispatch: {e}"))?;
        }
        let got = s.clone_dtoh(&step.out).map_err(|e| e.to_string())?;
        let want = combined(&plan, &rs[me], &xs[me], |_, row| row.to_vec());
        if got[..tokens * HIDDEN].iter().zip(&want).any(|(a, b)| a.to_bits() != b.to_bits()) {
            return Err(format!("replay {i}: the combined rows differ from the reference"));
        }
    }
    Ok(format!(
        "{replays} replays of {} dispatch + identity experts + combine, {tokens} tokens a rank, a new routing and rows each, every replay's combine (and every fifth's dispatch) bit for bit",
        wire.name()
    ))
}

pub(super) fn check_fp8_refused(cx: &Ctx) -> Detail {
    let world = cx.comm.world_size();
    let mut said = Vec::new();
    // Per-128 scales need whole blocks; per row, whole 16-byte units of e4m3.
    for (scales, hidden, expect) in [(Fp8Scales::Per128, 200, "multiple of 128"), (Fp8Scales::PerRow, 200, "multiple of 16")] {
        let c = MoeConfig {
            hidden,
            ..fp8_config(world, Wire::Fp8 { scales, output: Fp8Output::Dequantised })
        };
        match cx.comm.moe(c) {
            Err(e @ devcomm::Error::InvalidArgument { .. }) if e.to_string().contains(expect) => said.push(e.to_string()),
            other => return Err(format!("hidden {hidden} with {scales:?} scales: {other:?}")),
        }
    }
    // A layer that returns FP8 refuses the dequantised form's call (and the reverse), before
    // anything runs.
    let fp8 = cx.comm.moe(fp8_config(world, WIRES[3])).map_err(err("moe"))?;
    let r = Routing {
        idx: vec![0; 4 * TOP_K],
        weights: vec![1.0; 4 * TOP_K],
    };
    let x = vec![bf16::from_f32(1.0); 4 * HIDDEN];
    let mut step = Step::new(cx, fp8.plan(), &x, &r, 16)?;
    let mut out_x = upload(&cx.stream, &vec![poison(); 16 * HIDDEN])?;
    match fp8.dispatch(&cx.comm, &step.x, &step.idx, &step.w, &mut out_x, &mut step.out_w, &mut step.counts, &cx.stream) {
        Err(e) if e.to_string().contains("dispatch_fp8") => said.push(e.to_string()),
        other => return Err(format!("dispatch on an FP8-output layer: {other:?}")),
    }
    let deq = cx.comm.moe(fp8_config(world, WIRES[1])).map_err(err("moe"))?;
    let outs = (&mut step.out_q, &mut step.out_s);
    match deq.dispatch_fp8(&cx.comm, &step.x, &step.idx, &step.w, outs, &mut step.out_w, &mut step.counts, &cx.stream) {
        Err(e) if e.to_string().contains("does not return FP8") => said.push(e.to_string()),
        other => return Err(format!("dispatch_fp8 on a dequantising layer: {other:?}")),
    }
    Ok(said.join("; "))
}
