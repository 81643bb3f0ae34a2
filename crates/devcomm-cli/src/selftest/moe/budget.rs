//! A layer held to an SM budget (decode's low-latency mode, docs/MOE.md "Modes"): the kernels
//! stride over whatever the budget leaves them, so every call gives the same bits.

use super::{config, err, run_case, Detail, Kind};
use crate::selftest::harness::Ctx;

/// Each rank's own budget (ranks may differ): 1, 3, 2 or 5 blocks.
const BUDGETS: [usize; 4] = [1, 3, 2, 5];

/// Dispatch + combine on four routings with every launch held to a few blocks, bit for bit
/// against the host reference; budgets of 0 and of more than 8 blocks a SM refused, the layer
/// unchanged by a refusal.
pub(super) fn check_sm_budget(cx: &Ctx) -> Detail {
    let me = cx.comm.rank();
    let mut moe = cx.comm.moe(config(cx.comm.world_size())).map_err(err("moe"))?;
    let budget = BUDGETS[me % BUDGETS.len()];
    moe.set_sm_budget(Some(budget)).map_err(err("set_sm_budget"))?;
    let sms = cx.comm.device_info().sm_count.max(1) as usize;
    for refused in [0, 8 * sms + 1] {
        match moe.set_sm_budget(Some(refused)) {
            Err(e) if e.to_string().contains("SM budget") => {}
            other => return Err(format!("a budget of {refused} blocks: {other:?}, expected a refusal")),
        }
    }
    if moe.sm_budget() != budget {
        return Err(format!("a refused budget changed the layer's: {} blocks, set {budget}", moe.sm_budget()));
    }
    let kinds = [Kind::Uniform, Kind::Skewed, Kind::OneRank, Kind::EmptyRank];
    let mut seen = Vec::new();
    for (case, kind) in kinds.into_iter().enumerate() {
        cx.host_barrier()?;
        let (tokens, rows) = run_case(cx, &moe, kind, 80 + case as u64)?;
        seen.push(format!("{kind:?} {tokens}->{rows}"));
    }
    Ok(format!(
        "{} path, launches held to {budget} blocks on this rank; tokens sent -> expert rows received: {}; bit for bit",
        if moe.is_direct() { "direct" } else { "all-to-all-v" },
        seen.join(", ")
    ))
}
