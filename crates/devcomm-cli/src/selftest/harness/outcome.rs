//! Pure decisions of the self-test: what a check's outcome is on one rank, what the ranks'
//! outcomes agree to, whether the run failed, and the table rank 0 prints.

use serde::{Deserialize, Serialize};

/// Why a check did not run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Skip {
    /// The world size gives this check (or this rank's part of it) nothing to do, e.g. a ring
    /// of 3 on 2 ranks, or the odd last rank of a pairwise check. Never a failure.
    World(String),
    /// This job's links give the check nothing to do: the network checks where no link is a
    /// network link (`DEVCOMM_TOPOLOGY_OVERRIDE` forces them), or where the mix they need is
    /// not there. Never a failure; counted on its own.
    Links(String),
    /// The world size allows the check but something else stopped it (a feature missing on
    /// this machine, a peer not reachable the way the check needs). A failure of the run
    /// unless the user allows skips (`--allow-skip`).
    Unavailable(String),
}

/// One check's outcome (on one rank, or agreed by all).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// Ran and verified; what was checked.
    Pass(String),
    /// Ran and found something wrong, or could not complete; what.
    Fail(String),
    /// Did not run; why.
    Skip(Skip),
}

impl Outcome {
    /// The word of the table's cell.
    pub(crate) fn word(&self) -> &'static str {
        match self {
            Self::Pass(_) => "pass",
            Self::Fail(_) => "FAIL",
            Self::Skip(_) => "skip",
        }
    }

    /// The detail text.
    pub(crate) fn detail(&self) -> &str {
        match self {
            Self::Pass(d)
            | Self::Fail(d)
            | Self::Skip(Skip::World(d) | Skip::Links(d) | Skip::Unavailable(d)) => d,
        }
    }
}

/// What a check function returns: `Err` is a failure with its message.
pub(crate) type Checked = Result<Outcome, String>;

/// A check that returned its detail text: `Ok` passes, `Err` fails.
pub(crate) fn verified(r: Result<String, String>) -> Checked {
    r.map(Outcome::Pass)
}

/// Which ranks a check needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ranks {
    /// At least this many ranks; every rank takes part.
    AtLeast(usize),
    /// Pairs 0-1, 2-3, ... (at least two ranks). On an odd world the last rank has no
    /// partner: it runs the check's collective calls (registration) but sits out its host
    /// barriers and waits for the pairs at the end; its part is a skip for the world size.
    Pairs,
}

impl Ranks {
    /// The smallest world the check runs on.
    pub(crate) fn min_world(self) -> usize {
        match self {
            Self::AtLeast(n) => n.max(1),
            Self::Pairs => 2,
        }
    }
}

/// The rank that sits out a check's host barriers on `world` ranks: the odd last rank of a
/// pairwise check, which has no partner (it still takes part in collective calls).
pub(crate) fn sits_out(ranks: Ranks, world: usize) -> Option<usize> {
    (ranks == Ranks::Pairs && world % 2 == 1).then(|| world - 1)
}

/// The outcome of a check on `rank` of `world`: not run (`ran` is `None`) when the world is too
/// small; a pass of the odd last rank of a pairwise check becomes a skip for the world size.
pub(crate) fn rank_outcome(
    ranks: Ranks,
    world: usize,
    rank: usize,
    ran: Option<Checked>,
) -> Outcome {
    let Some(result) = ran else {
        return Outcome::Skip(Skip::World(format!(
            "needs {} or more ranks, the world has {world}",
            ranks.min_world()
        )));
    };
    match (result, ranks) {
        (Err(e), _) => Outcome::Fail(e),
        (Ok(Outcome::Pass(_)), _) if sits_out(ranks, world) == Some(rank) => {
            Outcome::Skip(Skip::World(format!(
                "no partner: rank {rank} is the odd last rank of {world} (the pairs checked)"
            )))
        }
        (Ok(o), _) => o,
    }
}

