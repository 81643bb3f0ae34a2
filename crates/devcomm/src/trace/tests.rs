//! CPU tests of the trace: the ring's claim rule under contention, the store encoding, the
//! merge onto one clock, the JSON's structure and the summary's arithmetic.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::chrome::{chrome_trace, spans, validate, BLOCK_TID, HOST_TID};
use super::ring::{self, decode, write_event, Kind, RawEvent, HEADER_BYTES, NO_PEER};
use super::summary::{format, summarize};
use super::{HostCall, RankTrace};

fn ev(t: u64, kind: Kind, phase: u16, block: u16, peer: u16, call: u32, arg: u64) -> RawEvent {
    RawEvent {
        time_ns: t,
        arg,
        call,
        kind: kind as u16,
        phase,
        block,
        peer,
        slot: 0,
    }
}

/// The ring image's words as bytes (what the host copies back).
fn image_bytes(image: &[AtomicU64], capacity: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, w) in image.iter().enumerate() {
        let v = w.load(std::sync::atomic::Ordering::Relaxed);
        out.extend_from_slice(&if i == 1 { capacity } else { v }.to_le_bytes());
    }
    out
}

#[test]
fn a_full_ring_drops_and_counts_and_never_overwrites() {
    const CAPACITY: u64 = 1000;
    const WRITERS: u64 = 8;
    const EACH: u64 = 300; // 2400 claims on 1000 records
    let words = HEADER_BYTES / 8 + 4 * CAPACITY as usize;
    let image: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let image = image.clone();
            std::thread::spawn(move || {
                let mut written = 0u64;
                for i in 0..EACH {
                    let e = ev(1 + i, Kind::Bytes, 0, w as u16, 0, 7, w << 32 | i);
                    written += write_event(&image, CAPACITY, e) as u64;
                }
                written
            })
        })
        .collect();
    let written: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(written, CAPACITY);
    let (header, events) = decode(&image_bytes(&image, CAPACITY));
    assert_eq!(header.claimed, WRITERS * EACH);
    assert_eq!(
        ring::dropped(header.claimed, header.capacity),
        WRITERS * EACH - CAPACITY
    );
    assert_eq!(events.len() as u64, CAPACITY);
    // Every record is one writer's whole event: its fields agree with each other, and no
    // (writer, index) appears twice.
    let mut seen = std::collections::HashSet::new();
    for e in &events {
        let (w, i) = (e.arg >> 32, e.arg & 0xffff_ffff);
        assert_eq!((e.block as u64, e.time_ns, e.call), (w, 1 + i, 7), "{e:?}");
        assert!(seen.insert(e.arg), "record {e:?} written twice");
    }
}

#[test]
fn an_unwritten_claim_and_a_short_image_are_skipped() {
    // Claimed 3, capacity 4, but record 1 was never written (kind 0): two events.
    let mut image = vec![0u8; HEADER_BYTES + 4 * 32];
    image[0..8].copy_from_slice(&3u64.to_le_bytes());
    image[8..16].copy_from_slice(&4u64.to_le_bytes());
    for i in [0usize, 2] {
        let words = ring::encode_event(&ev(
            10 + i as u64,
            Kind::KernelBegin,
            0,
            i as u16,
            NO_PEER,
            1,
            0,
        ));
        for (k, w) in words.iter().enumerate() {
            let at = HEADER_BYTES + 32 * i + 8 * k;
            image[at..at + 8].copy_from_slice(&w.to_le_bytes());
        }
    }
    let (header, events) = decode(&image);
    assert_eq!((header.claimed, header.capacity), (3, 4));
    assert_eq!(events.iter().map(|e| e.block).collect::<Vec<_>>(), [0, 2]);
    assert_eq!(decode(&image[..10]).1, []);
    // An image cut short of the claimed records decodes the whole records it holds.
    assert_eq!(decode(&image[..HEADER_BYTES + 40]).1.len(), 1);
}

fn call(id: u32, op: &str, bytes: u64, begin: u64, end: u64) -> HostCall {
    HostCall {
        call: id,
        op: op.into(),
        bytes,
        peers: vec![0, 1],
        algorithm: "TwoShot, 2 blocks".into(),
        stream: 0x1234,
        begin_ns: begin,
        end_ns: end,
    }
}

