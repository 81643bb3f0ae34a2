//! Layer 9: the reductions, all-reduce, reduce-scatter and all-gather, in a fixed order
//! (docs/COLLECTIVES.md, "Reductions").
//!
//! Element `i` of a result is the reduction of the ranks' element `i` in rank order 0, 1, ...,
//! n-1, whatever the size, the algorithm or the block count: results are bitwise identical on
//! every rank and from run to run, and a prefix of a large call equals the call on that
//! prefix. The methods are on [`crate::Comm`] (`all_reduce`, `reduce_scatter`, `all_gather`,
//! their `_in_place` and `_raw` forms, `all_reduce_hooked`); this module holds the types
//! ([`types`]), the pure planners ([`plan`] for the line one-shot and staged two-shot,
//! [`zero_copy_plan`] for pool buffers, [`tuned_plan`] for a tuning table's choice), the host's
//! model of an epilogue hook's row group ([`rows`]), the host argument checks and the launch.

pub(crate) mod args;
pub(crate) mod config;
pub(crate) mod family;
pub(crate) mod launch;
pub(crate) mod net;
pub mod net_plan;
pub mod plan;
pub mod rows;
pub(crate) mod specs;
pub mod tune;
pub(crate) mod tune_builtin;
pub mod tuned_plan;
pub mod types;
pub mod zero_copy_plan;

pub use plan::{Algorithm, Collective, Plan, ReduceLimits};
pub use specs::{kernel_expression, net_step_expression, KERNEL_SOURCE};
pub use tune::{Buffers, ReduceTuneEntry, ReduceTuneTable, TunedWindow};
pub use tuned_plan::{Choice, TunedAlgorithm};
pub use types::{DataType, ReduceOp, Reducible};

/// Bytes of a staged two-shot round per rank on `world` ranks under `config`
/// (`DEVCOMM_REDUCE_CHUNK_MIB`, or the default by ranks: [`plan::chunk_max_bytes`]): what the
/// window holds two of, and what a tuning table is measured with.
pub fn chunk_bytes(config: &crate::Config, world: usize) -> u64 {
    config
        .reduce_chunk_mib
        .map_or(plan::chunk_max_bytes(world), |m| u64::from(m.max(1)) << 20)
}
