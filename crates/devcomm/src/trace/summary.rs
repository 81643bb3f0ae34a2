//! The per-operation summary of a merged trace: for each operation, its calls' device time,
//! the time per phase, the slowest peer, and the achieved bandwidth (against the link's, when
//! given).
//!
//! Definitions (docs/TRACING.md, "Summary"): a call of a rank lasts from its first block's
//! kernel begin to its last block's kernel end. A phase's time in a call is the mean over the
//! call's blocks of the time each block spent in it (a block's time in a phase is the sum of
//! its intervals of that phase; blocks without the phase do not count), averaged over the
//! calls. The slowest peer is the peer whose send/recv phases (or waits) took the longest on
//! average; the last rank is the one whose kernels began latest after the earliest rank's on
//! average (the others wait for it). Bandwidth is the call's bytes (the host's count for this
//! rank's input) over its device time.

use std::collections::BTreeMap;

use super::chrome::{spans, Span};
use super::RankTrace;

/// The summary of one operation.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSummary {
    /// The operation's name.
    pub op: String,
    /// Calls summarised (rank-calls with device events).
    pub calls: usize,
    /// Mean bytes per call.
    pub bytes: f64,
    /// Mean device time of a call, ns.
    pub device_ns: f64,
    /// `(phase, mean ns)`, in phase order; waits are the phase `wait`.
    pub phases: Vec<(String, f64)>,
    /// `(peer, mean ns of its phases and waits)` of the slowest peer.
    pub slowest_peer: Option<(usize, f64)>,
    /// `(rank, mean ns after the earliest rank's kernel begin)` of the rank that began last.
    pub last_rank: Option<(usize, f64)>,
    /// Achieved bandwidth, GB/s (bytes per ns).
    pub gbps: f64,
}

/// Summarises `ranks` per operation, in name order.
pub fn summarize(ranks: &[RankTrace]) -> Vec<OpSummary> {
    // (op, k-th call of that op on its rank) -> per rank: (first kernel begin, ...).
    let mut ops: BTreeMap<String, Acc> = BTreeMap::new();
    for r in ranks {
        let all = spans(r);
        let mut by_call: BTreeMap<u32, Vec<&Span>> = BTreeMap::new();
        for s in &all {
            by_call.entry(s.call).or_default().push(s);
        }
        let mut nth: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &r.calls {
            let k = nth.entry(c.op.as_str()).or_default();
            let index = *k;
            *k += 1;
            let Some(spans) = by_call.get(&c.call) else {
                continue;
            };
            let kernels: Vec<_> = spans.iter().filter(|s| s.what == "kernel").collect();
            let (Some(begin), Some(end)) = (
                kernels.iter().map(|s| s.begin).min(),
                kernels.iter().filter_map(|s| s.end).max(),
            ) else {
                continue;
            };
            let acc = ops.entry(c.op.clone()).or_default();
            acc.calls += 1;
            acc.bytes += c.bytes as f64;
            acc.device_ns += (end - begin).max(0) as f64;
            // Per phase: per block sums, then the mean over blocks.
            let mut per_phase: BTreeMap<(u16, String), BTreeMap<u16, i64>> = BTreeMap::new();
            for s in spans.iter().filter(|s| s.what != "kernel") {
                let Some(e) = s.end else { continue };
                let key = if s.what == "wait" {
                    (u16::MAX, "wait".to_owned())
                } else {
                    (s.phase, s.what.clone())
                };
                *per_phase
                    .entry(key)
                    .or_default()
                    .entry(s.block)
                    .or_default() += e - s.begin;
                if let Some(p) = s.peer.filter(|&p| p != r.rank) {
                    let v = acc.peers.entry(p).or_default();
                    v.0 += (e - s.begin) as f64;
                    v.1 += 1;
                }
            }
            for ((n, name), blocks) in per_phase {
                let mean = blocks.values().sum::<i64>() as f64 / blocks.len() as f64;
                let v = acc.phases.entry((n, name)).or_default();
                v.0 += mean;
                v.1 += 1;
            }
            acc.starts.entry(index).or_default().push((r.rank, begin));
        }
    }
    ops.into_iter()
        .map(|(op, a)| {
            let n = a.calls.max(1) as f64;
            let mut lag: BTreeMap<usize, (f64, usize)> = BTreeMap::new();
            for starts in a.starts.values().filter(|s| s.len() > 1) {
                let first = starts.iter().map(|s| s.1).min().unwrap_or(0);
                for &(rank, t) in starts {
                    let v = lag.entry(rank).or_default();
                    v.0 += (t - first) as f64;
                    v.1 += 1;
                }
            }
            let mean = |m: BTreeMap<usize, (f64, usize)>| {
                m.into_iter()
                    .map(|(k, (sum, c))| (k, sum / c as f64))
                    .max_by(|x, y| x.1.total_cmp(&y.1))
            };
            let device_ns = a.device_ns / n;
            OpSummary {
                calls: a.calls,
                bytes: a.bytes / n,
                device_ns,
                phases: a
                    .phases
                    .into_iter()
                    .map(|((_, name), (sum, c))| (name, sum / c as f64))
                    .collect(),
                slowest_peer: mean(a.peers),
                last_rank: mean(lag),
                gbps: if device_ns > 0.0 {
                    a.bytes / n / device_ns
                } else {
                    0.0
                },
                op,
            }
        })
        .collect()
}

#[derive(Default)]
struct Acc {
    calls: usize,
    bytes: f64,
    device_ns: f64,
    phases: BTreeMap<(u16, String), (f64, usize)>,
    peers: BTreeMap<usize, (f64, usize)>,
    starts: BTreeMap<usize, Vec<(usize, i64)>>,
}

/// The summary as text, one block per operation; `link_gbps`: the link's bandwidth, to print
/// the achieved share of it.
pub fn format(summary: &[OpSummary], link_gbps: Option<f64>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for s in summary {
        let _ = writeln!(
            out,
            "{}: {} calls, {:.0} bytes, device {:.1} us, {:.2} GB/s{}",
            s.op,
            s.calls,
            s.bytes,
            s.device_ns / 1000.0,
            s.gbps,
            link_gbps.map_or(String::new(), |l| format!(
                " ({:.0}% of {l} GB/s)",
                100.0 * s.gbps / l
            )),
        );
        for (name, ns) in &s.phases {
            let _ = writeln!(out, "  {name:<10} {:>10.1} us per block", ns / 1000.0);
        }
        if let Some((p, ns)) = s.slowest_peer {
            let _ = writeln!(
                out,
                "  slowest peer {p} ({:.1} us in its phases)",
                ns / 1000.0
            );
        }
        if let Some((r, ns)) = s.last_rank {
            let _ = writeln!(
                out,
                "  last rank to start {r} ({:.1} us after the first)",
                ns / 1000.0
            );
        }
    }
    out
}
