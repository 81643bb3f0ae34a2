//! Tests of the error record's decoding and the checks' decisions (pure: no GPU).
use super::*;

fn record() -> ErrorRecord {
    ErrorRecord {
        flag: 1,
        op: 2,
        rank: 3,
        peer: 1,
        slot: 7,
        expected: 5,
        seen: 4,
        elapsed_ns: 1_500_000_000,
    }
}

#[test]
fn record_converts_to_peer_timeout() {
    match record_to_error(&record()) {
        Error::PeerTimeout {
            op,
            rank,
            peer,
            slot,
            expected,
            seen,
            elapsed,
        } => {
            assert_eq!(op, DeviceOp::Barrier);
            assert_eq!((rank, peer, slot, expected, seen), (3, 1, 7, 5, 4));
            assert_eq!(elapsed, Duration::from_millis(1500));
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = record_to_error(&record()).to_string();
    assert!(msg.contains("peer 1") && msg.contains("barrier"), "{msg}");
}

#[test]
fn zero_copy_mismatch_is_a_complete_soft_record() {
    // Written by a kernel without raising abort: complete as soon as `op` is there.
    let rec = ErrorRecord {
        op: 9,
        slot: 1,
        expected: 64,
        seen: 128,
        ..record()
    };
    let state = DeviceErrorState {
        abort: 0,
        reserved: 0,
        record: rec,
        mirror: 0,
    };
    match evaluate(&state, 3, false) {
        Verdict::Failed(e) => match *e {
            Error::ZeroCopyMismatch {
                rank,
                peer,
                field,
                local,
                remote,
            } => {
                assert_eq!((rank, peer, local, remote), (3, 1, 64, 128));
                assert_eq!(field, "the offset");
            }
            other => panic!("unexpected {other:?}"),
        },
        other => panic!("unexpected {other:?}"),
    }
    let msg = record_to_error(&rec).to_string();
    assert!(
        msg.contains("peer 1") && msg.contains("does not match"),
        "{msg}"
    );
    // The same shape with a wait's op is still in progress (abort not yet raised).
    let waiting = DeviceErrorState {
        record: ErrorRecord { op: 7, ..rec },
        ..state
    };
    assert!(matches!(evaluate(&waiting, 3, false), Verdict::Pending));
}

#[test]
fn call_mismatch_is_a_hard_error_naming_both_sizes() {
    let rec = ErrorRecord {
        op: 11,
        rank: 1,
        peer: 0,
        slot: 2,
        expected: 524_291,
        seen: 1_048_581,
        elapsed_ns: 0,
        flag: 1,
    };
    // Recorded with abort raised: complete only then (never reported as soft).
    let pending = DeviceErrorState {
        abort: 0,
        reserved: 0,
        record: rec,
        mirror: 0,
    };
    assert!(matches!(evaluate(&pending, 1, false), Verdict::Pending));
    let fired = DeviceErrorState {
        abort: 1,
        ..pending
    };
    match evaluate(&fired, 1, false) {
        Verdict::Failed(e) => match *e {
            Error::CallMismatch {
                rank,
                peer,
                what,
                local,
                remote,
                ..
            } => {
                assert_eq!((rank, peer, what), (1, 0, "send/recv"));
                assert_eq!((local, remote), (524_291, 1_048_581));
            }
            other => panic!("unexpected {other:?}"),
        },
        other => panic!("unexpected {other:?}"),
    }
    let msg = record_to_error(&rec).to_string();
    for part in [
        "rank 1",
        "peer 0",
        "524291",
        "1048581",
        "size in bytes",
        "rebuilt",
    ] {
        assert!(msg.contains(part), "{part} missing in {msg}");
    }
    let kind = record_to_error(&ErrorRecord { slot: 1, ..rec }).to_string();
    assert!(kind.contains("kind of call"), "{kind}");
    let op = record_to_error(&ErrorRecord {
        slot: 3,
        expected: 1,
        seen: 3,
        ..rec
    });
    assert!(
        matches!(
            op,
            Error::CallMismatch {
                what: "a collective",
                local: 1,
                remote: 3,
                ..
            }
        ),
        "{op:?}"
    );
    assert!(op.to_string().contains("all-to-all-v"), "{op}");
    // The reductions' fields (reduce.cuh, kField*): each names a reduction and its field.
    for (slot, words) in [
        (6, "all-reduce"),
        (7, "element type"),
        (8, "operator"),
        (9, "epilogue"),
        (10, "bytes of the whole buffer"),
    ] {
        let e = record_to_error(&ErrorRecord {
            slot,
            expected: 0,
            seen: 2,
            ..rec
        });
        assert!(
            matches!(
                e,
                Error::CallMismatch {
                    what: "a reduction",
                    local: 0,
                    remote: 2,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains(words), "slot {slot}: {e}");
    }
}

#[test]
fn a_soft_error_does_not_stop_the_next_launch_but_a_hard_one_does() {
    let soft = DeviceErrorState {
        abort: 0,
        reserved: 0,
        record: ErrorRecord { op: 6, ..record() },
        mirror: 0,
    };
    assert!(soft_pending(&soft));
    // The same record with abort raised, a wait's record in progress, a hard mismatch:
    // the launch checks them as `check` does.
    assert!(!soft_pending(&DeviceErrorState { abort: 1, ..soft }));
    assert!(!soft_pending(&DeviceErrorState {
        record: ErrorRecord {
            op: 3,
            ..soft.record
        },
        ..soft
    }));
    assert!(!soft_pending(&DeviceErrorState {
        record: ErrorRecord {
            op: 11,
            ..soft.record
        },
        ..soft
    }));
    assert!(!soft_pending(&DeviceErrorState::default()));
}

#[test]
fn unknown_op_codes_survive() {
    let rec = ErrorRecord { op: 42, ..record() };
    assert!(matches!(
        record_to_error(&rec),
        Error::PeerTimeout {
            op: DeviceOp::Unknown(42),
            ..
        }
    ));
}

#[test]
fn evaluate_covers_every_state() {
    let clear = DeviceErrorState::default();
    assert!(matches!(evaluate(&clear, 0, false), Verdict::Clear));

    let in_progress = DeviceErrorState {
        abort: 0,
        reserved: 0,
        record: record(),
        mirror: 0,
    };
    assert!(matches!(evaluate(&in_progress, 0, false), Verdict::Pending));

    let fired = DeviceErrorState {
        abort: 1,
        reserved: 0,
        record: record(),
        mirror: 0,
    };
    assert!(matches!(
        evaluate(&fired, 0, false),
        Verdict::Failed(e) if matches!(*e, Error::PeerTimeout { peer: 1, .. })
    ));

    // A thread that lost the claim raised abort while the winner still writes its fields: the
    // record (op still 0) is not taken, whoever raised abort.
    let half_written = DeviceErrorState {
        abort: 1,
        reserved: 0,
        record: ErrorRecord {
            flag: 1,
            ..ErrorRecord::default()
        },
        mirror: 0,
    };
    assert!(matches!(
        evaluate(&half_written, 0, false),
        Verdict::Pending
    ));
    assert!(matches!(evaluate(&half_written, 0, true), Verdict::Pending));
    assert!(matches!(
        settle(&half_written, 4),
        Err(Error::Aborted { rank: 4, .. })
    ));

    let aborted = DeviceErrorState {
        abort: 1,
        ..DeviceErrorState::default()
    };
    assert!(matches!(evaluate(&aborted, 2, false), Verdict::Pending));
    assert!(matches!(
        evaluate(&aborted, 2, true),
        Verdict::Failed(e) if matches!(*e, Error::Aborted { rank: 2, .. })
    ));
}

#[test]
fn settle_reports_what_is_there() {
    let in_progress = DeviceErrorState {
        abort: 0,
        reserved: 0,
        record: record(),
        mirror: 0,
    };
    assert!(matches!(
        settle(&in_progress, 0),
        Err(Error::PeerTimeout { slot: 7, .. })
    ));
    let aborted = DeviceErrorState {
        abort: 1,
        ..DeviceErrorState::default()
    };
    assert!(matches!(
        settle(&aborted, 5),
        Err(Error::Aborted { rank: 5, .. })
    ));
    assert!(settle(&DeviceErrorState::default(), 0).is_ok());
}

#[test]
fn network_records_name_the_peer_in_the_network_layers_words() {
    // What the proxy writes for a dead peer (record::op::PEER_FAILED, UCS_ERR_CONNECTION_RESET).
    let dead = ErrorRecord {
        flag: 1,
        op: crate::error::net::op::PEER_FAILED,
        rank: 0,
        peer: 2,
        slot: 1,
        expected: 7,
        seen: (-25i64) as u64,
        elapsed_ns: 0,
    };
    assert_eq!(DeviceOp::from_code(dead.op), DeviceOp::NetPeerFailed);
    match record_to_error(&dead) {
        Error::Network {
            rank: 0,
            peer: 2,
            message,
        } => assert!(
            message.contains("network peer 2") && message.contains("connection reset"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    // Every network code decodes to a named op, none to the call agreement's 11.
    for (code, op) in [
        (20, DeviceOp::NetQueueFull),
        (21, DeviceOp::NetPeerFailed),
        (22, DeviceOp::NetFlush),
        (23, DeviceOp::NetBadDescriptor),
        (11, DeviceOp::CallMismatch),
        (12, DeviceOp::MoeDispatch),
        (13, DeviceOp::MoeCombine),
    ] {
        assert_eq!(DeviceOp::from_code(code), op);
    }
    let full = ErrorRecord {
        op: crate::error::net::op::QUEUE_FULL,
        ..dead
    };
    assert!(matches!(
        record_to_error(&full),
        Error::Network { peer: 2, .. }
    ));
    // The network route's call-number field.
    let call = ErrorRecord {
        op: 11,
        slot: 5,
        ..dead
    };
    let msg = record_to_error(&call).to_string();
    assert!(
        msg.contains("call number") && msg.contains("peer 2"),
        "{msg}"
    );
}
