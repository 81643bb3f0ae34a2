//! Pure and collective steps of a communicator's setup: the default device, the agreement on
//! the tuning tables, and agreement before the group exists.

use std::time::Duration;

use devcomm_bootstrap::Store;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::p2p::TUNE_FILE_ENV;

/// The device a rank opens when the builder names none, where `count` GPUs are visible: its
/// local rank, or with [`crate::topology::SHARE_GPU_ENV`] the local rank modulo `count`.
pub(super) fn default_ordinal(local_rank: usize, count: i32, share: bool) -> Result<usize> {
    let count = usize::try_from(count).unwrap_or(0);
    if count == 0 {
        return Err(Error::InvalidArgument {
            op: "Comm",
            reason: "no GPU is visible".into(),
        });
    }
    if share {
        return Ok(local_rank % count);
    }
    if local_rank >= count {
        return Err(Error::InvalidArgument {
            op: "Comm",
            reason: format!(
                "LOCAL_RANK {local_rank} opens GPU {local_rank}, but {count} GPU(s) are visible: \
                 start at most one rank per GPU, or set {}=1 to run several ranks on one GPU for \
                 functional tests (docs/TESTING.md)",
                crate::topology::SHARE_GPU_ENV
            ),
        });
    }
    Ok(local_rank)
}

/// A kind of tuning table the ranks compare: the store key, and the words of its errors.
#[derive(Debug, Clone, Copy)]
pub(super) struct TableKind {
    key: &'static str,
    /// What the table is called (the setup step of its errors).
    what: &'static str,
    /// What the user sets alike on every rank.
    setting: &'static str,
}

/// Send/recv's table (`DEVCOMM_TUNE_FILE`).
pub(super) const SEND_RECV_TABLE: TableKind = TableKind {
    key: "__devcomm/tune/fingerprint",
    what: "tuning table",
    setting: TUNE_FILE_ENV,
};

/// The reductions' table (`DEVCOMM_REDUCE_TUNE_FILE`, or built in).
pub(super) const REDUCTION_TABLE: TableKind = TableKind {
    key: "__devcomm/reduce_tune/fingerprint",
    what: "reduction tuning table",
    setting: "DEVCOMM_REDUCE_TUNE_FILE (the built-in tables go by the GPU model)",
};

/// The reductions' window asked for in code (`CommBuilder::reduce_window`): the kernels lay
/// out their line areas by it.
pub(super) const REDUCTION_WINDOW: TableKind = TableKind {
    key: "__devcomm/reduce_window/fingerprint",
    what: "reduction window",
    setting: "CommBuilder::reduce_window",
};

