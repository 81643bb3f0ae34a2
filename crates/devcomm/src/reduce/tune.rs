//! Tuning tables of the reductions (docs/TUNING.md, "Reductions"): what `devcomm tune --op
//! all_reduce,reduce_scatter,all_gather` measures on the real GPUs and writes, and what a
//! communicator loads (`DEVCOMM_REDUCE_TUNE_FILE`, or a table built into the library for its
//! GPU model and world size: `reduce/tune_builtin.rs`) so that calls take the measured best
//! algorithm and block count instead of the fixed limits of [`super::plan`].
//!
//! A table holds size buckets per (collective, buffers): entry `i` of a key serves calls of
//! `(max_bytes[i - 1], max_bytes[i]]` bytes, counted as `devcomm bench` and nccl-tests count
//! them (the all-reduce's buffer, the reduce-scatter's input, the all-gather's output); sizes
//! above a key's last entry take the default plan. Every rank must pick the same plan, so
//! every rank must load the same table: the communicator compares the tables' fingerprints
//! when it is built. A table is measured on one GPU model, one world size and one window (the
//! line one-shot's and the line two-shot's sizes, the staged round): loading it elsewhere is
//! an error, and a communicator that loads it makes its window hold those sizes.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::plan::{Collective, ReduceLimits, MAX_BLOCKS, MAX_WORLD};
use super::tuned_plan::{Choice, TunedAlgorithm};
use crate::error::{Error, Result};

/// The format version this build reads and writes.
pub const REDUCE_TUNE_VERSION: u32 = 1;

/// Where a call's buffers lie, as a table tells its entries apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Buffers {
    /// Neither buffer in the memory pool (or the zero-copy paths switched off).
    Ordinary,
    /// The input or the output in the memory pool, mapped by every peer: the zero-copy
    /// paths' candidates.
    Pool,
}

impl Buffers {
    /// The name a table spells it with.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ordinary => "ordinary",
            Self::Pool => "pool",
        }
    }
}

/// The window sizes a table was measured with ([`ReduceLimits`]' fields of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunedWindow {
    /// [`ReduceLimits::one_shot_bytes`]: the line one-shot's largest payload.
    pub one_shot_bytes: u64,
    /// [`ReduceLimits::line_two_shot_bytes`]: the two-shot on lines' largest all-reduce.
    pub line_two_shot_bytes: u64,
    /// [`ReduceLimits::chunk_bytes`]: a staged round per rank (`DEVCOMM_REDUCE_CHUNK_MIB`).
    pub chunk_bytes: u64,
}

impl TunedWindow {
    /// The window sizes of `limits`.
    pub const fn of(limits: &ReduceLimits) -> Self {
        Self {
            one_shot_bytes: limits.one_shot_bytes,
            line_two_shot_bytes: limits.line_two_shot_bytes,
            chunk_bytes: limits.chunk_bytes,
        }
    }

    /// Checks the sizes against what the settings allow (`DEVCOMM_REDUCE_ONE_SHOT_KIB`,
    /// `DEVCOMM_REDUCE_LINE_TWO_SHOT_KIB`, `DEVCOMM_REDUCE_CHUNK_MIB`).
    pub fn check(&self) -> Result<()> {
        let w = self;
        if w.one_shot_bytes > 4 << 20 || w.line_two_shot_bytes > 1 << 30 {
            return Err(invalid(format!(
                "window {w:?}: the one-shot holds at most 4 MiB, the two-shot on lines 1 GiB \
                 (DEVCOMM_REDUCE_ONE_SHOT_KIB, DEVCOMM_REDUCE_LINE_TWO_SHOT_KIB)"
            )));
        }
        if w.chunk_bytes == 0 || w.chunk_bytes % (1 << 20) != 0 || w.chunk_bytes > 256 << 20 {
            return Err(invalid(format!(
                "window {w:?}: a round is 1 to 256 MiB in whole MiB (DEVCOMM_REDUCE_CHUNK_MIB)"
            )));
        }
        Ok(())
    }

    /// SHA-256 of the sizes: equal on every rank that asks for the same window.
    pub fn fingerprint(&self) -> [u8; 32] {
        let canonical = serde_json::to_vec(self).expect("a window always serialises");
        Sha256::digest(&canonical).into()
    }

    /// `limits` with a window that also holds these sizes: the larger line sizes of the two
    /// (the default plans keep choosing by `limits`' own). The round must be the same (the
    /// caller checks: [`ReduceTuneTable::validate`]).
    pub fn widen(&self, limits: &ReduceLimits) -> ReduceLimits {
        ReduceLimits {
            one_shot_bytes: limits.one_shot_bytes.max(self.one_shot_bytes),
            line_two_shot_bytes: limits.line_two_shot_bytes.max(self.line_two_shot_bytes),
            ..*limits
        }
    }
}

