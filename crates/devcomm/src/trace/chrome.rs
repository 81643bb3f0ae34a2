//! Every rank's [`RankTrace`] merged onto one clock as one Chrome trace (JSON Object Format:
//! `traceEvents` and `displayTimeUnit`), which Perfetto and `chrome://tracing` open.
//!
//! Clock: a device event at `%globaltimer` t happened at host time `RankTrace::host_ns(t)`:
//! t minus the offset interpolated between the rank's two clock measurements
//! (`CLOCK_REALTIME`, shared by the ranks of a host); the earliest event of the job is time 0.
//! Tracks: one process per rank (`pid` = rank), in it one thread per host stream (`tid` =
//! [`HOST_TID`] + the stream's index on that rank) and per GPU block (`tid` = [`BLOCK_TID`] +
//! 2 * block, and + 1 for a block's receive role, which may overlap its send role in one
//! block). Host calls, kernels, phases and waits are complete events (`"ph": "X"`); unmatched
//! begins and byte counts are instants (`"ph": "i"`); `"ph": "M"` events name the tracks.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::ring::{phase_name, Kind, NO_PEER};
use super::{HostCall, RankTrace};

/// First `tid` of a rank's host streams.
pub const HOST_TID: u64 = 1;
/// First `tid` of a rank's GPU blocks.
pub const BLOCK_TID: u64 = 1000;

/// A device interval or instant of one rank, on the host clock (ns).
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// The call id.
    pub call: u32,
    /// The block.
    pub block: u16,
    /// `kernel`, a phase's name, or `wait`.
    pub what: String,
    /// The phase number (0: the kernel).
    pub phase: u16,
    /// The peer, if any.
    pub peer: Option<usize>,
    /// The slot waited on (waits).
    pub slot: u32,
    /// Begin and end on the host clock; an instant or unfinished interval has `end == None`.
    pub begin: i64,
    /// See `begin`.
    pub end: Option<i64>,
    /// Bytes (phase ends, byte instants).
    pub bytes: u64,
}

/// The device spans of one rank: each begin paired with the next end of the same call, block,
/// kind and phase (and peer), on the host clock.
pub fn spans(trace: &RankTrace) -> Vec<Span> {
    let mut events: Vec<_> = trace.events.iter().collect();
    events.sort_by_key(|e| e.time_ns);
    let at = |t: u64| trace.host_ns(t);
    let peer = |p: u16| (p != NO_PEER).then_some(p as usize);
    // Open begins by (call, block, pairing kind, phase, peer): a stack each.
    let mut open: BTreeMap<(u32, u16, u16, u16, u16), Vec<usize>> = BTreeMap::new();
    let mut out: Vec<Span> = Vec::new();
    for e in events {
        let Some(kind) = Kind::from_u16(e.kind) else {
            continue;
        };
        let (pair, what) = match kind {
            Kind::KernelBegin | Kind::KernelEnd => (1, "kernel".to_owned()),
            Kind::PhaseBegin | Kind::PhaseEnd => (2, phase_name(e.phase)),
            Kind::WaitBegin | Kind::WaitEnd => (3, "wait".to_owned()),
            Kind::Bytes => (0, "bytes".to_owned()),
        };
        let key = (
            e.call,
            e.block,
            pair,
            e.phase,
            if pair == 1 { 0 } else { e.peer },
        );
        match kind {
            Kind::KernelBegin | Kind::PhaseBegin | Kind::WaitBegin | Kind::Bytes => {
                if kind != Kind::Bytes {
                    open.entry(key).or_default().push(out.len());
                }
                out.push(Span {
                    call: e.call,
                    block: e.block,
                    what,
                    phase: if pair == 1 { 0 } else { e.phase },
                    peer: peer(e.peer),
                    slot: e.slot,
                    begin: at(e.time_ns),
                    end: None,
                    bytes: e.arg,
                });
            }
            Kind::KernelEnd | Kind::PhaseEnd | Kind::WaitEnd => {
                // A kernel's block may record several ends (one per role): the last one wins.
                if let Some(i) = open.get_mut(&key).and_then(|s| s.pop()) {
                    out[i].end = Some(at(e.time_ns));
                    out[i].bytes += e.arg;
                    if pair == 1 {
                        open.entry(key).or_default().push(i);
                    }
                } else if pair == 1 {
                    if let Some(s) = out.iter_mut().rev().find(|s| {
                        s.call == e.call && s.block == e.block && s.phase == 0 && s.what == "kernel"
                    }) {
                        s.end = Some(at(e.time_ns));
                        s.bytes += e.arg;
                    }
                }
            }
        }
    }
    out
}