/// What all ranks' outcomes of one check (`None`: a rank did not report it) agree to: a
/// failure anywhere fails; a skip that is not for the world size anywhere is such a skip;
/// otherwise a pass anywhere passes (the other ranks had nothing to do at this world size);
/// otherwise a skip for the world size. The detail names the rank it comes from when it is
/// not rank 0's.
pub(crate) fn agree(per_rank: &[Option<&Outcome>]) -> Outcome {
    let from = |r: usize, d: &str| {
        if r == 0 {
            d.to_owned()
        } else {
            format!("rank {r}: {d}")
        }
    };
    if let Some(r) = per_rank.iter().position(Option::is_none) {
        return Outcome::Fail(format!("rank {r} did not report this check"));
    }
    let all: Vec<(usize, &Outcome)> = per_rank
        .iter()
        .enumerate()
        .filter_map(|(r, o)| o.map(|o| (r, o)))
        .collect();
    if let Some((r, o)) = all.iter().find(|(_, o)| matches!(o, Outcome::Fail(_))) {
        return Outcome::Fail(from(*r, o.detail()));
    }
    if let Some((r, o)) = all
        .iter()
        .find(|(_, o)| matches!(o, Outcome::Skip(Skip::Unavailable(_))))
    {
        return Outcome::Skip(Skip::Unavailable(from(*r, o.detail())));
    }
    if let Some((r, o)) = all.iter().find(|(_, o)| matches!(o, Outcome::Pass(_))) {
        return Outcome::Pass(from(*r, o.detail()));
    }
    if let Some((r, o)) = all
        .iter()
        .find(|(_, o)| matches!(o, Outcome::Skip(Skip::Links(_))))
    {
        return Outcome::Skip(Skip::Links(from(*r, o.detail())));
    }
    match all.first() {
        Some((r, o)) => Outcome::Skip(Skip::World(from(*r, o.detail()))),
        None => Outcome::Fail("no rank reported this check".into()),
    }
}

/// The agreed outcome of each of `checks` checks; `per_rank[r][i]` is rank `r`'s outcome of
/// check `i` (missing when the rank reported fewer).
pub(crate) fn agree_all(checks: usize, per_rank: &[Vec<Outcome>]) -> Vec<Outcome> {
    (0..checks)
        .map(|i| agree(&per_rank.iter().map(|rs| rs.get(i)).collect::<Vec<_>>()))
        .collect()
}

/// Whether the run failed: any check failed, or was skipped for another reason than the world
/// size while skips are not allowed.
pub(crate) fn run_failed(agreed: &[Outcome], allow_skip: bool) -> bool {
    agreed.iter().any(|o| match o {
        Outcome::Fail(_) => true,
        Outcome::Skip(Skip::Unavailable(_)) => !allow_skip,
        Outcome::Pass(_) | Outcome::Skip(Skip::World(_) | Skip::Links(_)) => false,
    })
}

