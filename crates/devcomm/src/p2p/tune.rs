//! Tuning tables for send/recv (DESIGN.md section 8): what `devcomm tune` measures on the real
//! GPUs and writes, and what [`crate::Comm`] loads so that calls without an explicit
//! configuration use the measured best instead of the built-in defaults.
//!
//! A table maps size buckets to configurations. Entry `i` serves messages of
//! `(entries[i - 1].max_bytes, entries[i].max_bytes]` bytes; sizes above the last entry fall
//! back to [`default_config`](super::default_config). Sender and receiver of one message must
//! use the same configuration, so every rank must load the same table: the communicator
//! compares the tables' fingerprints when it is built and refuses to start otherwise.
//!
//! A table is only valid for the window it was measured with (the [`P2PLimits`]) and for the
//! GPU model it names; loading it anywhere else is an error rather than a silent slowdown.
//! Collectives do not read it (their per-peer plan is computed on the GPU).

use std::path::Path;

use sha2::{Digest, Sha256};

use super::config::{P2PConfig, P2PLimits};
use crate::error::{Error, Result};

/// Environment variable: path of a tuning table (JSON, as `devcomm tune --out` writes) that
/// every rank loads when its communicator is built. Set it alike on every rank.
pub const TUNE_FILE_ENV: &str = "DEVCOMM_TUNE_FILE";

/// The format version this build reads and writes.
pub const TUNE_VERSION: u32 = 1;

/// The operation send/recv entries are keyed by.
pub const OP_SENDRECV: &str = "sendrecv";

/// The window a table was measured with: the sizes a configuration is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TunedLimits {
    /// [`P2PLimits::max_blocks`].
    pub max_blocks: u32,
    /// [`P2PLimits::depth`].
    pub depth: u32,
    /// [`P2PLimits::slot_bytes`].
    pub slot_bytes: u64,
    /// [`P2PLimits::ll_max_bytes`].
    pub ll_max_bytes: u64,
    /// [`P2PLimits::ll128_max_bytes`].
    pub ll128_max_bytes: u64,
}

impl From<&P2PLimits> for TunedLimits {
    fn from(l: &P2PLimits) -> Self {
        Self {
            max_blocks: l.max_blocks,
            depth: l.depth,
            slot_bytes: l.slot_bytes,
            ll_max_bytes: l.ll_max_bytes,
            ll128_max_bytes: l.ll128_max_bytes,
        }
    }
}

/// One size bucket: the configuration to use and what was measured for it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TuneEntry {
    /// The operation ([`OP_SENDRECV`]).
    pub op: String,
    /// The largest message of the bucket (the size that was measured).
    pub max_bytes: u64,
    /// The configuration chosen for the bucket.
    pub config: P2PConfig,
    /// devcomm's median time one way with it, microseconds.
    pub one_way_us: f64,
    /// devcomm's median time both ways at once with it, microseconds.
    pub both_ways_us: f64,
    /// NCCL's median time one way in the same run, microseconds.
    pub nccl_one_way_us: f64,
    /// NCCL's median time both ways in the same run, microseconds.
    pub nccl_both_ways_us: f64,
}

/// A tuning table (see the module documentation).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TuneTable {
    /// [`TUNE_VERSION`].
    pub version: u32,
    /// The GPU model it was measured on, as the driver names it (e.g. `NVIDIA H200`).
    pub device: String,
    /// The world size of the measuring run (informational: send/recv is pairwise).
    pub world_size: usize,
    /// The day it was measured (YYYY-MM-DD).
    pub date: String,
    /// The window it was measured with.
    pub limits: TunedLimits,
    /// Size buckets, by increasing `max_bytes`.
    pub entries: Vec<TuneEntry>,
}

fn invalid(reason: String) -> Error {
    Error::InvalidArgument {
        op: "tuning table",
        reason,
    }
}

/// Reads a table file of kind `op` (the error's operation) and parses it with `parse`; every
/// error names the file (the send/recv and the reductions' tables load alike).
pub(crate) fn load_table<T>(
    path: &Path,
    op: &'static str,
    parse: impl FnOnce(&str) -> Result<T>,
) -> Result<T> {
    let named = |reason: String| Error::InvalidArgument {
        op,
        reason: format!("{}: {reason}", path.display()),
    };
    let text = std::fs::read_to_string(path).map_err(|e| named(format!("cannot read: {e}")))?;
    parse(&text).map_err(|e| match e {
        Error::InvalidArgument { reason, .. } => named(reason),
        other => other,
    })
}

impl TuneTable {
    /// Parses a table (checks the format only; see [`TuneTable::validate`]).
    pub fn from_json(text: &str) -> Result<Self> {
        let table: Self =
            serde_json::from_str(text).map_err(|e| invalid(format!("not a tuning table: {e}")))?;
        if table.version != TUNE_VERSION {
            return Err(invalid(format!(
                "format version {} (this build reads {TUNE_VERSION}); run `devcomm tune` again",
                table.version
            )));
        }
        Ok(table)
    }

    /// Reads and parses a table file.
    pub fn load(path: &Path) -> Result<Self> {
        load_table(path, "tuning table", Self::from_json)
    }

