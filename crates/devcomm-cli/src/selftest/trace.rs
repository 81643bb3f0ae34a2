//! Checks of tracing (docs/TRACING.md) on a fresh communicator with `DEVCOMM_TRACE=1`: every
//! call's kernels leave begin and end events per block, on the host clock within the call's
//! time, with the host's call ids; the merged trace has every rank's kernels and passes the
//! Chrome format's rules; a tiny ring drops and counts, and works again after a read.

use std::time::Duration;

use devcomm::kernels::TRACE_OPTION;
use devcomm::trace::chrome::{self, spans};
use devcomm::trace::{now_ns, RankTrace};
use devcomm::{Comm, Config, KernelKind};

use super::harness::{fresh_comm_with, verified, Check, Ctx, Ranks};
use crate::trace::run_calls;

/// The group's checks, in run order.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "trace_off",
        ranks: Ranks::AtLeast(1),
        about: "tracing off: no events, no trace option in any kernel spec",
        run: |cx, _| verified(check_off(cx)),
    },
    Check {
        name: "trace_calls",
        ranks: Ranks::AtLeast(2),
        about: "send/recv, all-to-all, all-reduce traced: every block's kernel events, aligned, merged",
        run: |cx, p| verified(check_calls(cx, p.timeout)),
    },
    Check {
        name: "trace_overflow",
        ranks: Ranks::AtLeast(2),
        about: "a ring of 16 events drops and counts the rest, and records again after a read",
        run: |cx, p| verified(check_overflow(cx, p.timeout)),
    },
];

/// The calls of `trace_calls`: (operation, bytes per rank).
const CALLS: &[(&str, u64)] = &[
    ("sendrecv", 256 << 10),
    ("all_to_all", 1 << 20),
    ("all_reduce", 64 << 10),
    ("all_reduce", 8 << 20),
];
const ITERS: usize = 3;

fn traced(cx: &Ctx, tag: &str, events: u32, timeout: Duration) -> Result<super::Fresh, String> {
    let mut config = Config::from_env().map_err(|e| e.to_string())?;
    config.trace = true;
    config.trace_events = events;
    let mut n = 0;
    fresh_comm_with(cx, tag, &mut n, |b| b.config(config).device_timeout(timeout))
}

fn check_off(cx: &Ctx) -> Result<String, String> {
    if cx.comm.tracing() {
        return Ok("DEVCOMM_TRACE=1 in this run: nothing to check with tracing off".into());
    }
    let none = cx.comm.trace_events().map_err(|e| e.to_string())?;
    if none.is_some() {
        return Err("tracing is off but trace_events returned events".into());
    }
    let kinds = [KernelKind::SendRecv, KernelKind::barrier(true)];
    for kind in kinds {
        if cx.comm.kernel_spec(kind).options.iter().any(|o| o == TRACE_OPTION) {
            return Err(format!("tracing is off but {kind:?}'s spec has {TRACE_OPTION}"));
        }
    }
    Ok("no events, no trace option".into())
}

/// Checks one rank's trace of `expected` calls (operation names, in order) read at `read_ns`.
fn check_rank(t: &RankTrace, expected: &[&str], read_ns: u64) -> Result<usize, String> {
    let rank = t.rank;
    let ops: Vec<&str> = t.calls.iter().map(|c| c.op.as_str()).collect();
    if ops != expected {
        return Err(format!("rank {rank}: host calls {ops:?}, expected {expected:?}"));
    }
    if t.dropped != 0 {
        return Err(format!("rank {rank}: {} events dropped with the default ring", t.dropped));
    }
    let all = spans(t);
    // The clock's uncertainty (either measurement's) plus the granularity of %globaltimer.
    let rtt = t.clock_rtt_ns.max(t.clock_end.map_or(0, |c| c.rtt_ns));
    let slack = rtt as i64 + 20_000;
    for c in &t.calls {
        let mine: Vec<_> = all.iter().filter(|s| s.call == c.call).collect();
        let kernels: Vec<_> = mine.iter().filter(|s| s.what == "kernel").collect();
        if kernels.is_empty() {
            return Err(format!("rank {rank}: call {} ({}) has no kernel events", c.call, c.op));
        }
        for k in &kernels {
            let Some(end) = k.end else {
                return Err(format!("rank {rank}: call {} block {} began but never ended", c.call, k.block));
            };
            if k.begin < c.begin_ns as i64 - slack || end > read_ns as i64 + slack || end < k.begin {
                return Err(format!(
                    "rank {rank}: call {} block {}: kernel [{}, {end}] outside the call [{}, read {read_ns}] \
                     (clock offset {} ns, round trip {} ns)",
                    c.call, k.block, k.begin, c.begin_ns, t.clock_offset_ns, t.clock_rtt_ns
                ));
            }
        }
        for s in mine.iter().filter(|s| s.what != "kernel") {
            let within = kernels.iter().any(|k| {
                k.block == s.block && k.begin <= s.begin && s.end.unwrap_or(s.begin) <= k.end.unwrap_or(i64::MAX)
            });
            if !within {
                return Err(format!("rank {rank}: call {} block {}: {} outside its kernel", c.call, s.block, s.what));
            }
        }
    }
    Ok(t.events.len())
}