/// One size bucket of a (collective, buffers): the choice and what was measured for it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReduceTuneEntry {
    /// The collective (`all_reduce`, `reduce_scatter`, `all_gather`).
    #[serde(with = "collective_name")]
    pub collective: Collective,
    /// Where the buffers lie.
    pub buffers: Buffers,
    /// The largest call of the bucket (the size that was measured), in bytes as `devcomm
    /// bench` counts them: the all-reduce's buffer, the reduce-scatter's input, the
    /// all-gather's output.
    pub max_bytes: u64,
    /// The algorithm chosen.
    pub algorithm: TunedAlgorithm,
    /// Its blocks.
    pub blocks: u32,
    /// The staged all-reduce's pushed results ([`Choice::pushed`]).
    #[serde(default)]
    pub pushed: bool,
    /// devcomm's median time with the choice, microseconds.
    pub us: f64,
    /// devcomm's median time with the default plan in the same run, microseconds.
    pub default_us: f64,
    /// NCCL's median time in the same run on the same buffers, microseconds.
    pub nccl_us: f64,
}

impl ReduceTuneEntry {
    /// The entry's choice.
    pub const fn choice(&self) -> Choice {
        Choice {
            algorithm: self.algorithm,
            blocks: self.blocks,
            pushed: self.pushed,
        }
    }
}

/// A tuning table of the reductions (see the module documentation).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReduceTuneTable {
    /// [`REDUCE_TUNE_VERSION`].
    pub version: u32,
    /// The GPU model it was measured on, as the driver names it (e.g. `NVIDIA H200`).
    pub device: String,
    /// The world size it was measured and may be used with.
    pub world_size: usize,
    /// The day it was measured (YYYY-MM-DD).
    pub date: String,
    /// The element type it was measured with (its buckets serve every type by bytes).
    pub dtype: String,
    /// The window it was measured with.
    pub window: TunedWindow,
    /// Size buckets, by increasing `max_bytes` within each (collective, buffers).
    pub entries: Vec<ReduceTuneEntry>,
}

fn invalid(reason: String) -> Error {
    Error::InvalidArgument {
        op: "reduction tuning table",
        reason,
    }
}

/// A table's size of a call of `count` elements of `elem_bytes` on `world` ranks (as the
/// calls name the count: all-reduce elements, reduce-scatter output elements, all-gather
/// input elements): the bytes `devcomm bench` counts.
pub const fn table_bytes(collective: Collective, count: u64, elem_bytes: u64, world: usize) -> u64 {
    let bytes = count.saturating_mul(elem_bytes);
    match collective {
        Collective::AllReduce => bytes,
        _ => bytes.saturating_mul(world as u64),
    }
}

/// The bytes each rank sends each peer (the planners' payload) of a call of `bytes` as a table
/// counts them.
const fn payload(collective: Collective, bytes: u64, world: usize) -> u64 {
    match collective {
        Collective::AllReduce => bytes,
        _ => bytes / if world == 0 { 1 } else { world as u64 },
    }
}

impl ReduceTuneTable {
    /// Parses a table and checks that it is consistent ([`ReduceTuneTable::check`]).
    pub fn from_json(text: &str) -> Result<Self> {
        let table: Self = serde_json::from_str(text).map_err(|e| {
            // A send/recv table passed here says so instead of naming a missing field.
            match crate::p2p::TuneTable::from_json(text) {
                Ok(_) => invalid(format!(
                    "a send/recv tuning table (load it with {}), not a reduction table",
                    crate::p2p::TUNE_FILE_ENV
                )),
                Err(_) => invalid(format!("not a reduction tuning table: {e}")),
            }
        })?;
        if table.version != REDUCE_TUNE_VERSION {
            return Err(invalid(format!(
                "format version {} (this build reads {REDUCE_TUNE_VERSION}); run `devcomm tune \
                 --op ...` again",
                table.version
            )));
        }
        table.check()?;
        Ok(table)
    }

    /// Reads, parses and checks a table file; errors name the file.
    pub fn load(path: &Path) -> Result<Self> {
        crate::p2p::tune::load_table(path, "reduction tuning table", Self::from_json)
    }

