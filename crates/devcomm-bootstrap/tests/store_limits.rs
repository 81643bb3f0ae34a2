//! The store's limits after the hello: oversize requests and replies are refused with a clear
//! error and the connection stays usable; `add` is checked.

use std::time::Duration;

use devcomm_bootstrap::{Error, RankInfo, Store, StoreLimits};

const T: Duration = Duration::from_secs(20);
const LIMIT: usize = 64 << 10;

/// Rank 0 hosting a store with a 64 KiB frame limit, and rank 1 (default limits) on it.
fn pair() -> (Store, Store) {
    let limits = StoreLimits::default().with_max_frame(LIMIT);
    let s0 = Store::connect_with(&RankInfo::new(0, 2).with_master("127.0.0.1", 0), T, limits)
        .expect("rank 0");
    let info1 = RankInfo::new(1, 2).with_master("127.0.0.1", s0.master_port());
    let s1 = Store::connect(&info1, T).expect("rank 1");
    (s0, s1)
}

fn protocol_message(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(Error::Protocol(m)) => m,
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn an_all_gather_reply_over_the_limit_is_refused_and_the_connection_stays_usable() {
    let (s0, s1) = pair();
    let blob = vec![7u8; 40 << 10];
    let b1 = blob.clone();
    let t1 = std::thread::spawn(move || {
        let r = s1.all_gather("big", &b1, T).map(|v| v.len());
        let next = s1.all_gather("small", b"1", T);
        (r, next, s1)
    });
    let r0 = s0.all_gather("big", &blob, T).map(|v| v.len());
    let next0 = s0.all_gather("small", b"0", T).expect("rank 0: next call");
    let (r1, next1, s1) = t1.join().expect("rank 1 thread");
    for (rank, r) in [(0, r0), (1, r1)] {
        let m = protocol_message(r);
        assert!(
            m.contains(&format!("rank {rank}"))
                && m.contains("all_gather `big`")
                && m.contains("frame limit of 65536"),
            "{m}"
        );
    }
    assert_eq!(next0, [b"0".to_vec(), b"1".to_vec()]);
    assert_eq!(next1.expect("rank 1: next call"), next0);
    // Each contribution alone still fits and can be read.
    assert_eq!(s1.get("big/0", T).expect("get"), blob);
}

#[test]
fn an_oversize_set_is_refused_and_the_connection_stays_usable() {
    let (s0, s1) = pair();
    let big = vec![1u8; 100 << 10];
    // Rank 1's own limit is larger: the server drains the request and refuses it.
    let m = protocol_message(s1.set("k", &big));
    assert!(
        m.contains("rank 1") && m.contains("set `k`") && m.contains("frame limit of 65536"),
        "{m}"
    );
    s1.set("k", b"small").expect("rank 1: next call");
    assert_eq!(s1.get("k", T).expect("get"), b"small");
    // Rank 0's client has the small limit: refused before sending.
    let m = protocol_message(s0.set("k2", &big));
    assert!(
        m.contains("rank 0") && m.contains("over the frame limit"),
        "{m}"
    );
    assert_eq!(s0.get("k", T).expect("rank 0: next call"), b"small");
}

#[test]
fn a_reply_over_the_clients_own_limit_is_skipped_and_the_connection_stays_usable() {
    // The server has the default limit; rank 1's client accepts only 16 KiB.
    let s0 = Store::connect(&RankInfo::new(0, 2).with_master("127.0.0.1", 0), T).expect("r0");
    let info1 = RankInfo::new(1, 2).with_master("127.0.0.1", s0.master_port());
    let small = StoreLimits::default().with_max_frame(16 << 10);
    let s1 = Store::connect_with(&info1, T, small).expect("rank 1");
    s0.set("mid", &vec![2u8; 60 << 10]).expect("set");
    let m = protocol_message(s1.get("mid", T));
    assert!(
        m.contains("rank 1") && m.contains("get `mid`") && m.contains("frame limit of 16384"),
        "{m}"
    );
    s1.set("x", b"y").expect("rank 1: next call");
    assert_eq!(s1.get("x", T).expect("get"), b"y");
    // Limits out of range are refused.
    let tiny = StoreLimits::default().with_max_frame(100);
    assert!(matches!(
        Store::connect_with(&RankInfo::single(), T, tiny),
        Err(Error::Protocol(_))
    ));
}

#[test]
fn add_overflow_is_an_error_not_a_wrap() {
    let (s0, _s1) = pair();
    s0.set("n", i64::MAX.to_string().as_bytes()).expect("set");
    let m = protocol_message(s0.add("n", 1));
    assert!(m.contains("overflows"), "{m}");
    assert_eq!(
        s0.get("n", T).expect("get"),
        i64::MAX.to_string().as_bytes()
    );
    assert_eq!(s0.add("n", -1).expect("add"), i64::MAX - 1);
    s0.set("m", i64::MIN.to_string().as_bytes()).expect("set");
    assert!(matches!(s0.add("m", -1), Err(Error::Protocol(_))));
    assert_eq!(s0.add("m", 0).expect("add 0"), i64::MIN);
}
