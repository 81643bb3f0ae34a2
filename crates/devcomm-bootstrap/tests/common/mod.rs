//! Helpers shared by the hardening tests: child processes of the test binary, a raw store
//! client for what the real client never sends, and process inspection through /proc.
//!
//! A child is the test binary re-executed with `DEVCOMM_TEST_ROLE` set; the file's
//! `child_entry` test runs the role and exits.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ROLE: &str = "DEVCOMM_TEST_ROLE";

/// Starts this test binary as a child running `role`, with `env` on top of ours.
pub fn spawn_role(role: &str, env: &[(&str, String)]) -> Child {
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
    .env_remove("DEVCOMM_JOB_TOKEN")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

/// Reads the child's stdout until a line `PORT <n>`.
pub fn read_port(child: &mut Child) -> u16 {
    let out = child.stdout.take().expect("child stdout");
    let mut lines = BufReader::new(out).lines();
    loop {
        let line = lines
            .next()
            .expect("child printed its port")
            .expect("read child stdout");
        if let Some(p) = line.strip_prefix("PORT ") {
            return p.trim().parse().expect("port number");
        }
    }
}

/// Kills the child if it is still running after `limit`; returns whether it exited with 0.
pub fn wait_ok(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s.success();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `Hello` frame as the store client encodes it (see the crate's wire module).
pub fn hello_frame(rank: u32, world: u32, token: Option<&str>) -> Vec<u8> {
    let mut b = vec![1u8];
    b.extend_from_slice(&0x3144_4344u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&rank.to_le_bytes());
    b.extend_from_slice(&world.to_le_bytes());
    match token {
        None => b.push(0),
        Some(t) => {
            b.push(1);
            b.extend_from_slice(&(t.len() as u32).to_le_bytes());
            b.extend_from_slice(t.as_bytes());
        }
    }
    let mut f = (b.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&b);
    f
}

/// A store reply read raw: `Ok`, a refusal with its message, or something else.
#[derive(Debug, PartialEq, Eq)]
pub enum RawReply {
    Ok,
    Refused(String),
    Other(u8),
    /// The connection ended without a reply.
    Closed,
}

/// Reads one reply frame (up to 64 KiB).
pub fn read_reply(stream: &mut TcpStream) -> RawReply {
    let mut len = [0u8; 4];
    if stream.read_exact(&mut len).is_err() {
        return RawReply::Closed;
    }
    let len = u32::from_le_bytes(len) as usize;
    assert!(len <= 65536, "reply of {len} bytes");
    let mut body = vec![0u8; len];
    if stream.read_exact(&mut body).is_err() {
        return RawReply::Closed;
    }
    match body.first() {
        Some(0x80) => RawReply::Ok,
        // opcode, kind, u32 length, message
        Some(0x84) if body.len() >= 6 => {
            RawReply::Refused(String::from_utf8_lossy(&body[6..]).into_owned())
        }
        Some(&op) => RawReply::Other(op),
        None => RawReply::Other(0),
    }
}

/// Connects to the store on loopback and sends `bytes`.
pub fn raw_connect(port: u16, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the store");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(bytes).expect("send");
    s
}

/// Resident memory of a process in bytes (/proc/PID/statm, second field).
pub fn rss_bytes(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .expect("statm field")
        .parse()
        .expect("statm number");
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(4096) as u64
}

/// Number of open fds of a process.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read /proc/PID/fd")
        .count()
}

/// Whether `pid` is a live process (a zombie or a vanished pid counts as dead).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
    }
}

/// Raises this process's soft fd limit to the hard one; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read only the struct passed by pointer.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_cur
}
