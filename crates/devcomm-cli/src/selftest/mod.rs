//! `devcomm selftest`: checks the device operations on the GPUs against host references, on
//! fresh random data with poisoned outputs, and prints a table of pass, fail and skip (rank 0).
//!
//! # Layout
//!
//! A tree over a small harness, without cycles:
//!
//! - [`harness`]: the bottom. What a check is ([`harness::Check`]: name, the ranks it needs,
//!   one line of help, a function), what it returns ([`harness::Outcome`]: pass, fail, or skip
//!   with a reason), the context it runs in ([`harness::Ctx`]), the helpers checks share
//!   (poison and guard bytes, seeded random data, comparison, registered buffers) and the
//!   runner (cross-rank agreement, the table, the exit status). It imports no group.
//! - one module per group (`foundation`, `p2p`, `zero_copy`, `collectives`, `mismatch`,
//!   `adversarial`, `net`, `timeout`): its
//!   checks and a `CHECKS` list. A group imports only the harness, never another group; a
//!   group that grows may be a folder whose files import each other without a cycle.
//!
//! # Adding a group
//!
//! 1. Write `selftest/NAME.rs` (or `selftest/NAME/mod.rs`) that imports only
//!    `super::harness` and ends with
//!    `pub(super) const CHECKS: &[Check] = &[Check { name, ranks, about, run }, ...];`.
//!    A check function returns [`harness::Checked`]: `Ok(Outcome::Pass(..))`,
//!    `Ok(Outcome::Skip(..))` or `Err(message)`; one returning `Result<String, String>` (the
//!    detail of a pass) is wrapped with [`harness::verified`].
//! 2. Add `NAME` to the `groups!` list below, before `timeout`.
//!
//! `--only NAME` then selects the group, `--help` lists its checks.
//!
//! Every rank runs every selected check, in the same order, entering each together. Inside a
//! check, ranks meet with `Ctx::host_barrier` and must make the same collective calls
//! (`Comm::register`, `Comm::window`, the collectives) in the same order. In a
//! [`harness::Ranks::Pairs`] check on an odd world the last rank has no partner: its host
//! barriers return at once (the pairs meet without it), it must still make the collective
//! calls, and all ranks wait for each other when the check ends.
//!
//! # Skips
//!
//! A check runs only on a world of at least its [`harness::Ranks`]; on a smaller one it is a
//! skip for the world size, which never fails the run (nor does the odd last rank of a
//! pairwise check). A check that cannot run although the world size allows it (a feature
//! missing on this machine) returns `Outcome::Skip(Skip::Unavailable(reason))`: the table
//! prints `skip` and the run fails, unless `--allow-skip` is given.

mod harness;

pub(crate) use harness::{fresh_comm_with, with_row_threads, BenchDst, Ctx, Fresh};

/// Declares the groups (one module each) and [`GROUPS`], in run order.
macro_rules! groups {
    ($($group:ident),* $(,)?) => {
        $(mod $group;)*
        /// Every group, in run order.
        const GROUPS: &[harness::Group] = &[
            $(harness::Group { name: stringify!($group), checks: $group::CHECKS },)*
        ];
    };
}

// Keep `timeout` last: a timed-out wait leaves the communicator aborted.
groups!(
    foundation,
    p2p,
    zero_copy,
    collectives,
    reduce,
    mismatch,
    adversarial,
    pool,
    moe,
    trace,
    net,
    timeout
);

/// Arguments of `devcomm selftest`.
#[derive(Debug, clap::Args)]
pub struct SelftestArgs {
    /// Run only the checks of this group or whose names contain this text (several,
    /// separated by commas: each).
    #[arg(long)]
    only: Option<String>,
    /// Let checks that could not run although the world size allows them (a feature missing
    /// on this machine) pass the run; they still print `skip`.
    #[arg(long)]
    allow_skip: bool,
    /// Iterations of the cross-rank barrier check.
    #[arg(long, default_value_t = 10_000)]
    barrier_iters: u64,
    /// Window create/destroy cycles of the leak check.
    #[arg(long, default_value_t = 100)]
    churn: usize,
    /// Back-to-back send/recv calls of the stress check.
    #[arg(long, default_value_t = 10_000)]
    calls: usize,
    /// Back-to-back all-to-all-v calls of the collective stress check.
    #[arg(long, default_value_t = 500)]
    coll_calls: usize,
    /// Replays of the captured send/recv and all-to-all-v graphs.
    #[arg(long, default_value_t = 1_000)]
    replays: usize,
    /// Device timeout used by the timeout check, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    timeout_ms: u64,
}

/// The list of groups and checks that `devcomm selftest --help` prints.
pub fn checks_help() -> String {
    harness::describe(GROUPS)
}

/// Refuses arguments that select nothing, before any rank is launched.
pub fn check_args(args: &SelftestArgs) -> Result<(), String> {
    harness::select(GROUPS, args.only.as_deref()).map(|_| ())
}

/// Runs the checks on every rank and prints the table on rank 0; the exit status is the same
/// on every rank.
pub fn run(args: &SelftestArgs) -> Result<i32, String> {
    let params = harness::Params {
        barrier_iters: args.barrier_iters,
        churn: args.churn,
        calls: args.calls,
        coll_calls: args.coll_calls,
        replays: args.replays,
        timeout: std::time::Duration::from_millis(args.timeout_ms),
    };
    harness::run(GROUPS, &params, args.only.as_deref(), args.allow_skip)
}

#[cfg(test)]
mod tests {
    use super::GROUPS;

    #[test]
    fn check_names_are_unique_and_timeout_is_last() {
        let names: Vec<&str> = GROUPS
            .iter()
            .flat_map(|g| g.checks.iter().map(|c| c.name))
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{names:?}");
        assert_eq!(names.last(), Some(&"wait_timeout"));
    }
}
