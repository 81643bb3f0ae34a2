//! `devcomm selftest` check of the reductions' call agreement across the wrap of its 16-bit
//! call numbers (docs/PROTOCOL.md, "Agreement", reductions): a kernel block that first runs at
//! call 65,536, and one that sat out exactly 65,536 calls, must wait for their peers' words of
//! the current call instead of taking a never-written entry (0) or the stale word of the call
//! 65,536 before for it (whose payload differs here: a false `CallMismatch`).
//!
//! On a communicator of its own (its calls numbered from 1) whose tuning table gives the
//! all-reduces of TINY f32 one block and the larger ones every block a one-shot may take,
//! calls 65,536 and 131,072 are multi-block all-reduces of two sizes and every other call a
//! 1-block one. Before each of the two, the ranks other than 0 wait 100 ms after a host
//! barrier, so that rank 0's blocks check their entries before the peers announce the call.
//! Both calls are verified element for element.

use std::time::Duration;

use devcomm::reduce::plan::Collective;
use devcomm::reduce::{Buffers, ReduceTuneEntry, ReduceTuneTable, TunedAlgorithm};
use devcomm::{DataType, ReduceOp};

use super::super::harness::{fresh_comm_with, verified, Checked, Ctx, Fresh, Outcome, Skip};

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The call numbers' period (call_word.cuh: the call's low 16 bits).
const PERIOD: u64 = 1 << 16;
/// Elements of the 1-block calls between the multi-block ones.
const TINY: usize = 2;
/// Elements of the two multi-block calls (one-shot payloads of 2 and 3 KiB).
const BIG: [usize; 2] = [512, 768];

/// Rank r's element i: small integers, so that f32 sums are exact in any order.
fn value(r: usize, i: usize) -> f32 {
    ((r + 1) * (i % 13 + 1)) as f32
}

pub(super) fn check_call_wrap(cx: &Ctx) -> Checked {
    if cx.comm.tuning().has_network_links() {
        return Ok(Outcome::Skip(Skip::Links(
            "with network links the reductions run as all-to-alls of the collective kernel, \
             whose agreement this check does not reach"
                .into(),
        )));
    }
    verified(wrap(cx))
}

fn wrap(cx: &Ctx) -> Result<String, String> {
    let table = table(cx)?;
    let mut n = 0;
    let f = fresh_comm_with(cx, "reduce_call_wrap", &mut n, |b| {
        b.device_timeout(Duration::from_secs(10))
            .reduce_tune_table(Some(table))
    })?;
    let blocks = |count: usize| -> Result<u32, String> {
        let plan = f
            .comm
            .tuning()
            .reduction_plan(Collective::AllReduce, DataType::F32, count as u64)
            .map_err(err)?
            .ok_or_else(|| format!("no plan for {count} elements"))?;
        Ok(plan.blocks)
    };
    let (tiny, a, b) = (blocks(TINY)?, blocks(BIG[0])?, blocks(BIG[1])?);
    if tiny != 1 || a < 2 || b < 2 {
        return Err(format!(
            "the table's plans have {tiny}, {a} and {b} blocks for {TINY}, {} and {} f32 \
             (1, then 2 or more each, wanted)",
            BIG[0], BIG[1]
        ));
    }
    // Call k of this communicator is numbered k: 65,535 tiny calls, A, 65,535 tiny, B.
    tiny_calls(&f, PERIOD - 1)?;
    big_call(cx, &f, BIG[0], PERIOD)?;
    tiny_calls(&f, PERIOD - 1)?;
    big_call(cx, &f, BIG[1], 2 * PERIOD)?;
    Ok(format!(
        "calls {PERIOD} ({} f32, {a} blocks) and {} ({} f32, {b} blocks) between 1-block \
         calls, peers 100 ms late: both verified",
        BIG[0],
        2 * PERIOD,
        BIG[1]
    ))
}

/// The fresh communicator's table: the one-shot on 1 block up to TINY f32, on every block
/// the limits give it up to the larger of BIG.
fn table(cx: &Ctx) -> Result<ReduceTuneTable, String> {
    let tuning = cx.comm.tuning();
    let most = tuning.reduction_limits().one_shot_blocks;
    let entry = |elems: usize, blocks: u32| ReduceTuneEntry {
        collective: Collective::AllReduce,
        buffers: Buffers::Ordinary,
        max_bytes: (elems * 4) as u64,
        algorithm: TunedAlgorithm::OneShot,
        blocks,
        pushed: false,
        us: 1.0,
        default_us: 1.0,
        nccl_us: 1.0,
    };
    let table = ReduceTuneTable {
        version: devcomm::reduce::tune::REDUCE_TUNE_VERSION,
        device: cx.comm.device_info().name.clone(),
        world_size: cx.comm.world_size(),
        date: "2026-11-28".into(),
        dtype: "f32".into(),
        window: tuning.reduction_window(),
        entries: vec![entry(TINY, 1), entry(BIG[1], most)],
    };
    table.check().map_err(|e| format!("the check's table: {e}"))?;
    Ok(table)
}

/// `calls` all-reduces of TINY elements, the last one verified.
fn tiny_calls(f: &Fresh, calls: u64) -> Result<(), String> {
    let (comm, s) = (&f.comm, &f.stream);
    let host: Vec<f32> = (0..TINY).map(|i| value(comm.rank(), i)).collect();
    let x = s.clone_htod(&host).map_err(err)?;
    let mut y = s.alloc_zeros::<f32>(TINY).map_err(err)?;
    for k in 0..calls {
        comm.all_reduce(&x, &mut y, ReduceOp::Sum, s)
            .map_err(|e| format!("tiny call {k}: {e}"))?;
    }
    comm.synchronize(s).map_err(|e| format!("the tiny calls: {e}"))?;
    verify(comm.world_size(), &s.clone_dtoh(&y).map_err(err)?, "the last tiny call")
}

/// One all-reduce of `count` elements as call number `call`, the peers of rank 0 late.
fn big_call(cx: &Ctx, f: &Fresh, count: usize, call: u64) -> Result<(), String> {
    let (comm, s) = (&f.comm, &f.stream);
    let host: Vec<f32> = (0..count).map(|i| value(comm.rank(), i)).collect();
    let x = s.clone_htod(&host).map_err(err)?;
    let mut y = s.alloc_zeros::<f32>(count).map_err(err)?;
    s.synchronize().map_err(err)?;
    cx.host_barrier()?;
    if comm.rank() != 0 {
        std::thread::sleep(Duration::from_millis(100));
    }
    comm.all_reduce(&x, &mut y, ReduceOp::Sum, s)
        .and_then(|()| comm.synchronize(s))
        .map_err(|e| format!("call {call} ({count} f32): {e}"))?;
    verify(comm.world_size(), &s.clone_dtoh(&y).map_err(err)?, &format!("call {call}"))?;
    cx.host_barrier()
}

/// Element i of an all-reduce of `value` over `world` ranks.
fn verify(world: usize, got: &[f32], what: &str) -> Result<(), String> {
    let sum = (world * (world + 1) / 2) as f32;
    match (0..got.len()).find(|&i| got[i] != (i % 13 + 1) as f32 * sum) {
        Some(i) => Err(format!("{what}: element {i} is {}, expected {}", got[i], (i % 13 + 1) as f32 * sum)),
        None => Ok(()),
    }
}
