//! The bottom of the self-test: what a check is, what it returns, the context it runs in, the
//! helpers checks share, and the runner. Nothing here imports a group; groups import only
//! this module.
//!
//! A check is a [`Check`]: a name (what `--only` matches), the ranks it needs ([`Ranks`]), a
//! one-line description (listed by `devcomm selftest --help`) and a function of the context
//! and the run's [`Params`] that returns an [`Outcome`]: pass, fail, or skip with a reason.
//! The runner runs the selected checks in order on every rank (all ranks enter each check
//! together), agrees each check's outcome across ranks ([`outcome::agree`]), prints the table
//! on rank 0 and decides the exit status ([`outcome::run_failed`]): a failure fails the run; a
//! skip because the world is too small does not; any other skip does, unless `--allow-skip`.

mod context;
mod data;
mod fresh;
mod outcome;
mod ring;

use std::time::{Duration, Instant};

pub(crate) use context::Ctx;
pub(crate) use data::{
    compare, doubling_epilogue, doubling_hooks, partner, poisoned, roles, with_row_threads,
    BenchDst, RegBuf, POISON, SIZES,
};
pub(crate) use fresh::{fresh_comm, fresh_comm_with, Fresh};
pub(crate) use outcome::{verified, Checked, Outcome, Ranks, Skip};
pub(crate) use ring::ring_gather;

/// The run's counts and limits, from the command line.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    /// Iterations of the cross-rank barrier check.
    pub(crate) barrier_iters: u64,
    /// Window create/destroy cycles of the leak check.
    pub(crate) churn: usize,
    /// Back-to-back send/recv calls of the stress checks.
    pub(crate) calls: usize,
    /// Back-to-back all-to-all-v calls of the collective stress check.
    pub(crate) coll_calls: usize,
    /// Replays of the captured graphs.
    pub(crate) replays: usize,
    /// Device timeout of the timeout check.
    pub(crate) timeout: Duration,
}

/// One check of the registry.
#[derive(Clone, Copy)]
pub(crate) struct Check {
    /// Its name in the table and for `--only`.
    pub(crate) name: &'static str,
    /// The ranks it needs: on a smaller world it is skipped without running.
    pub(crate) ranks: Ranks,
    /// One line for `devcomm selftest --help`.
    pub(crate) about: &'static str,
    /// Runs it on this rank.
    pub(crate) run: fn(&Ctx, &Params) -> Checked,
}

/// A group of checks: one module of the self-test.
#[derive(Clone, Copy)]
pub(crate) struct Group {
    /// The module's name; `--only NAME` selects the whole group.
    pub(crate) name: &'static str,
    /// Its checks, in run order.
    pub(crate) checks: &'static [Check],
}

/// The checks `--only` selects, in order: those of the group named `only` and those whose
/// names contain it; every check without `--only`. Selecting nothing is an error.
pub(crate) fn select<'a>(
    groups: &'a [Group],
    only: Option<&str>,
) -> Result<Vec<&'a Check>, String> {
    let chosen: Vec<&Check> = groups
        .iter()
        .flat_map(|g| g.checks.iter().map(move |c| (g, c)))
        .filter(|(g, c)| {
            only.is_none_or(|o| {
                o.split(',')
                    .any(|o| !o.is_empty() && (g.name == o || c.name.contains(o)))
            })
        })
        .map(|(_, c)| c)
        .collect();
    match only {
        Some(o) if chosen.is_empty() => Err(format!(
            "--only {o:?} matches no group and no check name (devcomm selftest --help lists them)"
        )),
        _ => Ok(chosen),
    }
}

/// The list of groups and checks for `--help`.
pub(crate) fn describe(groups: &[Group]) -> String {
    let mut out = String::from(
        "Checks (--only NAME runs a group, or the checks whose names contain NAME; NAME,NAME \
         runs each):\n",
    );
    for g in groups {
        out.push_str(&format!("\n  {}:\n", g.name));
        for c in g.checks {
            let ranks = match c.ranks {
                Ranks::AtLeast(1) => String::new(),
                Ranks::AtLeast(n) => format!(" [{n}+ ranks]"),
                Ranks::Pairs => " [pairs]".to_owned(),
            };
            out.push_str(&format!("    {:<22} {}{ranks}\n", c.name, c.about));
        }
    }
    out
}

/// One check's outcome on one rank, as exchanged between ranks.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    name: String,
    outcome: Outcome,
    seconds: f64,
}

