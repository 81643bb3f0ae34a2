//! Dispatches and combines back to back: the order that would show the direct path's
//! two-deep area reused too early or a call numbered wrong (docs/MOE.md, "How it runs").

use super::{case_inputs, check_combined, config, err, poison, read_dispatch, Detail, Kind, Step, HIDDEN};
use crate::selftest::harness::Ctx;

/// Three dispatches back to back (nothing waited for between them on any rank), two combines
/// of the last, then a dispatch and a combine again: every output bit for bit. The direct
/// path keeps rows and sums per call parity and numbers calls on the device; this is the
/// order that would show a slot reused too early or a call counted wrong.
pub(super) fn check_back_to_back(cx: &Ctx) -> Detail {
    let me = cx.comm.rank();
    let moe = cx.comm.moe(config(cx.comm.world_size())).map_err(err("moe"))?;
    let plan = *moe.plan();
    let out_rows = plan.worst_case_out_rows();
    let kinds = [Kind::Uniform, Kind::Skewed, Kind::Dropped, Kind::EmptyRank];
    let inputs: Vec<_> = kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| case_inputs(cx, &plan, k, 60 + i as u64))
        .collect();
    let mut steps = inputs
        .iter()
        .map(|(r, xs)| Step::new(cx, &plan, &xs[me], &r[me], out_rows))
        .collect::<Result<Vec<_>, _>>()?;
    let s = &cx.stream;
    cx.host_barrier()?;
    for step in &mut steps[..3] {
        step.dispatch(&cx.comm, &moe, s)?;
    }
    let mut ys = Vec::new();
    for (step, (routings, xs)) in steps.iter().zip(&inputs).take(3) {
        ys.push(read_dispatch(cx, &plan, step, xs, routings).map_err(|e| format!("dispatch {}: {e}", ys.len() + 1))?);
    }
    let (routings, xs) = &inputs[2];
    s.memcpy_htod(&ys[2], &mut steps[2].y).map_err(|e| e.to_string())?;
    let mut second = s.clone_htod(&vec![poison(); steps[2].tokens * HIDDEN + 1]).map_err(|e| e.to_string())?;
    steps[2].combine(&cx.comm, &moe, s)?;
    {
        let mut out = second.slice_mut(..steps[2].tokens * HIDDEN);
        moe.combine(&cx.comm, &steps[2].y, &mut out, s).map_err(err("second combine"))?;
    }
    cx.sync()?;
    for (which, buf) in [("first", &steps[2].out), ("second", &second)] {
        let got = s.clone_dtoh(buf).map_err(|e| e.to_string())?;
        check_combined(&plan, &routings[me], &xs[me], &got).map_err(|e| format!("{which} combine of dispatch 3: {e}"))?;
    }
    let (routings, xs) = &inputs[3];
    steps[3].dispatch(&cx.comm, &moe, s)?;
    let y = read_dispatch(cx, &plan, &steps[3], xs, routings).map_err(|e| format!("dispatch 4: {e}"))?;
    s.memcpy_htod(&y, &mut steps[3].y).map_err(|e| e.to_string())?;
    steps[3].combine(&cx.comm, &moe, s)?;
    cx.sync()?;
    let got = s.clone_dtoh(&steps[3].out).map_err(|e| e.to_string())?;
    check_combined(&plan, &routings[me], &xs[me], &got).map_err(|e| format!("combine of dispatch 4: {e}"))?;
    moe.check(s).map_err(|e| e.to_string())?;
    Ok(format!(
        "{} path: dispatch x3, combine x2, dispatch + combine; every output bit for bit",
        if moe.is_direct() { "direct" } else { "all-to-all-v" }
    ))
}
