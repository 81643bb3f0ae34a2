//! fd passing with strangers on the socket: a process of our uid that connects to a rank's
//! fd socket first (silent, or forging a message from a rank) does not stop the exchange.

mod common;

use std::fs::File;
use std::io::{IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{read_port, spawn_role, wait_ok, ROLE};
use devcomm_bootstrap::{RankInfo, Store};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

const T: Duration = Duration::from_secs(20);
const TOKEN: &str = "fd-intruder-token";

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
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

fn read_back(fd: OwnedFd) -> String {
    let mut buf = vec![0u8; 64];
    let n = File::from(fd).read_at(&mut buf, 0).expect("read_at");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Dispatcher for child processes; a no-op in the normal test run (no role set).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let result = match role.as_str() {
        "peer" => peer(),
        other => Err(format!("unknown role {other}")),
    };
    if let Err(e) = &result {
        eprintln!("child role {role} failed: {e}");
    }
    std::process::exit(i32::from(result.is_err()));
}

/// Rank 1: waits until the parent's intruders are in place, notes when it sends, exchanges.
fn peer() -> Result<(), String> {
    let port: u16 = std::env::var("PORT_OF_RANK0")
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|e| format!("port: {e}"))?;
    let info = RankInfo::new(1, 2)
        .with_master("127.0.0.1", port)
        .with_token(Some(TOKEN.into()));
    let s = Store::connect(&info, T).map_err(|e| e.to_string())?;
    println!("PORT {port}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    s.get("intruders-in", T).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    s.set("sent_at", unix_ms().to_string().as_bytes())
        .map_err(|e| e.to_string())?;
    let mine = memfd_with("from rank 1");
    let got = s
        .exchange_fds("x", mine.as_fd(), &[0, 1], T)
        .map_err(|e| e.to_string())?;
    let text = got.into_iter().next().map(|(_, fd)| read_back(fd));
    if text.as_deref() != Some("from rank 0") {
        return Err(format!("rank 1 received {text:?}"));
    }
    s.barrier("end", T).map_err(|e| e.to_string())
}

/// A message in the fd-passing format (magic "DCFD", sender, tag length, tag) with `fd`.
fn forge(to: &str, sender: u32, tag: &str, fd: &File) -> UnixStream {
    let addr = SocketAddr::from_abstract_name(to.as_bytes()).expect("name");
    let s = UnixStream::connect_addr(&addr).expect("connect to the fd socket");
    let mut header = 0x4446_4344u32.to_le_bytes().to_vec();
    header.extend_from_slice(&sender.to_le_bytes());
    header.extend_from_slice(&(tag.len() as u32).to_le_bytes());
    header.extend_from_slice(tag.as_bytes());
    let raw = [fd.as_raw_fd()];
    sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(&header)],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::empty(),
        None,
    )
    .expect("sendmsg");
    s
}

#[test]
fn strangers_on_the_fd_socket_do_not_stop_the_exchange() {
    let info = RankInfo::new(0, 2)
        .with_master("127.0.0.1", 0)
        .with_token(Some(TOKEN.into()));
    let s0 = Store::connect(&info, T).expect("rank 0");
    let mut child = spawn_role("peer", &[("PORT_OF_RANK0", s0.master_port().to_string())]);
    read_port(&mut child);
    // This process is rank 0, not rank 1: to rank 0's receiver, connections from it are
    // strangers. One stays silent; one forges rank 1's message for the same tag.
    let name = s0.fd_socket_name();
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
    let _silent = UnixStream::connect_addr(&addr).expect("silent intruder");
    let forged_fd = memfd_with("forged");
    let _forger = forge(&name, 1, "x", &forged_fd);
    s0.set("intruders-in", b"1").expect("set");
    let mine = memfd_with("from rank 0");
    let got = s0
        .exchange_fds("x", mine.as_fd(), &[0, 1], T)
        .expect("rank 0 exchange");
    let done = unix_ms();
    let sent_at: u64 = String::from_utf8(s0.get("sent_at", T).expect("sent_at"))
        .expect("utf8")
        .parse()
        .expect("ms");
    let ranks: Vec<usize> = got.iter().map(|(r, _)| *r).collect();
    assert_eq!(ranks, [1]);
    let text = read_back(got.into_iter().next().expect("one fd").1);
    assert_eq!(text, "from rank 1", "the forged fd was accepted");
    let lag = done.saturating_sub(sent_at);
    assert!(
        lag < 1000,
        "exchange completed {lag} ms after rank 1's send"
    );
    s0.barrier("end", T).expect("barrier");
    assert!(wait_ok(&mut child, T), "rank 1 failed");
}
