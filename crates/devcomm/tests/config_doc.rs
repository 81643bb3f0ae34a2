//! docs/CONFIG.md is generated from the settings table (`devcomm::Config::markdown`): this
//! test fails when the two differ. `DEVCOMM_UPDATE_DOCS=1 cargo test -p devcomm --test
//! config_doc` rewrites the file.

use std::path::PathBuf;

const HEADER: &str = "# Configuration\n\n\
Every setting of devcomm, generated from `crates/devcomm/src/config/mod.rs` (do not edit by hand:\n\
`DEVCOMM_UPDATE_DOCS=1 cargo test -p devcomm --test config_doc` rewrites this file).\n\n\
Each setting is read once, from its environment variable, by `Config::from_env()` (which\n\
`Comm::from_env()` calls), or set in code on a `devcomm::Config` handed to\n\
`CommBuilder::config`. A bad value is an error naming the variable. Settings whose last column\n\
says *yes* must be the same on every rank: the ranks compare them when the communicator is\n\
built and refuse to start, naming the setting and the ranks, when they differ. Booleans are\n\
`1`/`0` (also `true`/`false`, `on`/`off`, `yes`/`no`). Settings marked *Experimental* change\n\
kernel constants or switch between measured alternatives; they exist for benchmarks.\n\n\
The process-group variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,\n\
`MASTER_ADDR`, `MASTER_PORT`, `DEVCOMM_JOB_TOKEN`) are read by `devcomm_bootstrap`\n\
(docs/ARCHITECTURE.md); `DEVCOMM_NPROCS` by the CLI; `DEVCOMM_STORE_HOST` by the Python\n\
package under torchrun (docs/PYTHON.md, \"Starting ranks\").\n\n";

#[test]
fn config_md_matches_the_settings_table() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/CONFIG.md");
    let want = format!("{HEADER}{}", devcomm::Config::markdown());
    if std::env::var_os("DEVCOMM_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).expect("writing docs/CONFIG.md");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/CONFIG.md differs from the settings table; run \
         `DEVCOMM_UPDATE_DOCS=1 cargo test -p devcomm --test config_doc` and commit it"
    );
}
