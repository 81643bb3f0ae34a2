//! The network transport over UCX with several processes: puts, put-with-signal, data before
//! signal, credits under a full queue and a stuck proxy, a peer that is killed, two ranks in
//! separate network namespaces (separate hosts to the store and to UCX), and the send/recv
//! route's protocol with host threads as the kernel's roles.
//!
//! Ranks are this binary re-executed with `DEVCOMM_NET_ROLE` set (`child_entry` runs the role
//! from `net_roles`), joined through devcomm_bootstrap's store, with `UCX_TLS=tcp`. UCX is
//! found through `DEVCOMM_UCX_LIB` (scripts/install-ucx.sh prints it) or the loader's path.
//! Without UCX the tests print SKIPPED and pass, unless `DEVCOMM_REQUIRE_UCX` is set (CI
//! sets it), which makes them fail.

mod net_roles;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use devcomm_bootstrap::RankInfo;
use net_roles::{run_role, ROLE};

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
            eprintln!("net role {role} failed: {e}");
            std::process::exit(1);
        }
    }
}

/// True when UCX loads; otherwise prints SKIPPED (or fails under `DEVCOMM_REQUIRE_UCX`).
fn ucx_available(test: &str) -> bool {
    let lib = std::env::var(devcomm::testing::net::UCX_LIB_ENV).ok();
    match devcomm::testing::net::probe_library(lib.as_deref()) {
        Ok((path, v)) => {
            eprintln!(
                "{test}: UCX {}.{}.{} from {}",
                v.0,
                v.1,
                v.2,
                path.display()
            );
            true
        }
        Err(e) => {
            assert!(
                std::env::var_os("DEVCOMM_REQUIRE_UCX").is_none(),
                "DEVCOMM_REQUIRE_UCX is set but UCX is unusable: {e}"
            );
            eprintln!("SKIPPED {test}: {e}");
            false
        }
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind(("127.0.0.1", 0)).expect("bind port 0");
    l.local_addr().expect("local addr").port()
}

/// How to start one rank: its role, rank, world, store address and an optional wrapper
/// (`ip netns exec NAME`).
struct Spawn<'a> {
    role: &'a str,
    world: usize,
    addr: &'a str,
    port: u16,
    wrapper: Vec<String>,
    env: Vec<(&'a str, String)>,
}

impl<'a> Spawn<'a> {
    /// `world` ranks of `role` on one host: the store on loopback at a free port.
    fn local(role: &'a str, world: usize) -> Self {
        Spawn {
            role,
            world,
            addr: "127.0.0.1",
            port: free_port(),
            wrapper: Vec::new(),
            env: Vec::new(),
        }
    }

    fn rank(&self, rank: usize) -> Child {
        let exe = std::env::current_exe().expect("current_exe");
        let mut argv: Vec<String> = self.wrapper.clone();
        argv.push(exe.display().to_string());
        argv.extend(
            [
                "--exact",
                "child_entry",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ]
            .map(String::from),
        );
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env(ROLE, self.role)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", self.world.to_string())
            .env("LOCAL_RANK", "0")
            .env("LOCAL_WORLD_SIZE", "1")
            .env("MASTER_ADDR", self.addr)
            .env("MASTER_PORT", self.port.to_string())
            .env_remove("DEVCOMM_JOB_TOKEN")
            .env("UCX_TLS", "tcp")
            .env("UCX_WARN_UNUSED_ENV_VARS", "n")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.spawn().expect("spawn rank")
    }
}

/// Waits for every child (killing all after `limit`), prints their output, and asserts that
/// all succeeded. Returns their stdout.
fn finish(children: Vec<Child>, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut failures = Vec::new();
    let mut outs = Vec::new();
    for (rank, mut c) in children.into_iter().enumerate() {
        let status = loop {
            if let Some(s) = c.try_wait().expect("try_wait") {
                break Some(s);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut o) = c.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = c.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        eprintln!("--- rank {rank} ({status:?})\n{out}{err}");
        if !status.is_some_and(|s| s.success()) {
            failures.push(format!("rank {rank}: {status:?}"));
        }
        outs.push(out);
    }
    assert!(failures.is_empty(), "ranks failed: {failures:?}");
    outs
}

fn exchange(world: usize, rounds: u64) {
    let sp = Spawn {
        env: vec![("DEVCOMM_NET_ROUNDS", rounds.to_string())],
        ..Spawn::local("exchange", world)
    };
    let children = (0..world).map(|r| sp.rank(r)).collect();
    let outs = finish(children, Duration::from_secs(120));
    for (rank, out) in outs.iter().enumerate() {
        let want = format!(
            "rank {rank}: {rounds} rounds with {} peers verified",
            world - 1
        );
        assert!(out.contains(&want), "rank {rank} did not report `{want}`");
    }
}

#[test]
fn net_put_signal_ordering_two_ranks() {
    if ucx_available("net_put_signal_ordering_two_ranks") {
        exchange(2, 24);
    }
}

#[test]
fn net_put_signal_ordering_four_ranks() {
    if ucx_available("net_put_signal_ordering_four_ranks") {
        exchange(4, 6);
    }
}

/// The send/recv route's protocol (staging layout, headers, READY/FREE words, refusal) with
/// host threads as the kernel's roles: a ring both ways, then a refused size mismatch.
fn route(world: usize) {
    let sp = Spawn::local("route", world);
    let outs = finish(
        (0..world).map(|r| sp.rank(r)).collect(),
        Duration::from_secs(120),
    );
    for (rank, out) in outs.iter().enumerate() {
        assert!(
            out.contains(&format!("rank {rank}: route 15 calls verified")),
            "{out}"
        );
    }
    assert!(outs[0].contains("rank 0: refusal seen"), "{}", outs[0]);
    assert!(outs[1].contains("rank 1: mismatch seen"), "{}", outs[1]);
}

#[test]
fn net_route_host_twin_two_ranks() {
    if ucx_available("net_route_host_twin_two_ranks") {
        route(2);
    }
}

#[test]
fn net_route_host_twin_three_ranks() {
    if ucx_available("net_route_host_twin_three_ranks") {
        route(3);
    }
}

#[test]
fn net_credits_and_stuck_proxy() {
    if !ucx_available("net_credits_and_stuck_proxy") {
        return;
    }
    let sp = Spawn::local("credits", 2);
    let outs = finish(vec![sp.rank(0), sp.rank(1)], Duration::from_secs(120));
    assert!(
        outs[0].contains("producer held at 4 descriptors"),
        "{}",
        outs[0]
    );
    assert!(
        outs[0].contains("stuck proxy reported") && outs[0].contains("peer 1"),
        "{}",
        outs[0]
    );
}

#[test]
fn net_peer_killed() {
    if !ucx_available("net_peer_killed") {
        return;
    }
    let sp = Spawn::local("death", 3);
    let survivors = vec![sp.rank(0), sp.rank(1)];
    let mut victim = sp.rank(2);
    // Kill rank 2 (SIGKILL) once it is connected and registered.
    let stdout = victim.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("READY") {
                let _ = tx.send(());
            }
        }
    });
    let ready = rx.recv_timeout(Duration::from_secs(60));
    victim.kill().expect("kill rank 2");
    let _ = victim.wait();
    assert!(ready.is_ok(), "rank 2 never became ready");
    let outs = finish(survivors, Duration::from_secs(120));
    for (rank, out) in outs.iter().enumerate() {
        assert!(
            out.contains(&format!("rank {rank}: peer death reported"))
                && out.contains("network peer 2 failed"),
            "rank {rank}: {out}"
        );
    }
}

