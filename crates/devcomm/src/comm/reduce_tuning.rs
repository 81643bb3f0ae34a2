//! The reduction tuning a communicator is built with (docs/TUNING.md, "Reductions"): the
//! table given to the builder, else the one `DEVCOMM_REDUCE_TUNE_FILE` names, else the table
//! built into the library for the GPU model and world size (unless
//! `DEVCOMM_REDUCE_TUNE_BUILTIN=0`); checked against this communicator, with the wider window
//! a tuning run asks for. The ranks then compare the table's fingerprint (`setup.rs`).

use crate::config::Config;
use crate::error::{Error, Result};
use crate::reduce::launch::ReduceTuning;
use crate::reduce::tune::{ReduceTuneTable, TunedWindow};
use crate::reduce::tune_builtin::builtin_for;

/// Where a communicator's reduction tuning comes from (the builder's part of it).
#[derive(Debug, Clone, Default)]
pub(super) struct TuningAsked {
    /// A table given in code (`Some(None)`: none, whatever the settings).
    pub table: Option<Option<ReduceTuneTable>>,
    /// Sizes the window must hold (a tuning run's).
    pub window: Option<TunedWindow>,
}

fn invalid(reason: String) -> Error {
    Error::InvalidArgument {
        op: "reduction tuning table",
        reason,
    }
}

/// The reduction tuning of a communicator of `world` ranks on GPU model `device` under
/// `config`, the built-in tables being `builtin` (file name, text). A table given in code or
/// named by the setting that does not fit is an error naming it; a built-in one measured with
/// other staged rounds than `DEVCOMM_REDUCE_CHUNK_MIB` gives them is left out (logged), the
/// defaults serving instead.
pub(super) fn reduce_tuning(
    asked: &TuningAsked,
    config: &Config,
    builtin: &[(&str, &str)],
    device: &str,
    world: usize,
) -> Result<ReduceTuning> {
    let chunk = crate::reduce::chunk_bytes(config, world);
    let named = |what: &str, e: Error| match e {
        Error::InvalidArgument { reason, .. } => invalid(format!("{what}: {reason}")),
        other => other,
    };
    let table = match (&asked.table, &config.reduce_tune_file) {
        (Some(given), _) => match given {
            Some(t) => {
                let what = "the table given to CommBuilder::reduce_tune_table";
                t.check().map_err(|e| named(what, e))?;
                t.validate(device, world, chunk)
                    .map_err(|e| named(what, e))?;
                Some(t.clone())
            }
            None => None,
        },
        (None, Some(path)) => {
            let t = ReduceTuneTable::load(path)?;
            t.validate(device, world, chunk)
                .map_err(|e| named(&format!("DEVCOMM_REDUCE_TUNE_FILE={}", path.display()), e))?;
            Some(t)
        }
        (None, None) if config.reduce_tune_builtin => match builtin_for(builtin, device, world)? {
            Some(t) if t.window.chunk_bytes != chunk => {
                log::info!(
                    "the built-in reduction table of {device} on {world} ranks was measured \
                         with staged rounds of {} MiB, DEVCOMM_REDUCE_CHUNK_MIB gives {}: the \
                         reductions keep their default plans",
                    t.window.chunk_bytes >> 20,
                    chunk >> 20
                );
                None
            }
            found => found,
        },
        (None, None) => None,
    };
    if let Some(w) = &asked.window {
        w.check()?;
        if w.chunk_bytes != chunk {
            return Err(Error::InvalidArgument {
                op: "CommBuilder::reduce_window",
                reason: format!(
                    "staged rounds of {} MiB, the configuration's are {} MiB \
                     (DEVCOMM_REDUCE_CHUNK_MIB)",
                    w.chunk_bytes >> 20,
                    chunk >> 20
                ),
            });
        }
    }
    Ok(ReduceTuning {
        table,
        window: asked.window,
    })
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)] // tests change one setting at a time
mod tests {
    use super::*;
    use crate::reduce::tune::tests::table;

    const H200: &str = "NVIDIA H200";

    fn picked(r: Result<ReduceTuning>) -> Option<(String, usize)> {
        r.unwrap().table.map(|t| (t.device, t.world_size))
    }

