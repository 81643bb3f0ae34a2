//! The store before the job token is checked: a large length prefix, a trickled hello, a
//! flood of silent connections and a second client claiming a joined rank.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{
    fd_count, hello_frame, raw_connect, read_port, read_reply, rss_bytes, spawn_role, wait_ok,
    RawReply, ROLE,
};
use devcomm_bootstrap::limits::{MAX_HELLO_FRAME, MAX_PENDING_AUTH};
use devcomm_bootstrap::{Error, RankInfo, Store, StoreLimits};

const T: Duration = Duration::from_secs(20);
const TOKEN: &str = "auth-test-token";

/// Dispatcher for child processes; a no-op in the normal test run (no role set).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let ok = match role.as_str() {
        // Rank 0 of 2 on an ephemeral port: prints it, waits for rank 1 at a barrier.
        "host" => {
            let info = RankInfo::new(0, 2)
                .with_master("127.0.0.1", 0)
                .with_token(Some(TOKEN.into()));
            let s = Store::connect(&info, T).expect("rank 0 connect");
            println!("PORT {}", s.master_port());
            std::io::stdout().flush().expect("flush");
            s.barrier("joined", Duration::from_secs(60)).is_ok()
        }
        other => {
            eprintln!("unknown role {other}");
            false
        }
    };
    std::process::exit(if ok { 0 } else { 1 });
}

fn rank1(port: u16) -> RankInfo {
    RankInfo::new(1, 2)
        .with_master("127.0.0.1", port)
        .with_token(Some(TOKEN.into()))
}

#[test]
fn a_huge_length_prefix_before_the_token_is_refused_without_allocating() {
    let mut host = spawn_role("host", &[]);
    let pid = host.id();
    let port = read_port(&mut host);
    std::thread::sleep(Duration::from_millis(100));
    let before = rss_bytes(pid);
    let mut conns = Vec::new();
    for _ in 0..4 {
        let mut s = raw_connect(port, &(256u32 << 20).to_le_bytes());
        match read_reply(&mut s) {
            RawReply::Refused(m) => assert!(
                m.contains("exceeds") && m.contains(&MAX_HELLO_FRAME.to_string()),
                "{m}"
            ),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // What a client that ignores the refusal sends next is not read into memory.
        let _ = s.write_all(&vec![0x55; 32 << 20]);
        conns.push(s);
    }
    std::thread::sleep(Duration::from_millis(200));
    let grown = rss_bytes(pid).saturating_sub(before);
    assert!(grown < 16 << 20, "the store grew by {grown} bytes");
    // The store still serves a real rank.
    let s1 = Store::connect(&rank1(port), T).expect("rank 1 joins");
    s1.barrier("joined", T).expect("barrier");
    drop(s1);
    assert!(wait_ok(&mut host, T), "host child failed");
}

#[test]
fn a_trickled_hello_is_cut_at_one_deadline_for_the_whole_frame() {
    let limits = StoreLimits::default().with_hello_deadline(Duration::from_millis(800));
    let info = RankInfo::new(0, 2)
        .with_master("127.0.0.1", 0)
        .with_token(Some(TOKEN.into()));
    let s0 = Store::connect_with(&info, T, limits).expect("rank 0");
    let frame = hello_frame(1, 2, Some(TOKEN));
    let mut conn = raw_connect(s0.master_port(), &frame[..4]);
    let mut writer = conn.try_clone().expect("clone");
    let t0 = Instant::now();
    let trickle = std::thread::spawn(move || {
        // One byte every 150 ms: each read finishes well within any per-read timeout.
        for b in &frame[4..frame.len() - 1] {
            if writer.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    let reply = read_reply(&mut conn);
    let took = t0.elapsed();
    match reply {
        RawReply::Refused(m) => assert!(m.contains("no complete hello"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(took >= Duration::from_millis(700), "took {took:?}");
    assert!(took < Duration::from_millis(2500), "took {took:?}");
    trickle.join().expect("trickle thread");
}

#[test]
fn a_real_rank_joins_within_1s_while_1000_silent_connections_are_open() {
    let mut host = spawn_role("host", &[]);
    let pid = host.id();
    let port = read_port(&mut host);
    let limit = common::raise_nofile();
    assert!(
        limit >= 1100,
        "this test needs 1,100 fds; the hard limit is {limit}"
    );
    let silent: Vec<TcpStream> = (0..1000)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("silent connect"))
        .collect();
    // Let the store accept them all.
    std::thread::sleep(Duration::from_millis(500));
    let fds = fd_count(pid);
    assert!(
        fds <= MAX_PENDING_AUTH + 32,
        "the store holds {fds} fds with 1,000 silent connections"
    );
    let t0 = Instant::now();
    let s1 = Store::connect(&rank1(port), T).expect("rank 1 joins");
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "rank 1 took {took:?} to join"
    );
    s1.barrier("joined", T).expect("barrier");
    drop(s1);
    drop(silent);
    assert!(wait_ok(&mut host, T), "host child failed");
}

#[test]
fn a_second_client_claiming_a_joined_rank_is_refused() {
    let info = RankInfo::new(0, 3)
        .with_master("127.0.0.1", 0)
        .with_token(Some(TOKEN.into()));
    let s0 = Store::connect(&info, T).expect("rank 0");
    let port = s0.master_port();
    let mut first = raw_connect(port, &hello_frame(1, 3, Some(TOKEN)));
    assert_eq!(read_reply(&mut first), RawReply::Ok);
    let mut second = raw_connect(port, &hello_frame(1, 3, Some(TOKEN)));
    match read_reply(&mut second) {
        RawReply::Refused(m) => assert!(m.contains("rank 1 already joined"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Rank 0 is taken too (by the store's own client); rank 2 is free.
    let mut zero = raw_connect(port, &hello_frame(0, 3, Some(TOKEN)));
    assert!(matches!(read_reply(&mut zero), RawReply::Refused(_)));
    let mut two = raw_connect(port, &hello_frame(2, 3, Some(TOKEN)));
    assert_eq!(read_reply(&mut two), RawReply::Ok);
    // A wrong token and no token are refused as before.
    let mut bad = raw_connect(port, &hello_frame(2, 3, Some("auth-test-tokem")));
    assert!(matches!(read_reply(&mut bad), RawReply::Refused(m) if m.contains("different")));
    let mut none = raw_connect(port, &hello_frame(2, 3, None));
    assert!(matches!(read_reply(&mut none), RawReply::Refused(m) if m.contains("no job token")));
}

#[test]
fn the_real_client_reports_a_rank_already_joined() {
    let s0 = Store::connect(&RankInfo::new(0, 2).with_master("127.0.0.1", 0), T).expect("r0");
    let port = s0.master_port();
    let mut squatter = raw_connect(port, &hello_frame(1, 2, None));
    assert_eq!(read_reply(&mut squatter), RawReply::Ok);
    let info1 = RankInfo::new(1, 2).with_master("127.0.0.1", port);
    match Store::connect(&info1, T) {
        Err(Error::Protocol(m)) => assert!(m.contains("already joined"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}