/// Runs the selected checks on every rank, prints the table on rank 0 and returns the exit
/// status, the same on every rank.
pub(crate) fn run(
    groups: &[Group],
    params: &Params,
    only: Option<&str>,
    allow_skip: bool,
) -> Result<i32, String> {
    let checks = select(groups, only)?;
    // The checks assert the default plans' algorithms at every switch: no reduction tuning
    // table, whatever the settings or the built-in tables say.
    let cx = Ctx::built(|b| b.reduce_tune_table(None))?;
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let mut records = Vec::with_capacity(checks.len());
    for check in &checks {
        let t = Instant::now();
        let ran = (world >= check.ranks.min_world()).then(|| {
            let sits_out = outcome::sits_out(check.ranks, world);
            if let Err(e) = cx.enter_phase(check.name, sits_out) {
                eprintln!("{}: ranks did not meet: {e}", check.name);
            }
            let result = (check.run)(&cx, params);
            // Every rank leaves together, failed or not, when one sat out the barriers.
            let left = if sits_out.is_some() {
                cx.leave_phase()
            } else {
                Ok(())
            };
            result.and_then(|o| left.map(|()| o))
        });
        let outcome = outcome::rank_outcome(check.ranks, world, rank, ran);
        eprintln!("{}: {} ({})", check.name, outcome.word(), outcome.detail());
        records.push(Record {
            name: check.name.to_owned(),
            outcome,
            seconds: t.elapsed().as_secs_f64(),
        });
    }
    let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
    report(&cx, &names, &records, allow_skip)
}

fn report(cx: &Ctx, names: &[&str], records: &[Record], allow_skip: bool) -> Result<i32, String> {
    let blob = serde_json::to_vec(records).map_err(|e| e.to_string())?;
    let all = cx
        .comm
        .store()
        .all_gather("__devcomm_cli/selftest", &blob, cx.comm.setup_timeout())
        .map_err(|e| e.to_string())?;
    let per_rank: Vec<Vec<Outcome>> = all
        .iter()
        .map(|b| {
            let rs: Vec<Record> = serde_json::from_slice(b).map_err(|e| e.to_string())?;
            // Every rank runs the same list; a rank that stopped short reports fewer.
            Ok(rs
                .into_iter()
                .zip(names)
                .take_while(|(r, n)| r.name == **n)
                .map(|(r, _)| r.outcome)
                .collect())
        })
        .collect::<Result<_, String>>()?;
    let agreed = outcome::agree_all(names.len(), &per_rank);
    if cx.comm.rank() == 0 {
        print!("{}", outcome::render_table(names, &per_rank, allow_skip));
    }
    Ok(i32::from(outcome::run_failed(&agreed, allow_skip)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[Check] = &[
        Check {
            name: "put_signal",
            ranks: Ranks::AtLeast(2),
            about: "puts",
            run: |_, _| verified(Ok("ok".into())),
        },
        Check {
            name: "window_churn",
            ranks: Ranks::AtLeast(1),
            about: "leaks",
            run: |_, _| Ok(Outcome::Skip(Skip::Unavailable("x".into()))),
        },
    ];
    const B: &[Check] = &[Check {
        name: "sendrecv_ring",
        ranks: Ranks::AtLeast(3),
        about: "ring",
        run: |_, _| Err("no".into()),
    }];
    const GROUPS: &[Group] = &[
        Group {
            name: "foundation",
            checks: A,
        },
        Group {
            name: "p2p",
            checks: B,
        },
    ];

    fn names(only: Option<&str>) -> Vec<&'static str> {
        select(GROUPS, only)
            .unwrap_or_default()
            .iter()
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn only_selects_a_group_or_names_containing_it() {
        assert_eq!(names(None), ["put_signal", "window_churn", "sendrecv_ring"]);
        assert_eq!(names(Some("p2p")), ["sendrecv_ring"]);
        assert_eq!(names(Some("foundation")), ["put_signal", "window_churn"]);
        assert_eq!(
            names(Some("_")),
            ["put_signal", "window_churn", "sendrecv_ring"]
        );
        assert_eq!(names(Some("ring")), ["sendrecv_ring"]);
        assert_eq!(names(Some("p2p,churn")), ["window_churn", "sendrecv_ring"]);
        assert_eq!(names(Some("ring,")), ["sendrecv_ring"]);
        let err = select(GROUPS, Some("nope")).err().unwrap_or_default();
        assert!(err.contains("matches no group"), "{err}");
    }

    #[test]
    fn help_lists_every_check_with_its_ranks() {
        let h = describe(GROUPS);
        for c in A.iter().chain(B) {
            assert!(h.contains(c.name), "{h}");
        }
        assert!(h.contains("[3+ ranks]"), "{h}");
        assert!(h.contains("  p2p:"), "{h}");
    }
}