    fn file(t: &ReduceTuneTable, name: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!(
            "devcomm-reduce-tune-{}-{name}.json",
            std::process::id()
        ));
        std::fs::write(&path, t.to_json()).unwrap();
        path
    }

    #[test]
    fn the_given_table_then_the_file_then_the_built_in_one() {
        let builtin_text = table().to_json();
        let builtin = [("nvidia-h200-x4.json", builtin_text.as_str())];
        let mut config = Config::default();
        let none = TuningAsked::default();
        // Nothing set: the built-in table of this model and world size, else nothing.
        assert_eq!(
            picked(reduce_tuning(&none, &config, &builtin, H200, 4)),
            Some((H200.into(), 4))
        );
        assert_eq!(
            picked(reduce_tuning(&none, &config, &builtin, H200, 2)),
            None
        );
        assert_eq!(
            picked(reduce_tuning(
                &none,
                &config,
                &builtin,
                "NVIDIA H100 80GB HBM3",
                4
            )),
            None
        );
        assert_eq!(picked(reduce_tuning(&none, &config, &[], H200, 4)), None);
        // DEVCOMM_REDUCE_TUNE_BUILTIN=0 leaves it out.
        config.reduce_tune_builtin = false;
        assert_eq!(
            picked(reduce_tuning(&none, &config, &builtin, H200, 4)),
            None
        );
        config.reduce_tune_builtin = true;
        // Other staged rounds: the built-in table is left out, not an error.
        config.reduce_chunk_mib = Some(8);
        assert_eq!(
            picked(reduce_tuning(&none, &config, &builtin, H200, 4)),
            None
        );
        config.reduce_chunk_mib = None;
        // A file takes precedence; a table given in code over both; `Some(None)`: none.
        let mut other = table();
        other.date = "2026-12-02".into();
        let path = file(&other, "precedence");
        config.reduce_tune_file = Some(path.clone());
        let t = reduce_tuning(&none, &config, &builtin, H200, 4).unwrap();
        assert_eq!(t.table.unwrap().date, "2026-12-02");
        let mut given = table();
        given.date = "2026-12-03".into();
        let asked = TuningAsked {
            table: Some(Some(given)),
            window: None,
        };
        let t = reduce_tuning(&asked, &config, &builtin, H200, 4).unwrap();
        assert_eq!(t.table.unwrap().date, "2026-12-03");
        let off = TuningAsked {
            table: Some(None),
            window: None,
        };
        assert_eq!(
            picked(reduce_tuning(&off, &config, &builtin, H200, 4)),
            None
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_table_that_does_not_fit_is_an_error_naming_it() {
        let mut config = Config::default();
        let none = TuningAsked::default();
        // The file: another GPU, another world size, other rounds, malformed, missing.
        let path = file(&table(), "mismatch");
        config.reduce_tune_file = Some(path.clone());
        for (device, world, chunk_mib, says) in [
            ("NVIDIA H100 80GB HBM3", 4, 32, "this GPU is"),
            (H200, 8, 32, "this communicator has 8"),
            (H200, 4, 16, "DEVCOMM_REDUCE_CHUNK_MIB"),
        ] {
            config.reduce_chunk_mib = Some(chunk_mib);
            let e = reduce_tuning(&none, &config, &[], device, world)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(says) && e.contains(&path.display().to_string()),
                "{e}"
            );
        }
        config.reduce_chunk_mib = None;
        std::fs::write(&path, "{\"version\": 1}").unwrap();
        let e = reduce_tuning(&none, &config, &[], H200, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        std::fs::remove_file(&path).unwrap();
        let e = reduce_tuning(&none, &config, &[], H200, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read"), "{e}");
        // A table given in code.
        config.reduce_tune_file = None;
        let mut bad = table();
        bad.entries[0].blocks = 0;
        let asked = TuningAsked {
            table: Some(Some(bad)),
            window: None,
        };
        let e = reduce_tuning(&asked, &config, &[], H200, 4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("CommBuilder::reduce_tune_table") && e.contains("blocks"),
            "{e}"
        );
        // A built-in table that does not parse (the unit tests keep the real ones valid).
        let e = reduce_tuning(&none, &config, &[("broken.json", "{")], H200, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("broken.json"), "{e}");
    }

    #[test]
    fn a_tuning_run_asks_for_a_wider_window_with_the_same_rounds() {
        let config = Config::default();
        let wide = TunedWindow {
            one_shot_bytes: 1 << 20,
            line_two_shot_bytes: 4 << 20,
            chunk_bytes: 32 << 20,
        };
        let asked = TuningAsked {
            table: Some(None),
            window: Some(wide),
        };
        let t = reduce_tuning(&asked, &config, &[], H200, 4).unwrap();
        assert_eq!((t.window, t.table), (Some(wide), None));
        let other_rounds = TuningAsked {
            window: Some(TunedWindow {
                chunk_bytes: 64 << 20,
                ..wide
            }),
            ..asked.clone()
        };
        let e = reduce_tuning(&other_rounds, &config, &[], H200, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("DEVCOMM_REDUCE_CHUNK_MIB"), "{e}");
        let too_wide = TuningAsked {
            window: Some(TunedWindow {
                one_shot_bytes: 64 << 20,
                ..wide
            }),
            ..asked
        };
        assert!(reduce_tuning(&too_wide, &config, &[], H200, 4).is_err());
    }
}
