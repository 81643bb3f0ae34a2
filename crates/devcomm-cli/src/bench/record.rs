//! The records every benchmark writes, and their output: the table (rank 0), JSON and the plot.

use crate::bench::{plot, BenchArgs};
use crate::selftest::Ctx;

/// One measured point. Every devcomm benchmark writes this shape.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Record {
    /// Operation, e.g. `put` or `sendrecv`.
    pub op: String,
    /// Ranks in the run.
    pub world_size: usize,
    /// Bytes per message (per peer for collectives).
    pub bytes: u64,
    /// Both directions at once.
    pub both_directions: bool,
    /// devcomm's median time, microseconds.
    pub devcomm_us: f64,
    /// The reference's median time, microseconds (NCCL unless `reference` says otherwise).
    pub nccl_us: f64,
    /// `nccl_us / devcomm_us`.
    pub ratio: f64,
    /// Thread blocks (SMs) devcomm used.
    pub sms: u32,
    /// GPU name and machine kind.
    pub device: String,
    /// Date of the run (UTC, YYYY-MM-DD).
    pub date: String,
    /// What `nccl_us` measured.
    pub reference: String,
    /// devcomm's bandwidth, GB/s (10^9 bytes per second, one direction).
    pub devcomm_gbps: f64,
    /// devcomm's launch configuration, when the benchmark has one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub config: String,
    /// The reference's bandwidth, GB/s.
    pub nccl_gbps: f64,
    /// Tokens per rank (all-to-all-v).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Whether cudarc's per-buffer event tracking was on (`--event-tracking`).
    pub event_tracking: bool,
    /// Element type (the reductions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Reduction operator (all-reduce and reduce-scatter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redop: Option<String>,
    /// devcomm's bus bandwidth as nccl-tests defines it, GB/s (the reductions, whose
    /// `devcomm_gbps` and `nccl_gbps` are nccl-tests' algorithm bandwidth: `bytes` / time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devcomm_busbw_gbps: Option<f64>,
    /// The reference's bus bandwidth, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_busbw_gbps: Option<f64>,
    /// How devcomm's result was checked, where the benchmark says (the reductions).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub check: String,
    /// False where the timings say nothing about the hardware (ranks sharing one GPU: a smoke
    /// test of the code path).
    pub meaningful: bool,
}

impl Record {
    /// A record of `op` at `bytes` on this run's ranks, device, date and settings; times NaN
    /// (none measured), bandwidths 0, nothing else set. Benchmarks fill in the rest with
    /// [`Record::timed`] and struct update syntax.
    pub(crate) fn new(cx: &Ctx, args: &BenchArgs, op: &str, bytes: u64) -> Self {
        Self {
            op: op.into(),
            world_size: cx.comm.world_size(),
            bytes,
            both_directions: false,
            devcomm_us: f64::NAN,
            nccl_us: f64::NAN,
            ratio: f64::NAN,
            sms: 0,
            device: device_label(cx, args),
            date: today(),
            reference: String::new(),
            devcomm_gbps: 0.0,
            config: String::new(),
            nccl_gbps: 0.0,
            tokens: None,
            event_tracking: args.event_tracking,
            dtype: None,
            redop: None,
            devcomm_busbw_gbps: None,
            nccl_busbw_gbps: None,
            check: String::new(),
            meaningful: true,
        }
    }

    /// This record with devcomm's and the reference's times (microseconds), their ratio, and
    /// each one's bandwidth for `moved` bytes.
    pub(crate) fn timed(self, devcomm_us: f64, nccl_us: f64, moved: f64) -> Self {
        Self {
            devcomm_us,
            nccl_us,
            ratio: nccl_us / devcomm_us,
            devcomm_gbps: moved / devcomm_us / 1e3,
            nccl_gbps: moved / nccl_us / 1e3,
            ..self
        }
    }
}

pub(crate) fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The GPU's name, and the machine kind where given.
pub(crate) fn device_label(cx: &Ctx, args: &BenchArgs) -> String {
    let name = &cx.comm.device_info().name;
    if args.device_kind.is_empty() {
        name.clone()
    } else {
        format!("{name} ({})", args.device_kind)
    }
}