    /// The table as pretty JSON (what `devcomm tune --out` writes).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a table always serialises")
    }

    /// Checks that the table may be used here: measured on this GPU model with this window,
    /// buckets in increasing order, every configuration accepted by the guard before launch
    /// for every size of its bucket.
    pub fn validate(&self, limits: &P2PLimits, device: &str) -> Result<()> {
        if self.device != device {
            return Err(invalid(format!(
                "measured on {:?}, this GPU is {device:?}; run `devcomm tune` here",
                self.device
            )));
        }
        let here = TunedLimits::from(limits);
        if self.limits != here {
            return Err(invalid(format!(
                "measured with the window {:?}, this communicator has {here:?} (staging \
                 environment variables differ?); run `devcomm tune` with these settings",
                self.limits
            )));
        }
        if self.entries.is_empty() {
            return Err(invalid("no entries".into()));
        }
        let mut last = 0u64;
        for e in &self.entries {
            if e.op != OP_SENDRECV {
                return Err(invalid(format!("unknown operation {:?}", e.op)));
            }
            if e.max_bytes <= last {
                return Err(invalid(format!(
                    "buckets out of order: {} bytes after {last}",
                    e.max_bytes
                )));
            }
            // The guard's capacity checks grow with the size, so the bucket's largest message
            // is the one to check.
            e.config
                .check("tuning table", e.max_bytes, limits)
                .map_err(|err| invalid(format!("bucket of {} bytes: {err}", e.max_bytes)))?;
            last = e.max_bytes;
        }
        Ok(())
    }

    /// The configuration for a message of `bytes`, or None above the last bucket.
    pub fn config_for(&self, bytes: u64) -> Option<P2PConfig> {
        self.entries
            .iter()
            .find(|e| e.op == OP_SENDRECV && bytes <= e.max_bytes)
            .map(|e| e.config)
    }

    /// SHA-256 of the table's canonical JSON: equal on every rank that loaded the same table.
    pub fn fingerprint(&self) -> [u8; 32] {
        let canonical = serde_json::to_vec(self).expect("a table always serialises");
        Sha256::digest(&canonical).into()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::p2p::config::{default_config, Protocol};
    use crate::p2p::Switches;

    /// A valid table of three buckets for `limits` (also used by the communicator's tests).
    pub(crate) fn table(limits: &P2PLimits) -> TuneTable {
        let entry = |max_bytes: u64, config: P2PConfig| TuneEntry {
            op: OP_SENDRECV.into(),
            max_bytes,
            config,
            one_way_us: 5.0,
            both_ways_us: 6.0,
            nccl_one_way_us: 7.0,
            nccl_both_ways_us: 8.0,
        };
        TuneTable {
            version: TUNE_VERSION,
            device: "NVIDIA H200".into(),
            world_size: 2,
            date: "2026-11-22".into(),
            limits: limits.into(),
            entries: vec![
                entry(
                    4096,
                    P2PConfig {
                        protocol: Protocol::LowLatency,
                        blocks: 4,
                        threads: 256,
                        chunk_bytes: 0,
                    },
                ),
                entry(
                    1 << 20,
                    default_config(1 << 20, limits, &Switches::default()),
                ),
                entry(
                    64 << 20,
                    default_config(64 << 20, limits, &Switches::default()),
                ),
            ],
        }
    }

    #[test]
    fn buckets_choose_the_smallest_measured_size_at_or_above() {
        let l = P2PLimits::default();
        let t = table(&l);
        t.validate(&l, "NVIDIA H200").unwrap();
        assert_eq!(t.config_for(1).unwrap().blocks, 4);
        assert_eq!(t.config_for(4096).unwrap().blocks, 4);
        assert_eq!(
            t.config_for(4097),
            Some(default_config(1 << 20, &l, &Switches::default()))
        );
        assert_eq!(
            t.config_for(64 << 20),
            Some(default_config(64 << 20, &l, &Switches::default()))
        );
        assert_eq!(t.config_for((64 << 20) + 1), None);
    }

    #[test]
    fn round_trips_through_json_with_the_same_fingerprint() {
        let l = P2PLimits::default();
        let t = table(&l);
        let back = TuneTable::from_json(&t.to_json()).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.fingerprint(), t.fingerprint());
        let mut other = t.clone();
        other.entries[0].config.blocks = 8;
        assert_ne!(other.fingerprint(), t.fingerprint());
    }

    #[test]
    fn refuses_tables_from_elsewhere_or_that_the_guard_would_refuse() {
        let l = P2PLimits::default();
        let reason = |t: &TuneTable| t.validate(&l, "NVIDIA H200").unwrap_err().to_string();
        let t = table(&l);
        assert!(t.validate(&l, "NVIDIA H100 80GB HBM3").is_err());
        let other = P2PLimits { depth: 2, ..l };
        assert!(reason(&table(&other)).contains("window"));
        let mut bad = t.clone();
        bad.entries.swap(0, 1);
        assert!(reason(&bad).contains("order"));
        let mut bad = t.clone();
        bad.entries[1].config.protocol = Protocol::LowLatency; // 1 MiB of LL: over its buffer
        assert!(reason(&bad).contains("1048576"));
        let mut bad = t.clone();
        bad.entries[0].config.blocks = l.max_blocks + 1;
        assert!(reason(&bad).contains("blocks"));
        let mut bad = t.clone();
        bad.entries[0].op = "all_to_all".into();
        assert!(reason(&bad).contains("operation"));
        let mut bad = t;
        bad.entries.clear();
        assert!(reason(&bad).contains("no entries"));
    }

    #[test]
    fn refuses_other_versions_and_malformed_text() {
        let l = P2PLimits::default();
        let mut t = table(&l);
        t.version = TUNE_VERSION + 1;
        let err = TuneTable::from_json(&t.to_json()).unwrap_err().to_string();
        assert!(err.contains("version"), "{err}");
        assert!(TuneTable::from_json("{").is_err());
        assert!(TuneTable::from_json("[]").is_err());
        let missing = TuneTable::load(Path::new("/nonexistent/devcomm-tune.json"));
        assert!(missing.unwrap_err().to_string().contains("cannot read"));
    }
}