/// The call `id` of `calls`.
fn call_of(calls: &[HostCall], id: u32) -> Option<&HostCall> {
    calls.iter().find(|c| c.call == id)
}

fn us(ns: i64, t0: i64) -> f64 {
    (ns - t0) as f64 / 1000.0
}

/// The merged trace of every rank (see the module's doc).
pub fn chrome_trace(ranks: &[RankTrace]) -> Value {
    let per_rank: Vec<Vec<Span>> = ranks.iter().map(spans).collect();
    let t0 = ranks
        .iter()
        .flat_map(|r| r.calls.iter().map(|c| c.begin_ns as i64))
        .chain(per_rank.iter().flatten().map(|s| s.begin))
        .min()
        .unwrap_or(0);
    let mut events = Vec::new();
    for (r, spans) in ranks.iter().zip(&per_rank) {
        let pid = r.rank as u64;
        events.push(
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": format!("rank {}", r.rank)}}),
        );
        events.push(
            json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
            "args": {"sort_index": r.rank}}),
        );
        let mut streams: Vec<u64> = Vec::new();
        for c in &r.calls {
            if !streams.contains(&c.stream) {
                streams.push(c.stream);
            }
            let tid = HOST_TID + streams.iter().position(|&s| s == c.stream).unwrap_or(0) as u64;
            events.push(json!({"ph": "X", "name": c.op, "cat": "host", "pid": pid, "tid": tid,
                "ts": us(c.begin_ns as i64, t0), "dur": (c.end_ns.saturating_sub(c.begin_ns)) as f64 / 1000.0,
                "args": {"call": c.call, "bytes": c.bytes, "peers": c.peers, "algorithm": c.algorithm}}));
        }
        for (i, s) in streams.iter().enumerate() {
            events.push(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": HOST_TID + i as u64,
                "args": {"name": format!("host stream {i} ({s:#x})")}}),
            );
        }
        let mut tids = std::collections::BTreeSet::new();
        for s in spans {
            let recv = s.phase == 6; // the receive role's track (see the module's doc)
            let tid = BLOCK_TID + 2 * s.block as u64 + recv as u64;
            tids.insert((tid, s.block, recv));
            let op = call_of(&r.calls, s.call).map_or("call", |c| c.op.as_str());
            let name = match (s.what.as_str(), s.peer) {
                ("kernel", _) => format!("{op} kernel"),
                ("wait", Some(p)) => format!("wait peer {p} slot {}", s.slot),
                ("wait", None) => format!("wait slot {}", s.slot),
                (w, Some(p)) => format!("{w} peer {p}"),
                (w, None) => w.to_owned(),
            };
            let cat = match s.what.as_str() {
                "kernel" => "kernel",
                "wait" => "wait",
                _ => "phase",
            };
            let args = json!({"call": s.call, "op": op, "block": s.block, "peer": s.peer,
                "slot": s.slot, "bytes": s.bytes});
            events.push(match s.end {
                Some(end) => json!({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                    "ts": us(s.begin, t0), "dur": (end - s.begin).max(0) as f64 / 1000.0, "args": args}),
                None => json!({"ph": "i", "s": "t", "cat": cat, "pid": pid, "tid": tid,
                    "name": if s.what == "bytes" { name } else { format!("{name} (no end)") },
                    "ts": us(s.begin, t0), "args": args}),
            });
        }
        for (tid, block, recv) in tids {
            let name = if recv {
                format!("GPU block {block} recv")
            } else {
                format!("GPU block {block}")
            };
            events.push(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                "args": {"name": name}}),
            );
            events.push(
                json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                "args": {"sort_index": tid}}),
            );
        }
    }
    let meta: Vec<Value> = ranks
        .iter()
        .map(|r| {
            json!({"rank": r.rank, "clock_offset_ns": r.clock_offset_ns,
            "clock_rtt_ns": r.clock_rtt_ns,
            "clock_end_offset_ns": r.clock_end.map(|c| c.offset_ns),
            "clock_drift_ppm": r.clock_drift_ppm(), "dropped_events": r.dropped,
            "dropped_calls": r.dropped_calls})
        })
        .collect();
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"producer": "devcomm trace", "time_zero_realtime_ns": t0, "ranks": meta},
    })
}