/// Two ranks, one all-reduce each, two blocks; rank 1's GPU clock runs 5 ms ahead of rank 0's
/// and rank 1 starts 2 us later (host clock).
fn two_ranks() -> Vec<RankTrace> {
    let rank = |r: usize, offset: i64, late: u64| {
        let d = |t: u64| (t + late) as i64 + offset;
        let mut events = Vec::new();
        for b in 0..2u16 {
            let t = |x: u64| d(x + 100 * b as u64) as u64;
            events.extend([
                ev(t(10_000), Kind::KernelBegin, 0, b, NO_PEER, 1, 0),
                ev(t(10_100), Kind::PhaseBegin, 1, b, NO_PEER, 1, 0),
                ev(t(11_100), Kind::PhaseEnd, 1, b, NO_PEER, 1, 4096),
                ev(t(11_100), Kind::WaitBegin, 2, b, NO_PEER, 1, 0),
                ev(t(12_100), Kind::WaitEnd, 2, b, NO_PEER, 1, 0),
                ev(t(12_100), Kind::PhaseBegin, 3, b, NO_PEER, 1, 0),
                ev(t(14_100), Kind::PhaseEnd, 3, b, NO_PEER, 1, 8192),
                ev(t(15_000), Kind::KernelEnd, 0, b, NO_PEER, 1, 0),
            ]);
        }
        RankTrace {
            rank: r,
            clock_offset_ns: offset,
            clock_rtt_ns: 2_000,
            clock_gpu_ns: 0,
            clock_end: None,
            calls: vec![call(1, "all_reduce", 1 << 20, 9_000 + late, 9_500 + late)],
            events,
            dropped: 0,
            dropped_calls: 0,
        }
    };
    vec![rank(0, -1_000, 0), rank(1, 5_000_000, 2_000)]
}

#[test]
fn a_drifting_gpu_clock_is_placed_by_the_interpolated_offset() {
    // Rank 1's GPU clock gains 100 ns per 10 us of its own time (10,000 ppm, to show in ns):
    // measured 5 ms ahead at GPU time `start` and 5.0001 ms ahead 10 us after it.
    let mut ranks = two_ranks();
    let offset = ranks[1].clock_offset_ns;
    let start = offset as u64;
    // The second measurement, `after` ns of GPU time later, `gained` ns further ahead.
    let end = |after: u64, gained: i64| {
        Some(super::clock::ClockPoint {
            gpu_ns: start + after,
            offset_ns: offset + gained,
            rtt_ns: 2_000,
        })
    };
    let drift = |ranks: &[RankTrace]| {
        chrome_trace(ranks)["otherData"]["ranks"][1]["clock_drift_ppm"].clone()
    };
    let r = &mut ranks[1];
    r.clock_gpu_ns = start;
    r.clock_end = end(10_000, 100);
    // The kernel's begin (GPU 5_012_000) is 12 us into the span: its offset grew by 120 ns.
    let k1 = spans(r)
        .into_iter()
        .find(|s| s.what == "kernel" && s.block == 0)
        .unwrap();
    assert_eq!(k1.begin, 12_000 - 120);
    assert_eq!(r.host_ns(start), 0);
    assert_eq!(r.host_ns(start + 10_000), 10_000 - 100);
    // A span under a second gives no drift figure (its slope is mostly measurement error).
    assert_eq!(drift(&ranks), serde_json::Value::Null);
    validate(&chrome_trace(&ranks)).unwrap();
    // Without the second point the offset at setup holds, and there is no drift.
    ranks[1].clock_end = None;
    assert_eq!(ranks[1].host_ns(start + 10_000), 10_000);
    assert_eq!(drift(&ranks), serde_json::Value::Null);
    // 50 us over 10 s is 5 ppm.
    ranks[1].clock_end = end(10_000_000_000, 50_000);
    assert_eq!(drift(&ranks), 5.0);
}

