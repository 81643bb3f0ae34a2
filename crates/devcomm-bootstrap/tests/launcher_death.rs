//! The launcher takes its ranks with it: when it is SIGKILLed, and when one rank fails while
//! another has already exited leaving a background child behind.

mod common;

use std::time::{Duration, Instant};

use common::{alive, spawn_role, ROLE};
use devcomm_bootstrap::launcher::{launch, launch_captured, LaunchOptions};

/// Dispatcher for child processes; a no-op in the normal test run (no role set).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let code = match role.as_str() {
        // A launcher of 2 ranks that each write their pid to $PIDS and become `sleep 1000`.
        "launcher" => {
            let script = r#"echo $$ >> "$PIDS"; exec sleep 1000"#;
            let o = LaunchOptions::new(2, vec!["sh".into(), "-c".into(), script.into()]);
            launch(o).unwrap_or(99)
        }
        other => {
            eprintln!("unknown role {other}");
            1
        }
    };
    std::process::exit(code);
}

fn pids_in(path: &std::path::Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Polls until no pid of `pids` is alive or `limit` passes; returns the ones still alive.
fn survivors(pids: &[i32], limit: Duration) -> Vec<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_all(pids: &[i32]) {
    for &p in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn temp_path(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("devcomm-{what}-{}", std::process::id()))
}

#[test]
fn ranks_die_when_the_launcher_is_sigkilled() {
    let path = temp_path("launcher-pids");
    let _ = std::fs::remove_file(&path);
    let mut launcher = spawn_role("launcher", &[("PIDS", path.display().to_string())]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let pids = loop {
        let pids = pids_in(&path);
        if pids.len() == 2 || Instant::now() > deadline {
            break pids;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(pids.len(), 2, "the ranks did not start: {pids:?}");
    assert!(pids.iter().all(|&p| alive(p)), "{pids:?}");
    launcher.kill().expect("SIGKILL the launcher");
    launcher.wait().expect("reap the launcher");
    let left = survivors(&pids, Duration::from_secs(2));
    kill_all(&left);
    let _ = std::fs::remove_file(&path);
    assert!(
        left.is_empty(),
        "ranks {left:?} outlived the launcher by 2 s"
    );
}

#[test]
fn a_failure_stops_the_background_children_of_ranks_that_already_exited() {
    let path = temp_path("bg-pid");
    let _ = std::fs::remove_file(&path);
    // Rank 0 leaves a background `sleep` in its process group and exits with 0; rank 1 fails
    // afterwards.
    let script = format!(
        r#"if [ "$RANK" = 0 ]; then sleep 1000 >/dev/null 2>&1 & echo $! > {0}; exit 0; fi
while [ ! -s {0} ]; do sleep 0.05; done; sleep 0.2; exit 4"#,
        path.display()
    );
    let mut o = LaunchOptions::new(2, vec!["sh".into(), "-c".into(), script]);
    o.kill_grace = Duration::from_millis(500);
    let out = launch_captured(o).expect("launch");
    assert_eq!(out.code, 4, "{}", String::from_utf8_lossy(&out.stderr));
    let bg = pids_in(&path);
    assert_eq!(bg.len(), 1, "no background pid written");
    let left = survivors(&bg, Duration::from_secs(2));
    kill_all(&left);
    let _ = std::fs::remove_file(&path);
    assert!(
        left.is_empty(),
        "background child {left:?} survived the failure"
    );
}