/// Rank 0's output of a run: the table on stdout, and the JSON records and the plot where asked.
pub(crate) fn emit(records: &[Record], args: &BenchArgs) -> Result<(), String> {
    print_table(records);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(records).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        plot::write_svg(path, records).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// What the table prints above records whose timings mean nothing.
pub(crate) const MEANINGLESS: &str = "NOT MEANINGFUL: the ranks share one GPU \
    (DEVCOMM_SHARE_GPU=1), or the network route is forced over loopback; a smoke test of the \
    code path, its timings say nothing of NVLink or of a network";

/// The note after a row whose timings mean nothing.
fn meaningless_note(r: &Record) -> &'static str {
    if r.meaningful {
        ""
    } else if r.reference.contains(crate::bench::sendrecv_net::NET_NOTE) {
        " (meaningless: network route over loopback)"
    } else {
        " (meaningless: shared GPU)"
    }
}

fn print_table(records: &[Record]) {
    if records.iter().any(|r| !r.meaningful) {
        println!("{MEANINGLESS}");
    }
    // A tokens column only when some record has tokens (all-to-all-v), bus bandwidths only
    // when some record has them (the reductions).
    let with_tokens = records.iter().any(|r| r.tokens.is_some());
    let with_busbw = records.iter().any(|r| r.devcomm_busbw_gbps.is_some());
    let tokens = |t: String| {
        if with_tokens {
            format!("{t:>6} ")
        } else {
            String::new()
        }
    };
    let busbw = |d: String, n: String| {
        if with_busbw {
            format!("{d:>10} {n:>10} ")
        } else {
            String::new()
        }
    };
    let gb = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}GB"));
    println!(
        "{:<10} {}{:>12} {:>5} {:>12} {:>12} {:>10} {:>10} {}{:>7} {:>4}  reference",
        "op",
        tokens("tokens".into()),
        "bytes",
        "both",
        "devcomm_us",
        "ref_us",
        "devcomm",
        "ref",
        busbw("dc_busbw".into(), "ref_busbw".into()),
        "ratio",
        "sms"
    );
    for r in records {
        println!(
            "{:<10} {}{:>12} {:>5} {:>12.2} {:>12.2} {:>8.1}GB {:>8.1}GB {}{:>7.3} {:>4}  {} {}{}",
            r.op,
            tokens(r.tokens.map_or_else(|| "-".into(), |t| t.to_string())),
            r.bytes,
            r.both_directions,
            r.devcomm_us,
            r.nccl_us,
            r.devcomm_gbps,
            r.nccl_gbps,
            busbw(gb(r.devcomm_busbw_gbps), gb(r.nccl_busbw_gbps)),
            r.ratio,
            r.sms,
            r.reference,
            r.config,
            meaningless_note(r)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            op: "sendrecv".into(),
            world_size: 2,
            bytes: 8,
            both_directions: false,
            devcomm_us: 5.0,
            nccl_us: f64::NAN,
            ratio: f64::NAN,
            sms: 1,
            device: "H200".into(),
            date: "2026-11-24".into(),
            reference: "none".into(),
            devcomm_gbps: 0.0,
            config: String::new(),
            nccl_gbps: 0.0,
            tokens: None,
            event_tracking: false,
            dtype: None,
            redop: None,
            devcomm_busbw_gbps: None,
            nccl_busbw_gbps: None,
            check: String::new(),
            meaningful: true,
        }
    }

    #[test]
    fn reduction_fields_appear_only_where_set() {
        let plain = serde_json::to_value(record()).unwrap();
        for absent in ["dtype", "redop", "devcomm_busbw_gbps", "check", "tokens"] {
            assert!(plain.get(absent).is_none(), "{absent}");
        }
        assert_eq!(plain["meaningful"], true);
        // No reference time: NaN is written as null.
        assert!(plain["nccl_us"].is_null());
        let r = Record {
            op: "all_reduce".into(),
            dtype: Some("bf16".into()),
            redop: Some("sum".into()),
            devcomm_busbw_gbps: Some(350.0),
            check: "bitwise against NCCL".into(),
            meaningful: false,
            ..record()
        }
        .timed(4.0, 8.0, 8e3);
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["dtype"], "bf16");
        assert_eq!(j["redop"], "sum");
        assert_eq!(j["meaningful"], false);
        assert_eq!(j["devcomm_busbw_gbps"], 350.0);
        assert_eq!(j["check"], "bitwise against NCCL");
        assert_eq!(
            (j["ratio"].as_f64(), j["devcomm_gbps"].as_f64()),
            (Some(2.0), Some(2.0))
        );
        assert_eq!(j["nccl_gbps"].as_f64(), Some(1.0));
    }
}