/// Fails on every rank unless every rank loaded the same table of `kind` (or none), as its
/// `fingerprint` says: both ends of a message, every rank of a reduction, must pick the same
/// configuration from it.
pub(super) fn same_table_everywhere(
    store: &Store,
    rank: usize,
    kind: &TableKind,
    fingerprint: Option<[u8; 32]>,
    timeout: Duration,
) -> Result<()> {
    let mine = fingerprint.map_or_else(Vec::new, |f| f.to_vec());
    let all = store.all_gather(kind.key, &mine, timeout)?;
    let failures: Vec<(usize, String)> = all
        .iter()
        .enumerate()
        .filter(|(_, f)| **f != all[0])
        .map(|(r, f)| {
            let what = if f.is_empty() { "no" } else { "another" };
            (
                r,
                format!(
                    "{what} {} than rank 0 (set {} alike on every rank)",
                    kind.what, kind.setting
                ),
            )
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        log::debug!("rank {rank}: {}s differ: {failures:?}", kind.what);
        Err(Error::Setup {
            step: kind.what.into(),
            failures,
        })
    }
}

/// Compares the settings that must agree across ranks (docs/CONFIG.md, "ranks must agree"):
/// a difference is [`Error::Setup`] on every rank, naming each setting and which ranks hold
/// which value, before anything acts on it (a transfer planned differently on two ends would
/// otherwise show up as a device timeout, or not at all).
pub(super) fn agree_on_config(store: &Store, rank: usize, config: &Config) -> Result<()> {
    let views = store.all_gather(
        "__devcomm/config",
        crate::config::agree::view(config).as_bytes(),
        config.setup_timeout,
    )?;
    let views: Vec<String> = views
        .iter()
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    match crate::config::agree::disagreements(&views) {
        None => Ok(()),
        Some(failures) => {
            log::debug!("rank {rank}: settings differ across ranks: {failures:?}");
            Err(Error::Setup {
                step: "configuration (settings that must agree, docs/CONFIG.md)".into(),
                failures,
            })
        }
    }
}

/// Agreement before the `Group` exists (same protocol as `Group::agree`).
pub(super) fn agree_on_store<T>(
    store: &Store,
    step: &str,
    rank: usize,
    local: Result<T>,
    timeout: Duration,
) -> Result<T> {
    let agreed = crate::group::agree_on(
        store,
        &format!("__devcomm/agree/{step}"),
        step,
        local,
        timeout,
    );
    if let Err(Error::Setup { failures, .. }) = &agreed {
        log::debug!("rank {rank}: step {step} failed somewhere: {failures:?}");
    }
    agreed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::p2p::{P2PLimits, TuneTable};
    use devcomm_bootstrap::RankInfo;

    const T: Duration = Duration::from_secs(20);

    #[test]
    fn each_rank_opens_its_own_gpu_unless_sharing() {
        assert_eq!(default_ordinal(1, 4, false).unwrap(), 1);
        let err = default_ordinal(1, 1, false).unwrap_err().to_string();
        assert!(err.contains("1 GPU(s) are visible") && err.contains("DEVCOMM_SHARE_GPU"));
        assert_eq!(default_ordinal(3, 1, true).unwrap(), 0);
        assert_eq!(default_ordinal(3, 2, true).unwrap(), 1);
        assert!(default_ordinal(0, 0, true).is_err());
    }

    /// The tuning module's sample table, its first bucket on `blocks` blocks.
    fn table(blocks: u32) -> TuneTable {
        let mut t = crate::p2p::tune::tests::table(&P2PLimits::default());
        t.entries[0].config.blocks = blocks;
        t
    }

    /// Two ranks in this process (rank 1 on a thread) compare their tables' fingerprints;
    /// returns each rank's outcome.
    fn compare_kind(
        kind: &'static TableKind,
        mine: Option<[u8; 32]>,
        theirs: Option<[u8; 32]>,
    ) -> [Result<()>; 2] {
        let info0 = RankInfo::new(0, 2).with_master("127.0.0.1", 0);
        let s0 = Store::connect(&info0, T).expect("rank 0 store");
        let info1 = RankInfo::new(1, 2).with_master("127.0.0.1", s0.master_port());
        let rank1 = std::thread::spawn(move || {
            let s1 = Store::connect(&info1, T).expect("rank 1 store");
            same_table_everywhere(&s1, 1, kind, theirs, T)
        });
        let r0 = same_table_everywhere(&s0, 0, kind, mine, T);
        [r0, rank1.join().expect("rank 1 thread")]
    }

    /// [`compare_kind`] of send/recv tables.
    fn compare(mine: Option<TuneTable>, theirs: Option<TuneTable>) -> [Result<()>; 2] {
        let f = |t: Option<TuneTable>| t.map(|t| t.fingerprint());
        compare_kind(&SEND_RECV_TABLE, f(mine), f(theirs))
    }

    /// Two ranks in this process compare their settings; returns each rank's outcome.
    fn compare_configs(mine: Config, theirs: Config) -> [Result<()>; 2] {
        let info0 = RankInfo::new(0, 2).with_master("127.0.0.1", 0);
        let s0 = Store::connect(&info0, T).expect("rank 0 store");
        let info1 = RankInfo::new(1, 2).with_master("127.0.0.1", s0.master_port());
        let rank1 = std::thread::spawn(move || {
            let s1 = Store::connect(&info1, T).expect("rank 1 store");
            agree_on_config(&s1, 1, &theirs)
        });
        let r0 = agree_on_config(&s0, 0, &mine);
        [r0, rank1.join().expect("rank 1 thread")]
    }

    #[test]
    #[allow(clippy::field_reassign_with_default)] // one setting changed on purpose
    fn settings_that_must_agree_are_compared_across_ranks() {
        for r in compare_configs(Config::default(), Config::default()) {
            r.unwrap();
        }
        // A local setting may differ.
        let mut local = Config::default();
        local.device_timeout = Duration::from_secs(3);
        for r in compare_configs(Config::default(), local) {
            r.unwrap();
        }
        let mut other = Config::default();
        other.p2p_ll128 = false;
        for r in compare_configs(Config::default(), other) {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("DEVCOMM_P2P_LL128")
                    && e.contains("\"1\" on rank(s) [0]")
                    && e.contains("\"0\" on rank(s) [1]"),
                "{e}"
            );
        }
    }

    #[test]
    fn every_rank_must_load_the_same_tuning_table() {
        for r in compare(Some(table(32)), Some(table(32))) {
            r.unwrap();
        }
        for r in compare(None, None) {
            r.unwrap();
        }
        for r in compare(Some(table(32)), Some(table(16))) {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("rank(s) 1") && e.contains("another tuning table"),
                "{e}"
            );
        }
        for r in compare(Some(table(32)), None) {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("no tuning table") && e.contains(TUNE_FILE_ENV),
                "{e}"
            );
        }
    }

    #[test]
    fn every_rank_must_load_the_same_reduction_table() {
        let t = crate::reduce::tune::tests::table();
        let mut other = t.clone();
        other.entries[0].blocks = 16;
        let f = |t: &crate::reduce::ReduceTuneTable| Some(t.fingerprint());
        for r in compare_kind(&REDUCTION_TABLE, f(&t), f(&t)) {
            r.unwrap();
        }
        for r in compare_kind(&REDUCTION_TABLE, f(&t), f(&other)) {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("rank(s) 1") && e.contains("another reduction tuning table"),
                "{e}"
            );
        }
        for r in compare_kind(&REDUCTION_TABLE, None, f(&t)) {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("another reduction tuning table than rank 0")
                    && e.contains("DEVCOMM_REDUCE_TUNE_FILE"),
                "{e}"
            );
        }
        // The window a tuning run asks for, likewise.
        let w = t.window;
        let wider = crate::reduce::TunedWindow {
            one_shot_bytes: 2 << 20,
            ..w
        };
        assert_ne!(w.fingerprint(), wider.fingerprint());
        for r in compare_kind(
            &REDUCTION_WINDOW,
            Some(w.fingerprint()),
            Some(w.fingerprint()),
        ) {
            r.unwrap();
        }
        for r in compare_kind(
            &REDUCTION_WINDOW,
            Some(w.fingerprint()),
            Some(wider.fingerprint()),
        ) {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("another reduction window") && e.contains("reduce_window"),
                "{e}"
            );
        }
    }
}