    /// The table as pretty JSON (what `devcomm tune --out` writes).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a table always serialises")
    }

    /// Checks that the table is consistent in itself: a world size of 2 to [`MAX_WORLD`]
    /// ranks; window sizes the settings allow; for each (collective, buffers) buckets in
    /// increasing order; every entry's choice one the kernels have (an algorithm of its
    /// collective, zero-copy ones on pool buffers only, pushed results on the staged
    /// all-reduce only, 1 to [`MAX_BLOCKS`] blocks) and within the table's window for its
    /// bucket's largest call; finite, non-negative times.
    pub fn check(&self) -> Result<()> {
        if !(2..=MAX_WORLD).contains(&self.world_size) {
            return Err(invalid(format!(
                "world size {}: a table serves 2 to {MAX_WORLD} ranks",
                self.world_size
            )));
        }
        self.window.check()?;
        let w = &self.window;
        if self.entries.is_empty() {
            return Err(invalid("no entries".into()));
        }
        let world = self.world_size;
        for (i, e) in self.entries.iter().enumerate() {
            let at = || {
                format!(
                    "entry {i} ({} {} buffers, {} bytes)",
                    e.collective.name(),
                    e.buffers.name(),
                    e.max_bytes
                )
            };
            let earlier = self.entries[..i]
                .iter()
                .rev()
                .find(|p| p.collective == e.collective && p.buffers == e.buffers);
            if let Some(p) = earlier {
                if e.max_bytes <= p.max_bytes {
                    return Err(invalid(format!(
                        "{}: buckets out of order, after {} bytes",
                        at(),
                        p.max_bytes
                    )));
                }
            }
            if e.max_bytes == 0 {
                return Err(invalid(format!("{}: a bucket of 0 bytes", at())));
            }
            let a = e.algorithm;
            let wrong = if !(1..=MAX_BLOCKS).contains(&e.blocks) {
                Some(format!("{} blocks (1 to {MAX_BLOCKS})", e.blocks))
            } else if !a.serves(e.collective) {
                Some(format!(
                    "no {} kernel for {}",
                    a.name(),
                    e.collective.name()
                ))
            } else if a.zero_copy() && e.buffers != Buffers::Pool {
                Some(format!("{} needs pool buffers", a.name()))
            } else if e.pushed
                && (a != TunedAlgorithm::Staged || e.collective != Collective::AllReduce)
            {
                Some("pushed results are the staged all-reduce's only".into())
            } else if a == TunedAlgorithm::OneShot
                && payload(e.collective, e.max_bytes, world) > w.one_shot_bytes
            {
                Some(format!(
                    "the one-shot beyond the window's {} bytes of lines",
                    w.one_shot_bytes
                ))
            } else if a == TunedAlgorithm::LineTwoShot && e.max_bytes > w.line_two_shot_bytes {
                Some(format!(
                    "the two-shot on lines beyond the window's {} bytes",
                    w.line_two_shot_bytes
                ))
            } else if ![e.us, e.default_us, e.nccl_us]
                .iter()
                .all(|t| t.is_finite() && *t >= 0.0)
            {
                Some("a time that is not a finite number of microseconds".into())
            } else {
                None
            };
            if let Some(wrong) = wrong {
                return Err(invalid(format!("{}: {wrong}", at())));
            }
        }
        Ok(())
    }

    /// Checks that a communicator of `world` ranks on GPU model `device`, whose staged rounds
    /// are `chunk_bytes`, may use the table.
    pub fn validate(&self, device: &str, world: usize, chunk_bytes: u64) -> Result<()> {
        if self.device != device {
            return Err(invalid(format!(
                "measured on {:?}, this GPU is {device:?}; run `devcomm tune --op ...` here",
                self.device
            )));
        }
        if self.world_size != world {
            return Err(invalid(format!(
                "measured on {} ranks, this communicator has {world}",
                self.world_size
            )));
        }
        if self.window.chunk_bytes != chunk_bytes {
            return Err(invalid(format!(
                "measured with staged rounds of {} MiB, this communicator's are {} MiB \
                 (DEVCOMM_REDUCE_CHUNK_MIB)",
                self.window.chunk_bytes >> 20,
                chunk_bytes >> 20
            )));
        }
        Ok(())
    }

    /// The choice for a call of `bytes` (as [`table_bytes`] counts them) of `collective` on
    /// `buffers`, or `None` above the key's last bucket (or without entries for the key).
    pub fn choice_for(
        &self,
        collective: Collective,
        buffers: Buffers,
        bytes: u64,
    ) -> Option<Choice> {
        self.entries
            .iter()
            .find(|e| e.collective == collective && e.buffers == buffers && bytes <= e.max_bytes)
            .map(ReduceTuneEntry::choice)
    }

    /// SHA-256 of the table's canonical JSON: equal on every rank that loaded the same table.
    pub fn fingerprint(&self) -> [u8; 32] {
        let canonical = serde_json::to_vec(self).expect("a table always serialises");
        Sha256::digest(&canonical).into()
    }
}

/// A [`Collective`] as its method's name (`all_reduce`, ...).
mod collective_name {
    use super::Collective;

    const ALL: [Collective; 3] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
    ];

    pub(super) fn serialize<S: serde::Serializer>(c: &Collective, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(c.name())
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Collective, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(d)?;
        ALL.into_iter().find(|c| c.name() == name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown collective {name:?} (all_reduce, reduce_scatter, all_gather)"
            ))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