#[test]
fn net_setup_fails_alike_on_every_rank() {
    if !ucx_available("net_setup_fails_alike_on_every_rank") {
        return;
    }
    let sp = Spawn::local("setup_failure", 2);
    let outs = finish(vec![sp.rank(0), sp.rank(1)], Duration::from_secs(60));
    for (rank, out) in outs.iter().enumerate() {
        assert!(
            out.contains(&format!("rank {rank}: setup refused")),
            "{out}"
        );
    }
}

#[test]
fn net_descriptor_outside_registration_is_refused() {
    if !ucx_available("net_descriptor_outside_registration_is_refused") {
        return;
    }
    let sp = Spawn::local("bad_descriptor", 2);
    let outs = finish(vec![sp.rank(0), sp.rank(1)], Duration::from_secs(60));
    assert!(
        outs[0].contains("rank 0: refused") && outs[0].contains("peer 1"),
        "{}",
        outs[0]
    );
}

/// Runs `ip` with `args`; panics with its output on failure.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two namespaces joined by a veth pair, removed on drop.
struct Netns {
    names: [String; 2],
}

impl Netns {
    fn new() -> Self {
        let tag = std::process::id() % 100_000;
        let names = [format!("dcnet{tag}a"), format!("dcnet{tag}b")];
        let (va, vb) = (format!("dcv{tag}a"), format!("dcv{tag}b"));
        let me = Self { names };
        for n in &me.names {
            ip(&["netns", "add", n]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        for (i, (v, n)) in [(&va, &me.names[0]), (&vb, &me.names[1])]
            .into_iter()
            .enumerate()
        {
            ip(&["link", "set", v, "netns", n]);
            ip(&[
                "-n",
                n,
                "addr",
                "add",
                &format!("10.231.{}.{}/24", tag % 200, i + 1),
                "dev",
                v,
            ]);
            ip(&["-n", n, "link", "set", v, "up"]);
        }
        me
    }

    fn addr(&self, i: usize) -> String {
        let tag = std::process::id() % 100_000;
        format!("10.231.{}.{}", tag % 200, i + 1)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            // Deleting a namespace also deletes its end of the veth pair (and so the pair).
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Why namespaces cannot be made here, or None.
fn netns_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (ip netns needs CAP_SYS_ADMIN)".to_owned());
    }
    for tool in ["ip", "unshare"] {
        match Command::new(tool).arg("-V").output() {
            Ok(o) if o.status.success() => {}
            _ => return Some(format!("no `{tool}` command")),
        }
    }
    None
}

#[test]
fn net_across_network_namespaces() {
    if !ucx_available("net_across_network_namespaces") {
        return;
    }
    if let Some(why) = netns_unavailable() {
        eprintln!("SKIPPED net_across_network_namespaces: {why}");
        return;
    }
    let ns = Netns::new();
    let addr0 = ns.addr(0);
    let veth = |i: usize| format!("dcv{}{}", std::process::id() % 100_000, ["a", "b"][i]);
    let children = (0..2)
        .map(|r| {
            let sp = Spawn {
                role: "exchange",
                world: 2,
                addr: &addr0,
                // A fresh namespace has every port free.
                port: 29_500,
                // Own network and UTS namespaces: own interfaces and own host name.
                wrapper: [
                    "ip",
                    "netns",
                    "exec",
                    &ns.names[r],
                    "unshare",
                    "--uts",
                    "--",
                    "sh",
                    "-c",
                    "hostname \"$0\" && exec \"$@\"",
                    &ns.names[r],
                ]
                .map(String::from)
                .to_vec(),
                env: vec![
                    ("DEVCOMM_NET_ROUNDS", "8".to_owned()),
                    ("UCX_NET_DEVICES", veth(r)),
                    // The store listens beyond loopback here, which needs a job token.
                    (
                        "DEVCOMM_JOB_TOKEN",
                        format!("netns-test-{}", std::process::id()),
                    ),
                ],
            };
            sp.rank(r)
        })
        .collect();
    let outs = finish(children, Duration::from_secs(120));
    for (rank, out) in outs.iter().enumerate() {
        assert!(
            out.contains(&format!("rank {rank}: 8 rounds with 1 peers verified")),
            "{out}"
        );
        let host = format!("rank {rank}: host {}", ns.names[rank]);
        assert!(
            out.contains(&host),
            "rank {rank} did not run as its own host: {out}"
        );
    }
}

/// GPU memory registered with UCX (`cuda = true`) and put over TCP through UCX's CUDA copy
/// transport, 2 ranks on GPU 0: a probe for the registration of users' GPU buffers with the
/// transport (docs/NETWORK.md, "Not built yet"). Needs a GPU and UCX's CUDA modules:
/// `cargo test --test net_ucx -- --ignored net_gpu_memory_put` with `UCX_TLS` naming the CUDA
/// copy transport (the default here: `tcp,cuda_copy`).
#[test]
#[ignore = "needs a GPU and UCX's CUDA modules"]
fn net_gpu_memory_put_two_ranks() {
    if !ucx_available("net_gpu_memory_put_two_ranks") {
        return;
    }
    let tls = std::env::var("DEVCOMM_TEST_UCX_TLS").unwrap_or_else(|_| "tcp,cuda_copy".into());
    let sp = Spawn {
        env: vec![("UCX_TLS", tls)],
        ..Spawn::local("gpu_put", 2)
    };
    let children = (0..2).map(|r| sp.rank(r)).collect();
    let outs = finish(children, Duration::from_secs(120));
    for (rank, out) in outs.iter().enumerate() {
        assert!(
            out.contains("verified"),
            "rank {rank} did not verify: {out}"
        );
    }
}
