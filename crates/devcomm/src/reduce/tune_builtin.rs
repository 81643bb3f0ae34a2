//! The reduction tuning tables built into the library (docs/TUNING.md, "Built-in tables"):
//! measured tables committed under `crates/devcomm/tuning/` (its README says how to add one),
//! one per GPU model and world size. A communicator takes the one of its GPU model and world
//! size when no table file is set; with none listed, nothing changes.

use super::tune::ReduceTuneTable;
use crate::error::{Error, Result};

/// Every built-in table: its file name under `crates/devcomm/tuning/` and its text, one line
/// each: `("nvidia-h200-x4.json", include_str!("../../tuning/nvidia-h200-x4.json")),`.
pub(crate) const BUILTIN: &[(&str, &str)] = &[];

/// The table of `tables` (file name, text) measured on GPU model `device` with `world` ranks,
/// if there is one. A table that does not parse is an error naming its file (the unit tests
/// keep the built-in ones valid).
pub(crate) fn builtin_for(
    tables: &[(&str, &str)],
    device: &str,
    world: usize,
) -> Result<Option<ReduceTuneTable>> {
    for (name, text) in tables {
        let table = ReduceTuneTable::from_json(text).map_err(|e| Error::InvalidArgument {
            op: "reduction tuning table",
            reason: format!("the built-in table {name}: {e}"),
        })?;
        if table.device == device && table.world_size == world {
            return Ok(Some(table));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::tune::tests::table;

    /// The file name of the built-in table of GPU model `device` on `world` ranks: the model in
    /// lower case, every run of other characters than letters and digits a dash, then `-x` and
    /// the world size (`NVIDIA H200` on 4 ranks: `nvidia-h200-x4.json`).
    fn file_name(device: &str, world: usize) -> String {
        let mut slug = String::new();
        for c in device.chars() {
            if c.is_ascii_alphanumeric() {
                slug.push(c.to_ascii_lowercase());
            } else if !slug.is_empty() && !slug.ends_with('-') {
                slug.push('-');
            }
        }
        format!("{}-x{world}.json", slug.trim_end_matches('-'))
    }

    fn json(device: &str, world: usize) -> String {
        let mut t = table();
        t.device = device.into();
        t.world_size = world;
        t.to_json()
    }

    #[test]
    fn a_table_is_taken_only_on_its_gpu_model_and_world_size() {
        let h200_4 = json("NVIDIA H200", 4);
        let h200_8 = json("NVIDIA H200", 8);
        let h100_4 = json("NVIDIA H100 80GB HBM3", 4);
        let tables = [
            ("nvidia-h200-x4.json", h200_4.as_str()),
            ("nvidia-h200-x8.json", h200_8.as_str()),
            ("nvidia-h100-80gb-hbm3-x4.json", h100_4.as_str()),
        ];
        let pick = |device, world| {
            builtin_for(&tables, device, world)
                .unwrap()
                .map(|t| (t.device, t.world_size))
        };
        assert_eq!(pick("NVIDIA H200", 4), Some(("NVIDIA H200".into(), 4)));
        assert_eq!(pick("NVIDIA H200", 8), Some(("NVIDIA H200".into(), 8)));
        assert_eq!(
            pick("NVIDIA H100 80GB HBM3", 4),
            Some(("NVIDIA H100 80GB HBM3".into(), 4))
        );
        assert_eq!(pick("NVIDIA H200", 2), None);
        assert_eq!(pick("NVIDIA H100 80GB HBM3", 8), None);
        assert_eq!(pick("NVIDIA H200 NVL", 4), None);
        assert_eq!(pick("NVIDIA B200", 4), None);
        // No table at all: nothing, whatever the GPU.
        assert_eq!(builtin_for(&[], "NVIDIA H200", 4).unwrap(), None);
        // A table that does not parse names its file.
        let e = builtin_for(&[("broken.json", "{")], "NVIDIA H200", 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("broken.json"), "{e}");
    }

    #[test]
    fn file_names_follow_the_model_and_world_size() {
        assert_eq!(file_name("NVIDIA H200", 4), "nvidia-h200-x4.json");
        assert_eq!(
            file_name("NVIDIA H100 80GB HBM3", 8),
            "nvidia-h100-80gb-hbm3-x8.json"
        );
        assert_eq!(
            file_name(" NVIDIA  H200 (NVL) ", 2),
            "nvidia-h200-nvl-x2.json"
        );
    }

    /// Every file under `crates/devcomm/tuning/` is listed and every listed one is there, its
    /// name is its model's and world size's, and it is a valid table (checked when read).
    #[test]
    fn the_built_in_tables_are_the_committed_files() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json"))
            .collect();
        files.sort();
        let mut listed: Vec<String> = BUILTIN.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(
            listed, files,
            "BUILTIN must list exactly the tables in {dir:?}"
        );
        for (name, text) in BUILTIN {
            let t = ReduceTuneTable::from_json(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(*name, file_name(&t.device, t.world_size));
            let on_disk = std::fs::read_to_string(dir.join(name)).unwrap();
            assert_eq!(*text, on_disk, "{name}");
        }
    }
}
