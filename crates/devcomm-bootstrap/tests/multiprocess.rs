//! Multi-process tests of the store, fd passing and the launcher.
//!
//! Child processes are this test binary re-executed with `DEVCOMM_TEST_ROLE` set: the
//! `child_entry` test then runs the role (reading its rank from the environment like a real
//! rank) and exits with 0 on success. In most tests the test process itself is rank 0 (its
//! store listens on an ephemeral port, which the children are given), so tests running in
//! parallel never fight over ports.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use devcomm_bootstrap::launcher::{launch, launch_captured, LaunchOptions};
use devcomm_bootstrap::{Error, RankInfo, Store};

const ROLE: &str = "DEVCOMM_TEST_ROLE";
const T: Duration = Duration::from_secs(10);

type R = Result<(), String>;

fn check(cond: bool, what: impl Into<String>) -> R {
    if cond {
        Ok(())
    } else {
        Err(what.into())
    }
}

/// Dispatcher for child processes; a no-op in the normal test run (no role set).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let result = RankInfo::from_env()
        .map_err(|e| format!("from_env: {e}"))
        .and_then(|info| run_role(&role, info));
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("child role {role} failed: {e}");
            std::process::exit(1);
        }
    }
}

fn run_role(role: &str, info: RankInfo) -> R {
    match role {
        "store_ops" => {
            let s = Store::connect(&info, T).map_err(|e| e.to_string())?;
            store_ops(&s)
        }
        "timeouts" => {
            let s = Store::connect(&info, T).map_err(|e| e.to_string())?;
            timeouts(&s)
        }
        "bad_token" => bad_token_child(info),
        "fds" => {
            let s = Store::connect(&info, T).map_err(|e| e.to_string())?;
            fds(&s)
        }
        "vanishing_server" => {
            let s = Store::connect(&info, T).map_err(|e| e.to_string())?;
            // Started with port 0: tell the parent which port the server got.
            println!("PORT {}", s.master_port());
            std::io::stdout().flush().map_err(|e| e.to_string())?;
            s.barrier("up", T).map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_millis(200));
            // Exit without dropping the store: the server disappears under rank 1.
            std::process::exit(0);
        }
        other => Err(format!("unknown role {other}")),
    }
}

fn spawn_rank(role: &str, rank: usize, world: usize, port: u16, token: Option<&str>) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        "child_entry",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .env(ROLE, role)
    .env("RANK", rank.to_string())
    .env("WORLD_SIZE", world.to_string())
    .env("LOCAL_RANK", rank.to_string())
    .env("LOCAL_WORLD_SIZE", world.to_string())
    .env("MASTER_ADDR", "127.0.0.1")
    .env("MASTER_PORT", port.to_string())
    .env_remove("DEVCOMM_JOB_TOKEN")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("DEVCOMM_JOB_TOKEN", t);
    }
    cmd.spawn().expect("spawn child rank")
}