#[test]
fn ranks_merge_on_one_clock() {
    let ranks = two_ranks();
    // Device times minus each rank's offset: rank 1's kernel begins 2 us after rank 0's.
    let s0 = spans(&ranks[0]);
    let s1 = spans(&ranks[1]);
    let k0 = s0
        .iter()
        .find(|s| s.what == "kernel" && s.block == 0)
        .unwrap();
    let k1 = s1
        .iter()
        .find(|s| s.what == "kernel" && s.block == 0)
        .unwrap();
    assert_eq!((k0.begin, k0.end), (10_000, Some(15_000)));
    assert_eq!(k1.begin - k0.begin, 2_000);
    let trace = chrome_trace(&ranks);
    validate(&trace).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    // Time 0 is rank 0's host call (9_000 ns): its kernel is at 1 us, rank 1's at 3 us.
    let kernel = |pid: u64| {
        events
            .iter()
            .find(|e| e["pid"] == pid && e["cat"] == "kernel" && e["tid"] == BLOCK_TID)
            .unwrap()
    };
    assert_eq!(kernel(0)["ts"], 1.0);
    assert_eq!(kernel(1)["ts"], 3.0);
    assert_eq!(kernel(1)["dur"], 5.0);
    assert_eq!(kernel(0)["name"], "all_reduce kernel");
    let host = events
        .iter()
        .find(|e| e["cat"] == "host" && e["pid"] == 1)
        .unwrap();
    assert_eq!(
        (host["ts"].as_f64(), host["tid"].as_u64()),
        (Some(2.0), Some(HOST_TID))
    );
    assert_eq!(host["args"]["bytes"], 1 << 20);
    // Every rank has a named process and a named track per block.
    for pid in [0u64, 1] {
        for (name, tid) in [
            ("process_name", 0),
            ("thread_name", BLOCK_TID),
            ("thread_name", BLOCK_TID + 2),
        ] {
            assert!(
                events.iter().any(|e| e["ph"] == "M"
                    && e["name"] == name
                    && e["pid"] == pid
                    && e["tid"] == tid),
                "{name} of pid {pid} tid {tid}"
            );
        }
    }
    assert_eq!(trace["displayTimeUnit"], "ns");
    assert_eq!(trace["otherData"]["ranks"][1]["clock_offset_ns"], 5_000_000);
}

/// The merged trace of [`two_ranks`] written to the file that `DEVCOMM_TRACE_SAMPLE` names:
/// scripts/test.sh sets it and loads the file with Perfetto's own trace processor
/// (scripts/trace_check.py), so the writer is checked against the importer, not only against
/// [`validate`]'s reading of its rules.
#[test]
fn the_sample_trace_is_written_for_the_perfetto_check() {
    let ranks = two_ranks();
    validate(&chrome_trace(&ranks)).unwrap();
    if let Some(path) = std::env::var_os("DEVCOMM_TRACE_SAMPLE") {
        let path = std::path::PathBuf::from(path);
        crate::trace::chrome::write_file(&ranks, &path).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > 0);
    }
}

#[test]
fn unmatched_events_become_instants_and_roles_get_tracks() {
    let events = vec![
        ev(100, Kind::KernelBegin, 0, 3, NO_PEER, 2, 0),
        ev(110, Kind::PhaseBegin, 5, 3, 1, 2, 0),
        ev(120, Kind::PhaseBegin, 6, 3, 1, 2, 0),
        ev(300, Kind::PhaseEnd, 5, 3, 1, 2, 64),
        ev(305, Kind::KernelEnd, 0, 3, NO_PEER, 2, 0),
        ev(400, Kind::KernelEnd, 0, 3, NO_PEER, 2, 0), // the receive role's end: the last wins
        ev(500, Kind::Bytes, 0, 4, 1, 2, 99),
    ];
    let r = RankTrace {
        rank: 0,
        events,
        calls: vec![call(2, "sendrecv", 64, 50, 60)],
        ..Default::default()
    };
    let trace = chrome_trace(&[r]);
    validate(&trace).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let named = |n: &str| {
        events
            .iter()
            .find(|e| e["name"] == n)
            .unwrap_or_else(|| panic!("{n}"))
    };
    assert_eq!(named("sendrecv kernel")["dur"], 0.3);
    assert_eq!(named("send peer 1")["tid"], BLOCK_TID + 6);
    assert_eq!(named("send peer 1")["args"]["bytes"], 64);
    // The receive phase never ended: an instant on the block's receive track.
    let recv = named("recv peer 1 (no end)");
    assert_eq!(
        (recv["ph"].as_str(), recv["tid"].as_u64()),
        (Some("i"), Some(BLOCK_TID + 7))
    );
    assert_eq!(named("bytes peer 1")["args"]["bytes"], 99);
}

