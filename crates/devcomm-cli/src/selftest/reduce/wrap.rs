//! `devcomm selftest` check of the reductions' call agreement across the wrap of its 16-bit
//! call numbers (docs/PROTOCOL.md, "Agreement", reductions): a kernel block that first runs at
//! call 65,536, and one that sat out exactly 65,536 calls, must wait for their peers' words of
//! the current call instead of taking a never-written entry (0) or the stale word of the call
//! 65,536 before for it (whose payload differs here: a false `CallMismatch`).
//!
//! On a communicator of its own (its calls numbered from 1), with 1-block all-reduces between
//! them, calls 65,536 and 131,072 are multi-block all-reduces of two sizes. Before each, the
//! ranks other than 0 wait 100 ms after a host barrier, so that rank 0's blocks check their
//! entries before they announce the call. Both calls are verified element for element.

use std::time::Duration;

use devcomm::reduce::plan::Collective;
use devcomm::{DataType, ReduceOp};

use super::super::harness::{fresh_comm, verified, Checked, Ctx, Fresh, Outcome, Skip};

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The call numbers' period (call_word.cuh: the call's low 16 bits).
const PERIOD: u64 = 1 << 16;
/// Elements of the 1-block calls between the multi-block ones.
const TINY: usize = 2;
/// Candidate element counts of the multi-block calls: the first two that plan at least 2
/// blocks.
const BIG: &[usize] = &[1 << 18, (1 << 18) + 1024, 1 << 20, (1 << 20) + 4096, 1 << 22];

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
    let mut n = 0;
    let f = fresh_comm(cx, "reduce_call_wrap", &mut n, Duration::from_secs(10))?;
    let plan = |count: usize| {
        f.comm
            .tuning()
            .reduction_plan(Collective::AllReduce, DataType::F32, count as u64)
            .map_err(err)?
            .ok_or_else(|| format!("no plan for {count} elements"))
    };
    let tiny_blocks = plan(TINY)?.blocks;
    if tiny_blocks != 1 {
        return Err(format!("an all-reduce of {TINY} f32 plans {tiny_blocks} blocks, not 1"));
    }
    let mut big = Vec::new();
    for &c in BIG {
        if plan(c)?.blocks >= 2 && big.len() < 2 {
            big.push(c);
        }
    }
    let [a, b] = big[..] else {
        return Err(format!("fewer than two of {BIG:?} elements plan 2 blocks or more"));
    };
    let (ba, bb) = (plan(a)?.blocks, plan(b)?.blocks);
    // Call k of this communicator is numbered k: 65,535 tiny calls, A, 65,535 tiny, B.
    tiny_calls(&f, PERIOD - 1)?;
    big_call(cx, &f, a, PERIOD)?;
    tiny_calls(&f, PERIOD - 1)?;
    big_call(cx, &f, b, 2 * PERIOD)?;
    Ok(format!(
        "calls {PERIOD} ({a} f32, {ba} blocks) and {} ({b} f32, {bb} blocks) after 1-block \
         calls, peers 100 ms late: both verified",
        2 * PERIOD
    ))
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