/// Checks `trace` against the Chrome trace event format's rules that Perfetto's importer
/// relies on; the first violation, naming the event's index.
pub fn validate(trace: &Value) -> Result<(), String> {
    let events = trace["traceEvents"]
        .as_array()
        .ok_or("no traceEvents array")?;
    match trace.get("displayTimeUnit").and_then(Value::as_str) {
        None | Some("ms") | Some("ns") => {}
        Some(other) => return Err(format!("displayTimeUnit {other:?} is neither ms nor ns")),
    }
    for (i, e) in events.iter().enumerate() {
        let bad = |why: &str| Err(format!("event {i} {why}: {e}"));
        let Some(ph) = e["ph"].as_str() else {
            return bad("has no ph");
        };
        if e["name"].as_str().is_none() {
            return bad("has no name");
        }
        if !e["pid"].is_u64() || !e["tid"].is_u64() {
            return bad("has no integer pid and tid");
        }
        match ph {
            "M" => {
                let name = e["name"].as_str().unwrap_or_default();
                let ok = match name {
                    "process_name" | "thread_name" => e["args"]["name"].is_string(),
                    "process_sort_index" | "thread_sort_index" => e["args"]["sort_index"].is_u64(),
                    _ => false,
                };
                if !ok {
                    return bad("is a metadata event of an unknown name or without its argument");
                }
            }
            "X" | "i" => {
                if !e["ts"].as_f64().is_some_and(|t| t.is_finite() && t >= 0.0) {
                    return bad("has no finite ts >= 0");
                }
                if ph == "X" && !e["dur"].as_f64().is_some_and(|d| d.is_finite() && d >= 0.0) {
                    return bad("is complete but has no finite dur >= 0");
                }
                if ph == "i" && !matches!(e["s"].as_str(), Some("t" | "p" | "g")) {
                    return bad("is an instant without scope t, p or g");
                }
                if !e["args"].is_null() && !e["args"].is_object() {
                    return bad("has args that are not an object");
                }
            }
            other => {
                return bad(&format!(
                    "has phase {other:?}, which this producer never writes"
                ))
            }
        }
    }
    nested(events)
}

/// The complete events of each track nest: one that starts inside another ends inside it
/// (the JSON importers draw a track's slices as a stack; a partial overlap is an error there).
fn nested(events: &[Value]) -> Result<(), String> {
    // Timestamps are in µs with ns digits: allow for the rounding of the ns to f64.
    const SLACK: f64 = 1e-3;
    type Slices = Vec<(f64, f64, usize)>;
    let mut tracks: BTreeMap<(u64, u64), Slices> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        if e["ph"] == "X" {
            let (ts, dur) = (
                e["ts"].as_f64().unwrap_or(0.0),
                e["dur"].as_f64().unwrap_or(0.0),
            );
            let key = (
                e["pid"].as_u64().unwrap_or(0),
                e["tid"].as_u64().unwrap_or(0),
            );
            tracks.entry(key).or_default().push((ts, ts + dur, i));
        }
    }
    for ((pid, tid), mut slices) in tracks {
        slices.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut stack: Vec<(f64, usize)> = Vec::new();
        for (begin, end, i) in slices {
            while stack.last().is_some_and(|&(top, _)| top <= begin + SLACK) {
                stack.pop();
            }
            if let Some(&(top, j)) = stack.last() {
                if end > top + SLACK {
                    return Err(format!(
                        "events {j} and {i} of pid {pid} tid {tid} overlap without nesting"
                    ));
                }
            }
            stack.push((end, i));
        }
    }
    Ok(())
}

/// Writes the merged trace of `ranks` to `path`.
pub fn write_file(ranks: &[RankTrace], path: &std::path::Path) -> crate::error::Result<()> {
    use crate::error::Error;
    let json = chrome_trace(ranks);
    let text = serde_json::to_vec(&json).map_err(|e| Error::InvalidArgument {
        op: "write_trace",
        reason: e.to_string(),
    })?;
    std::fs::write(path, text).map_err(|source| Error::Io {
        context: format!("writing the trace {}", path.display()),
        source,
    })
}