fn check_calls(cx: &Ctx, timeout: Duration) -> Result<String, String> {
    let fresh = traced(cx, "trace_calls", 1 << 20, timeout)?;
    let (comm, stream) = (&fresh.comm, &fresh.stream);
    for &(op, bytes) in CALLS {
        run_calls(comm, stream, op, bytes, ITERS)?;
    }
    let expected: Vec<&str> = CALLS.iter().flat_map(|&(op, _)| [op; ITERS]).collect();
    let t = comm.trace_events().map_err(|e| e.to_string())?.ok_or("tracing on but no trace")?;
    let events = check_rank(&t, &expected, now_ns())?;
    // Again, gathered and merged at rank 0.
    for &(op, bytes) in CALLS {
        run_calls(comm, stream, op, bytes, 1)?;
    }
    let merged = merged_check(comm, CALLS.len())?;
    let drift = t.clock_drift_ppm().map_or(
        "no drift estimate (the clock's measurements are under a second apart)".to_owned(),
        |ppm| format!("drift {ppm:.2} ppm"),
    );
    Ok(format!(
        "{} calls, {events} events on this rank, clock offset {} ns +- {} ns, {drift}{merged}",
        expected.len(),
        t.clock_offset_ns,
        t.clock_rtt_ns / 2
    ))
}

/// Gathers, merges and validates the trace at rank 0; every rank must have kernel slices of
/// every call.
fn merged_check(comm: &Comm, calls: usize) -> Result<String, String> {
    let path = std::env::temp_dir().join(format!("devcomm-trace-check-{}.json", std::process::id()));
    let summary = comm.write_trace(&path, None).map_err(|e| e.to_string())?;
    let Some(summary) = summary else {
        return Ok(String::new());
    };
    let text = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let _ = std::fs::remove_file(&path);
    let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    chrome::validate(&json)?;
    let events = json["traceEvents"].as_array().ok_or("no traceEvents")?;
    for rank in 0..comm.world_size() {
        let ids: std::collections::BTreeSet<u64> = events
            .iter()
            .filter(|e| e["pid"] == rank && e["cat"] == "kernel" && e["ph"] == "X")
            .filter_map(|e| e["args"]["call"].as_u64())
            .collect();
        if ids.len() != calls {
            return Err(format!("merged trace: rank {rank} has kernels of {} calls, not {calls}", ids.len()));
        }
    }
    Ok(format!("; merged {} events valid; summary:\n{summary}", events.len()))
}

fn check_overflow(cx: &Ctx, timeout: Duration) -> Result<String, String> {
    const CAPACITY: u32 = 16;
    let fresh = traced(cx, "trace_overflow", CAPACITY, timeout)?;
    let (comm, stream) = (&fresh.comm, &fresh.stream);
    run_calls(comm, stream, "all_reduce", 8 << 20, 4)?;
    let t = comm.trace_events().map_err(|e| e.to_string())?.ok_or("tracing on but no trace")?;
    if t.events.len() != CAPACITY as usize || t.dropped == 0 {
        return Err(format!(
            "ring of {CAPACITY}: {} events kept, {} dropped (expected {CAPACITY} kept, some dropped)",
            t.events.len(),
            t.dropped
        ));
    }
    if let Some(e) = t.events.iter().find(|e| devcomm::trace::Kind::from_u16(e.kind).is_none() || e.time_ns == 0) {
        return Err(format!("a kept record is damaged: {e:?}"));
    }
    let dropped = t.dropped;
    run_calls(comm, stream, "sendrecv", 4 << 10, 1)?;
    let again = comm.trace_events().map_err(|e| e.to_string())?.ok_or("no trace")?;
    if again.events.is_empty() || again.calls.len() != 1 {
        return Err(format!(
            "after a read the ring recorded {} events of {} calls (expected some, of 1)",
            again.events.len(),
            again.calls.len()
        ));
    }
    Ok(format!("{CAPACITY} kept, {dropped} dropped; {} events after the read", again.events.len()))
}
