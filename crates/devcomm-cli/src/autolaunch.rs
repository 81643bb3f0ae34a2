//! Commands that need one process per GPU launch themselves when started without the
//! launcher's variables: `devcomm bench` alone runs on every local GPU.

use std::time::Duration;

/// Variable a command reads to override how many ranks an automatic launch starts.
pub const NPROCS_ENV: &str = "DEVCOMM_NPROCS";

/// Runs `body` if this process is a rank; otherwise re-executes the same command line under the
/// launcher on every visible GPU (or `DEVCOMM_NPROCS` of them).
pub fn or_run(what: &str, body: impl FnOnce() -> Result<i32, String>) -> Result<i32, String> {
    if std::env::var_os("RANK").is_some() {
        return body();
    }
    let nprocs = match std::env::var(NPROCS_ENV) {
        Ok(n) => n
            .parse::<usize>()
            .map_err(|_| format!("{NPROCS_ENV}={n:?} is not a number"))?,
        Err(_) => devcomm::ensure_driver()
            .map_err(|e| e.to_string())
            .and_then(|()| cudarc::driver::CudaContext::device_count().map_err(|e| e.to_string()))
            .map_err(|e| format!("cannot count GPUs for `devcomm {what}`: {e}"))?
            as usize,
    };
    if nprocs == 0 {
        return Err(format!(
            "`devcomm {what}` needs at least one GPU; none is visible"
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let mut command = vec![exe.to_string_lossy().into_owned()];
    command.extend(std::env::args().skip(1));
    eprintln!("devcomm {what}: launching {nprocs} ranks");
    devcomm_bootstrap::launcher::launch(devcomm_bootstrap::launcher::LaunchOptions {
        nprocs,
        master_addr: "127.0.0.1".into(),
        master_port: None,
        command,
        env: Vec::new(),
        kill_grace: Duration::from_secs(5),
    })
    .map_err(|e| e.to_string())
}