/// The table rank 0 prints: a row per check (a cell per rank, the agreed detail), every rank's
/// failures, the skips that count against the run, and the verdict. `per_rank[r][i]` is rank
/// `r`'s outcome of check `names[i]` (missing when the rank reported fewer).
pub(crate) fn render_table(names: &[&str], per_rank: &[Vec<Outcome>], allow_skip: bool) -> String {
    use std::fmt::Write;
    let agreed = agree_all(names.len(), per_rank);
    let mut out = String::new();
    let ranks: String = (0..per_rank.len()).map(|r| format!("rank{r:<4}")).collect();
    let _ = writeln!(out, "\n{:<22} {ranks}", "check");
    for (i, name) in names.iter().enumerate() {
        let cells: String = per_rank
            .iter()
            .map(|rs| format!("{:<8}", rs.get(i).map_or("-", Outcome::word)))
            .collect();
        let _ = writeln!(out, "{name:<22} {cells} {}", agreed[i].detail());
    }
    for (r, rs) in per_rank.iter().enumerate() {
        for (name, o) in names.iter().zip(rs) {
            if let Outcome::Fail(d) = o {
                let _ = writeln!(out, "rank {r} {name}: {d}");
            }
        }
    }
    for (name, o) in names.iter().zip(&agreed) {
        if let Outcome::Skip(Skip::Unavailable(d)) = o {
            let rule = if allow_skip {
                "allowed by --allow-skip"
            } else {
                "counts as a failure; --allow-skip accepts it"
            };
            let _ = writeln!(out, "skip {name}: {d} ({rule})");
        }
    }
    let count = |f: fn(&Outcome) -> bool| agreed.iter().filter(|o| f(o)).count();
    let passed = count(|o| matches!(o, Outcome::Pass(_)));
    let failed = count(|o| matches!(o, Outcome::Fail(_)));
    let small = count(|o| matches!(o, Outcome::Skip(Skip::World(_))));
    let links = count(|o| matches!(o, Outcome::Skip(Skip::Links(_))));
    let other = count(|o| matches!(o, Outcome::Skip(Skip::Unavailable(_))));
    let verdict = if run_failed(&agreed, allow_skip) {
        "SELFTEST FAILED"
    } else {
        "SELFTEST PASSED"
    };
    let _ = writeln!(
        out,
        "{verdict} ({passed} passed, {failed} failed, {small} skipped for the world size, \
         {}{other} skipped otherwise{})",
        if links > 0 {
            format!("{links} skipped for the job's links, ")
        } else {
            String::new()
        },
        if other > 0 && allow_skip {
            ", allowed"
        } else {
            ""
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(d: &str) -> Outcome {
        Outcome::Pass(d.into())
    }

    fn world_skip(d: &str) -> Outcome {
        Outcome::Skip(Skip::World(d.into()))
    }

    fn missing(d: &str) -> Outcome {
        Outcome::Skip(Skip::Unavailable(d.into()))
    }

    #[test]
    fn a_skip_for_the_links_never_fails_and_is_counted_on_its_own() {
        let links = || Outcome::Skip(Skip::Links("no network link".into()));
        let agreed = agree(&[Some(&links()), Some(&world_skip("no partner"))]);
        assert_eq!(agreed, links());
        assert!(!run_failed(&[links(), pass("x")], false));
        // A pass on one rank still passes; an unavailable skip still counts against the run.
        assert_eq!(
            agree(&[Some(&links()), Some(&pass("x"))]),
            Outcome::Pass("rank 1: x".into())
        );
        assert!(run_failed(&[links(), missing("no NVLink")], false));
        let t = render_table(&["a", "b"], &[vec![links(), pass("x")]], false);
        assert!(
            t.contains("SELFTEST PASSED (1 passed, 0 failed, 0 skipped for the world size, 1 skipped for the job's links, 0 skipped otherwise)"),
            "{t}"
        );
    }

    #[test]
    fn too_small_a_world_is_a_world_skip() {
        let o = rank_outcome(Ranks::AtLeast(3), 2, 0, None);
        assert_eq!(o, world_skip("needs 3 or more ranks, the world has 2"));
        let o = rank_outcome(Ranks::Pairs, 1, 0, None);
        assert!(o.detail().starts_with("needs 2 or more"));
    }

    #[test]
    fn odd_last_rank_of_pairs_skips_and_others_keep_their_outcome() {
        let ok = || Some(Ok(pass("x")));
        assert!(matches!(
            rank_outcome(Ranks::Pairs, 3, 2, ok()),
            Outcome::Skip(Skip::World(_))
        ));
        assert_eq!(rank_outcome(Ranks::Pairs, 3, 1, ok()), pass("x"));
        assert_eq!(rank_outcome(Ranks::Pairs, 4, 3, ok()), pass("x"));
        assert_eq!(rank_outcome(Ranks::AtLeast(2), 3, 2, ok()), pass("x"));
        // A failure of the odd last rank stays a failure.
        let failed = rank_outcome(Ranks::Pairs, 3, 2, Some(Err("barrier".into())));
        assert_eq!(failed, Outcome::Fail("barrier".into()));
        // A check's own skip passes through.
        let skipped = rank_outcome(Ranks::AtLeast(2), 2, 0, Some(Ok(missing("no NVLink"))));
        assert_eq!(skipped, missing("no NVLink"));
    }

    #[test]
    fn only_the_odd_last_rank_of_pairs_sits_out() {
        assert_eq!(sits_out(Ranks::Pairs, 3), Some(2));
        assert_eq!(sits_out(Ranks::Pairs, 5), Some(4));
        assert_eq!(sits_out(Ranks::Pairs, 4), None);
        assert_eq!(sits_out(Ranks::Pairs, 2), None);
        assert_eq!(sits_out(Ranks::AtLeast(2), 3), None);
    }

    #[test]
    fn agreement_fail_beats_skip_beats_pass() {
        let (p, w, m, f) = (
            pass("p"),
            world_skip("w"),
            missing("m"),
            Outcome::Fail("f".into()),
        );
        assert_eq!(agree(&[Some(&p), Some(&p)]), pass("p"));
        assert_eq!(agree(&[Some(&p), Some(&w)]), pass("p"));
        assert_eq!(agree(&[Some(&w), Some(&p)]), pass("rank 1: p"));
        assert_eq!(agree(&[Some(&w), Some(&w)]), world_skip("w"));
        assert_eq!(agree(&[Some(&p), Some(&m)]), missing("rank 1: m"));
        assert_eq!(
            agree(&[Some(&m), Some(&f), Some(&p)]),
            Outcome::Fail("rank 1: f".into())
        );
        assert_eq!(
            agree(&[Some(&p), None]),
            Outcome::Fail("rank 1 did not report this check".into())
        );
        assert!(matches!(agree(&[]), Outcome::Fail(_)));
    }

    #[test]
    fn exit_rule_for_skips() {
        let ok = [pass("a"), world_skip("needs 3 or more ranks")];
        assert!(!run_failed(&ok, false));
        let skipped = [pass("a"), missing("copy engine off")];
        assert!(run_failed(&skipped, false));
        assert!(!run_failed(&skipped, true));
        let failed = [Outcome::Fail("x".into()), missing("y")];
        assert!(run_failed(&failed, true));
        assert!(!run_failed(&[], false));
    }

    #[test]
    fn table_prints_skip_and_says_what_counts() {
        let names = ["ring", "peer_read", "sizes"];
        let per_rank = vec![
            vec![
                world_skip("needs 3 or more ranks"),
                missing("peer not on NVLink"),
                pass("ok"),
            ],
            vec![
                world_skip("needs 3 or more ranks"),
                pass("read"),
                pass("ok"),
            ],
        ];
        let t = render_table(&names, &per_rank, false);
        let ring = t
            .lines()
            .find(|l| l.starts_with("ring"))
            .unwrap_or_default();
        assert!(ring.contains("skip    skip"), "{t}");
        assert!(ring.contains("needs 3 or more ranks"), "{t}");
        assert!(!ring.contains("pass"), "{t}");
        let peer = t
            .lines()
            .find(|l| l.starts_with("peer_read"))
            .unwrap_or_default();
        assert!(peer.contains("skip    pass"), "{t}");
        assert!(
            t.contains("skip peer_read: peer not on NVLink (counts as a failure"),
            "{t}"
        );
        assert!(t.contains("SELFTEST FAILED (1 passed, 0 failed, 1 skipped for the world size, 1 skipped otherwise)"), "{t}");
        let allowed = render_table(&names, &per_rank, true);
        assert!(allowed.contains("allowed by --allow-skip"), "{allowed}");
        assert!(allowed.contains("SELFTEST PASSED"), "{allowed}");
    }

    #[test]
    fn table_lists_failures_and_missing_ranks() {
        let names = ["a", "b"];
        let per_rank = vec![
            vec![pass("ok"), Outcome::Fail("byte 7 is 0xa5".into())],
            vec![pass("ok")],
        ];
        let t = render_table(&names, &per_rank, true);
        let b = t.lines().find(|l| l.starts_with("b ")).unwrap_or_default();
        assert!(b.contains("FAIL    -"), "{t}");
        assert!(t.contains("rank 0 b: byte 7 is 0xa5"), "{t}");
        assert!(t.contains("SELFTEST FAILED"), "{t}");
    }
}