#[test]
fn validation_rejects_what_importers_reject() {
    let good = chrome_trace(&two_ranks());
    validate(&good).unwrap();
    let broken = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut t = good.clone();
        f(&mut t);
        validate(&t).unwrap_err()
    };
    let first_x = |t: &mut serde_json::Value| -> usize {
        t["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .position(|e| e["ph"] == "X")
            .unwrap()
    };
    assert!(broken(&|t| t["traceEvents"] = serde_json::json!({})).contains("traceEvents"));
    assert!(broken(&|t| {
        let i = first_x(t);
        t["traceEvents"][i]["dur"] = (-1.0).into()
    })
    .contains("dur"));
    assert!(broken(&|t| {
        let i = first_x(t);
        t["traceEvents"][i]["pid"] = "a".into()
    })
    .contains("pid"));
    assert!(broken(&|t| {
        let i = first_x(t);
        t["traceEvents"][i]["ph"] = "B".into()
    })
    .contains("phase"));
    assert!(broken(&|t| t["displayTimeUnit"] = "us".into()).contains("displayTimeUnit"));
    // Two slices of one track that overlap without nesting.
    assert!(broken(&|t| {
        let e =
            serde_json::json!({"ph": "X", "name": "x", "pid": 0, "tid": 5, "ts": 1.0, "dur": 2.0});
        let f =
            serde_json::json!({"ph": "X", "name": "y", "pid": 0, "tid": 5, "ts": 2.0, "dur": 2.0});
        t["traceEvents"].as_array_mut().unwrap().extend([e, f]);
    })
    .contains("overlap"));
}

#[test]
fn the_summary_averages_phases_and_finds_the_late_rank() {
    let s = summarize(&two_ranks());
    assert_eq!(s.len(), 1);
    let s = &s[0];
    assert_eq!((s.op.as_str(), s.calls), ("all_reduce", 2));
    // Kernel of block 0 begins at 10_000, of block 1 ends at 15_100: 5.1 us per call.
    assert_eq!(s.device_ns, 5_100.0);
    assert_eq!(
        s.phases,
        vec![
            ("stage".to_owned(), 1_000.0),
            ("reduce".to_owned(), 2_000.0),
            ("wait".to_owned(), 1_000.0)
        ]
    );
    // Rank 1 began its kernels 2 us after rank 0 (on the host clock).
    assert_eq!(s.last_rank, Some((1, 2_000.0)));
    assert_eq!(s.slowest_peer, None);
    assert!((s.gbps - (1 << 20) as f64 / 5_100.0).abs() < 1e-9);
    let text = format(std::slice::from_ref(s), Some(400.0));
    assert!(text.contains("all_reduce: 2 calls"), "{text}");
    assert!(
        text.contains("reduce") && text.contains("last rank to start 1"),
        "{text}"
    );
    assert!(text.contains("% of 400 GB/s"), "{text}");
}

#[test]
fn the_slowest_peer_is_the_one_whose_phases_took_longest() {
    let mut events = vec![ev(0, Kind::KernelBegin, 0, 0, NO_PEER, 1, 0)];
    for (peer, d) in [(1u16, 100u64), (2, 700), (3, 300)] {
        events.push(ev(10, Kind::PhaseBegin, 5, peer, peer, 1, 0));
        events.push(ev(10 + d, Kind::PhaseEnd, 5, peer, peer, 1, 0));
    }
    events.push(ev(1_000, Kind::KernelEnd, 0, 0, NO_PEER, 1, 0));
    let r = RankTrace {
        events,
        calls: vec![call(1, "all_to_all", 3000, 0, 1)],
        ..Default::default()
    };
    let s = &summarize(&[r])[0];
    assert_eq!(s.slowest_peer, Some((2, 700.0)));
    assert_eq!(s.last_rank, None);
}

#[test]
fn a_rank_trace_survives_the_store_encoding() {
    let r = two_ranks().remove(1);
    let bytes = r.to_bytes();
    assert_eq!(RankTrace::from_bytes(&bytes).unwrap(), r);
    assert!(RankTrace::from_bytes(&bytes[..bytes.len() - 1])
        .unwrap_err()
        .contains("whole records"));
    assert!(RankTrace::from_bytes(&bytes[..4])
        .unwrap_err()
        .contains("header"));
}