/// Waits for every child (killing them after `limit`) and asserts that all succeeded.
fn finish(children: Vec<Child>, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut failures = Vec::new();
    for mut c in children {
        let status = loop {
            if let Some(s) = c.try_wait().expect("try_wait") {
                break Some(s);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut out = String::new();
        if let Some(mut o) = c.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = c.stderr.take() {
            let _ = e.read_to_string(&mut out);
        }
        match status {
            Some(s) if s.success() => {}
            Some(s) => failures.push(format!("child {s}: {out}")),
            None => failures.push(format!("child killed after {limit:?}: {out}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Rank 0 in this process on an ephemeral port.
fn rank0(world: usize, token: Option<&str>) -> Store {
    let info = RankInfo::new(0, world)
        .with_master("127.0.0.1", 0)
        .with_token(token.map(str::to_string));
    Store::connect(&info, T).expect("rank 0 connect")
}

// ---- roles ----

fn store_ops(s: &Store) -> R {
    let (r, n) = (s.rank(), s.world_size());
    let e = |e: Error| e.to_string();
    s.set(&format!("k/{r}"), &vec![r as u8; r + 1]).map_err(e)?;
    let c = s.add("counter", 1).map_err(e)?;
    check((1..=n as i64).contains(&c), format!("counter {c}"))?;
    let keys: Vec<String> = (0..n).map(|q| format!("k/{q}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    s.wait(&refs, T).map_err(e)?;
    for q in 0..n {
        let v = s.get(&format!("k/{q}"), T).map_err(e)?;
        check(v == vec![q as u8; q + 1], format!("k/{q} = {v:?}"))?;
    }
    s.barrier("after-add", T).map_err(e)?;
    let total = s.add("counter", 0).map_err(e)?;
    check(total == n as i64, format!("counter after barrier {total}"))?;
    check(
        s.get("counter", T).map_err(e)? == n.to_string().into_bytes(),
        "counter is stored as decimal text",
    )?;
    let mine = format!("rank{r}").repeat(r + 1);
    let all = s.all_gather("ag", mine.as_bytes(), T).map_err(e)?;
    let want: Vec<Vec<u8>> = (0..n)
        .map(|q| format!("rank{q}").repeat(q + 1).into_bytes())
        .collect();
    check(all == want, format!("all_gather gave {all:?}"))?;
    // A second all-gather with another tag is independent.
    let all = s.all_gather("ag2", &[r as u8], T).map_err(e)?;
    check(
        all == (0..n).map(|q| vec![q as u8]).collect::<Vec<_>>(),
        "ag2",
    )?;
    s.barrier("end", T).map_err(e)
}

fn timeouts(s: &Store) -> R {
    let short = Duration::from_millis(400);
    let t0 = Instant::now();
    match s.barrier("b", short) {
        Err(Error::Timeout {
            op: "barrier",
            missing,
            ..
        }) => check(
            missing == "ranks 2, 3",
            format!("barrier missing: {missing}"),
        )?,
        other => return Err(format!("barrier: expected a timeout, got {other:?}")),
    }
    check(
        t0.elapsed() < Duration::from_secs(3),
        "barrier timeout took too long",
    )?;
    match s.all_gather("g", b"x", short) {
        Err(Error::Timeout {
            op: "all_gather",
            missing,
            key,
            ..
        }) => check(
            missing == "ranks 2, 3" && key == "g",
            format!("all_gather missing: {missing} key {key}"),
        )?,
        other => return Err(format!("all_gather: expected a timeout, got {other:?}")),
    }
    match s.get("nobody-sets-this", short) {
        Err(Error::Timeout {
            op: "get", missing, ..
        }) => check(
            missing.contains("nobody-sets-this"),
            format!("get missing: {missing}"),
        )?,
        other => return Err(format!("get: expected a timeout, got {other:?}")),
    }
    match s.wait(&["a-key", "counter-x"], short) {
        Err(Error::Timeout {
            op: "wait",
            missing,
            ..
        }) => check(
            missing == "keys a-key, counter-x",
            format!("wait missing: {missing}"),
        )?,
        other => return Err(format!("wait: expected a timeout, got {other:?}")),
    }
    // The store still works after timeouts.
    s.set("after", b"ok").map_err(|e| e.to_string())?;
    check(
        s.get("after", short).map_err(|e| e.to_string())? == b"ok",
        "store unusable after a timeout",
    )
}

fn bad_token_child(info: RankInfo) -> R {
    match Store::connect(&info, T) {
        Err(Error::BadToken(msg)) => check(msg.contains("rank 1"), format!("message: {msg}"))?,
        other => return Err(format!("wrong token: expected BadToken, got {other:?}")),
    }
    match Store::connect(&info.clone().with_token(None), T) {
        Err(Error::BadToken(_)) => {}
        other => return Err(format!("no token: expected BadToken, got {other:?}")),
    }
    let s = Store::connect(&info.with_token(Some("right-token".into())), T)
        .map_err(|e| format!("right token: {e}"))?;
    s.barrier("joined", T).map_err(|e| e.to_string())
}

fn memfd_with(text: &str) -> File {
    let fd = nix::sys::memfd::memfd_create(
        c"devcomm-test",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .expect("memfd_create");
    let mut f = File::from(fd);
    f.write_all(text.as_bytes()).expect("write memfd");
    f
}

fn read_back(fd: std::os::fd::OwnedFd) -> String {
    let f = File::from(fd);
    let mut buf = vec![0u8; 64];
    let n = f.read_at(&mut buf, 0).expect("read_at");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn fds(s: &Store) -> R {
    let r = s.rank();
    let e = |e: Error| e.to_string();
    s.barrier("ready", T).map_err(e)?;
    if r < 2 {
        // Rank 2 goes straight to the 3-way exchange, so its messages usually arrive while
        // ranks 0 and 1 are still in their pairwise one: they must be stashed, not lost.
        std::thread::sleep(Duration::from_millis(200));
        let pair = memfd_with(&format!("pair {r}"));
        let got = s.exchange_fds("p01", pair.as_fd(), &[0, 1], T).map_err(e)?;
        let other = 1 - r;
        check(got.len() == 1 && got[0].0 == other, "p01 result ranks")?;
        let text = read_back(got.into_iter().next().map(|(_, f)| f).ok_or("empty")?);
        check(text == format!("pair {other}"), format!("p01 read {text}"))?;
    }
    let mine = memfd_with(&format!("fd from rank {r}"));
    let got = s
        .exchange_fds("p012", mine.as_fd(), &[2, 1, 0], T)
        .map_err(e)?;
    let ranks: Vec<usize> = got.iter().map(|(q, _)| *q).collect();
    let want: Vec<usize> = (0..3).filter(|&q| q != r).collect();
    check(ranks == want, format!("p012 ranks {ranks:?}"))?;
    for (q, fd) in got {
        let text = read_back(fd);
        check(
            text == format!("fd from rank {q}"),
            format!("from {q}: {text}"),
        )?;
    }
    s.barrier("end", T).map_err(e)
}

// ---- tests ----

#[test]
fn store_set_get_add_wait_all_gather_barrier_across_4_processes() {
    let s = rank0(4, Some("tok"));
    let kids: Vec<Child> = (1..4)
        .map(|r| spawn_rank("store_ops", r, 4, s.master_port(), Some("tok")))
        .collect();
    let mine = store_ops(&s);
    finish(kids, Duration::from_secs(20));
    mine.expect("rank 0");
}

#[test]
fn timeouts_name_the_missing_ranks() {
    // World of 4, only ranks 0 and 1 ever join.
    let s = rank0(4, None);
    let kid = spawn_rank("timeouts", 1, 4, s.master_port(), None);
    let mine = timeouts(&s);
    finish(vec![kid], Duration::from_secs(20));
    mine.expect("rank 0");
}

#[test]
fn wrong_job_token_is_rejected() {
    let s = rank0(2, Some("right-token"));
    let kid = spawn_rank("bad_token", 1, 2, s.master_port(), Some("wrong-token"));
    let joined = s.barrier("joined", T);
    finish(vec![kid], Duration::from_secs(20));
    joined.expect("rank 0 barrier with the rank that has the right token");
}

#[test]
fn exchange_fds_passes_usable_fds_between_3_processes() {
    let s = rank0(3, Some("fdjob"));
    let kids: Vec<Child> = (1..3)
        .map(|r| spawn_rank("fds", r, 3, s.master_port(), Some("fdjob")))
        .collect();
    let mine = fds(&s);
    finish(kids, Duration::from_secs(20));
    mine.expect("rank 0");
}

#[test]
fn client_errors_when_the_server_process_disappears() {
    // The child is rank 0 on an ephemeral port, which it prints.
    let mut kid = spawn_rank("vanishing_server", 0, 2, 0, None);
    let stdout = kid.stdout.take().expect("child stdout");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let port: u16 = loop {
        let line = lines.next().expect("child printed its port").expect("read");
        if let Some(p) = line.strip_prefix("PORT ") {
            break p.trim().parse().expect("port number");
        }
    };
    let info = RankInfo::new(1, 2).with_master("127.0.0.1", port);
    let s = Store::connect(&info, T).expect("rank 1 connect");
    s.barrier("up", T).expect("barrier up");
    let t0 = Instant::now();
    let r = s.get("never", Duration::from_secs(30));
    assert!(
        matches!(r, Err(Error::Io { .. })),
        "expected an I/O error, got {r:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    // Later requests fail fast too.
    assert!(s.set("x", b"y").is_err());
    finish(vec![kid], Duration::from_secs(10));
}

#[test]
fn connect_times_out_naming_the_server() {
    // Port 1 (privileged, unused): connections are refused. A "free" port from bind(0)
    // could be taken meanwhile by another test's rank 0.
    let port = 1;
    let info = RankInfo::new(1, 2).with_master("127.0.0.1", port);
    let t0 = Instant::now();
    match Store::connect(&info, Duration::from_millis(300)) {
        Err(Error::Timeout {
            op: "connect",
            missing,
            rank: 1,
            ..
        }) => assert!(missing.contains(&port.to_string()), "{missing}"),
        other => panic!("expected a connect timeout, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn exchange_fds_rejects_a_sender_with_the_wrong_pid() {
    // Two ranks in this process; rank 1's published pid is overwritten with a wrong one.
    let s0 = rank0(2, Some("credjob"));
    let info1 = RankInfo::new(1, 2)
        .with_master("127.0.0.1", s0.master_port())
        .with_token(Some("credjob".into()));
    let s1 = Store::connect(&info1, T).expect("rank 1");
    s0.set("__devcomm/pid/1", b"1").expect("overwrite pid");
    let f1 = memfd_with("one");
    let t1 = std::thread::spawn(move || {
        let r = s1.exchange_fds("x", f1.as_fd(), &[0, 1], Duration::from_millis(800));
        (r.map(|v| v.len()), s1)
    });
    let f0 = memfd_with("zero");
    let r0 = s0.exchange_fds("x", f0.as_fd(), &[0, 1], Duration::from_millis(800));
    match r0 {
        Err(Error::Protocol(msg)) => assert!(msg.contains("pid"), "{msg}"),
        other => panic!("expected a credential error, got {other:?}"),
    }
    let (r1, _s1) = t1.join().expect("rank 1 thread");
    match r1 {
        Err(Error::Timeout {
            op: "exchange_fds",
            missing,
            ..
        }) => assert_eq!(missing, "ranks 0"),
        other => panic!("rank 1: expected a timeout naming rank 0, got {other:?}"),
    }
}

#[test]
fn exchange_fds_in_one_process_and_bad_peers() {
    let s0 = rank0(2, None);
    let info1 = RankInfo::new(1, 2).with_master("127.0.0.1", s0.master_port());
    let s1 = Store::connect(&info1, T).expect("rank 1");
    let f0 = memfd_with("zero");
    assert!(matches!(
        s0.exchange_fds("bad", f0.as_fd(), &[0, 5], T),
        Err(Error::Protocol(_))
    ));
    // Only this rank in `peers`: nothing to do.
    assert!(s0
        .exchange_fds("solo", f0.as_fd(), &[0], T)
        .expect("solo")
        .is_empty());
    let t1 = std::thread::spawn(move || {
        let f1 = memfd_with("one");
        let got = s1
            .exchange_fds("y", f1.as_fd(), &[0, 1], T)
            .expect("rank 1");
        (
            got.into_iter()
                .map(|(r, fd)| (r, read_back(fd)))
                .collect::<Vec<_>>(),
            s1,
        )
    });
    let got = s0
        .exchange_fds("y", f0.as_fd(), &[1, 0], T)
        .expect("rank 0");
    let got: Vec<(usize, String)> = got.into_iter().map(|(r, fd)| (r, read_back(fd))).collect();
    assert_eq!(got, [(1, "one".to_string())]);
    let (got1, _s1) = t1.join().expect("thread");
    assert_eq!(got1, [(0, "zero".to_string())]);
}

#[test]
fn store_is_send_and_sync_and_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
    let s = std::sync::Arc::new(rank0(1, None));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let s = std::sync::Arc::clone(&s);
            std::thread::spawn(move || {
                for _ in 0..25 {
                    s.add("shared", 1).expect("add");
                }
                s.set(&format!("t{i}"), b"done").expect("set");
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    assert_eq!(s.add("shared", 0).expect("add"), 100);
    s.wait(&["t0", "t1", "t2", "t3"], T).expect("wait");
    s.barrier("solo", T).expect("barrier of one");
    assert_eq!(
        s.all_gather("g", b"me", T).expect("gather"),
        vec![b"me".to_vec()]
    );
    // `add` on a non-integer is an error, and the store stays usable.
    s.set("text", b"abc").expect("set");
    assert!(matches!(s.add("text", 1), Err(Error::Protocol(_))));
    assert_eq!(s.get("t0", T).expect("get"), b"done");
}

// ---- launcher ----

fn sh(nprocs: usize, script: &str, grace_ms: u64) -> LaunchOptions {
    let mut o = LaunchOptions::new(nprocs, vec!["sh".into(), "-c".into(), script.into()]);
    o.kill_grace = Duration::from_millis(grace_ms);
    o
}

fn sorted_lines(b: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(b)
        .lines()
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[test]
fn launcher_three_ranks_succeed_with_prefixed_output() {
    let script = r#"echo "hello $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE"
echo "second line"
[ -n "$DEVCOMM_JOB_TOKEN" ] && [ -n "$MASTER_PORT" ] && echo "env ok $MASTER_ADDR"
echo "to stderr $RANK" >&2"#;
    let out = launch_captured(sh(3, script, 500)).expect("launch");
    assert_eq!(
        out.code,
        0,
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut want = Vec::new();
    for r in 0..3 {
        want.push(format!("[rank {r}] hello {r}/3 local {r}/3"));
        want.push(format!("[rank {r}] second line"));
        want.push(format!("[rank {r}] env ok 127.0.0.1"));
    }
    want.sort();
    assert_eq!(sorted_lines(&out.stdout), want);
    assert_eq!(
        sorted_lines(&out.stderr),
        [
            "[rank 0] to stderr 0",
            "[rank 1] to stderr 1",
            "[rank 2] to stderr 2"
        ]
    );
    // The public entry point writes to our stdout/stderr and returns the code.
    assert_eq!(launch(sh(2, "true", 500)).expect("launch"), 0);
}

#[test]
fn launcher_stops_the_other_ranks_when_one_fails() {
    // The sleeping ranks are shells with a child `sleep`: the whole process group must go.
    let script =
        r#"if [ "$RANK" = 1 ]; then echo failing; sleep 0.2; exit 3; fi; sleep 30; echo survived"#;
    let t0 = Instant::now();
    let out = launch_captured(sh(3, script, 1000)).expect("launch");
    let took = t0.elapsed();
    assert_eq!(out.code, 3);
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 exited with code 3"), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("[rank 1] failing"), "{stdout}");
    assert!(!stdout.contains("survived"), "{stdout}");
}

#[test]
fn launcher_kills_ranks_that_ignore_sigterm_after_the_grace() {
    // Rank 0 fails only after rank 1 has had time to install its trap (otherwise SIGTERM
    // could arrive first and the grace would never be needed).
    let script = r#"trap '' TERM; if [ "$RANK" = 0 ]; then sleep 0.3; exit 5; fi; sleep 30"#;
    let t0 = Instant::now();
    let out = launch_captured(sh(2, script, 300)).expect("launch");
    let took = t0.elapsed();
    assert_eq!(out.code, 5);
    assert!(took >= Duration::from_millis(600), "took {took:?}");
    assert!(took < Duration::from_millis(2500), "took {took:?}");
}

#[test]
fn launcher_reports_a_rank_killed_by_a_signal() {
    let script = r#"if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 30"#;
    let out = launch_captured(sh(2, script, 300)).expect("launch");
    assert_eq!(out.code, 128 + 9);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 was killed by SIGKILL"), "{err}");
}

#[test]
fn launcher_runs_a_real_store_job() {
    // 4 ranks of this binary, reading everything (port, token) from the launcher's variables.
    let exe = std::env::current_exe().expect("current_exe");
    let mut o = LaunchOptions::new(
        4,
        vec![
            exe.to_string_lossy().into_owned(),
            "--exact".into(),
            "child_entry".into(),
            "--nocapture".into(),
            "--test-threads=1".into(),
            "-q".into(),
        ],
    );
    o.env.push((ROLE.into(), "store_ops".into()));
    o.kill_grace = Duration::from_millis(500);
    let out = launch_captured(o).expect("launch");
    assert_eq!(
        out.code,
        0,
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
