//! The reduction tables' format, checks, buckets and fingerprints.

use super::*;

/// A valid table for 4 H200s (also used by the communicator's and the built-in tables'
/// tests): all-reduce on ordinary buffers in three buckets, reduce-scatter in one, all-reduce
/// on pool buffers in one.
pub(crate) fn table() -> ReduceTuneTable {
    let entry = |collective, buffers, max_bytes, algorithm, blocks, pushed| ReduceTuneEntry {
        collective,
        buffers,
        max_bytes,
        algorithm,
        blocks,
        pushed,
        us: 10.0,
        default_us: 11.0,
        nccl_us: 12.0,
    };
    use Buffers::{Ordinary, Pool};
    use Collective::{AllReduce, ReduceScatter};
    use TunedAlgorithm::*;
    ReduceTuneTable {
        version: REDUCE_TUNE_VERSION,
        device: "NVIDIA H200".into(),
        world_size: 4,
        date: "2026-12-01".into(),
        dtype: "bf16".into(),
        window: TunedWindow {
            one_shot_bytes: 1 << 20,
            line_two_shot_bytes: 4 << 20,
            chunk_bytes: 32 << 20,
        },
        entries: vec![
            entry(AllReduce, Ordinary, 64 << 10, OneShot, 8, false),
            entry(AllReduce, Ordinary, 1 << 20, OneShot, 32, false),
            entry(ReduceScatter, Ordinary, 1 << 30, Staged, 64, false),
            entry(AllReduce, Ordinary, 1 << 30, Staged, 64, true),
            entry(AllReduce, Pool, 4 << 20, ZeroCopyTwoShot, 16, false),
        ],
    }
}

fn reason(t: &ReduceTuneTable) -> String {
    t.check().unwrap_err().to_string()
}

#[test]
fn buckets_serve_the_smallest_measured_size_at_or_above_per_key() {
    let t = table();
    t.check().unwrap();
    let ar = |bytes| t.choice_for(Collective::AllReduce, Buffers::Ordinary, bytes);
    assert_eq!(ar(1).map(|c| c.blocks), Some(8));
    assert_eq!(ar(64 << 10).map(|c| c.blocks), Some(8));
    assert_eq!(ar((64 << 10) + 1).map(|c| c.blocks), Some(32));
    let big = ar(1 << 30).unwrap();
    assert_eq!(
        (big.algorithm, big.blocks, big.pushed),
        (TunedAlgorithm::Staged, 64, true)
    );
    assert_eq!(ar((1 << 30) + 1), None);
    // Other keys: their own buckets, or none.
    let pool = t
        .choice_for(Collective::AllReduce, Buffers::Pool, 4096)
        .unwrap();
    assert_eq!(pool.algorithm, TunedAlgorithm::ZeroCopyTwoShot);
    assert_eq!(
        t.choice_for(Collective::AllReduce, Buffers::Pool, 8 << 20),
        None
    );
    assert!(t
        .choice_for(Collective::ReduceScatter, Buffers::Ordinary, 8)
        .is_some());
    assert_eq!(
        t.choice_for(Collective::ReduceScatter, Buffers::Pool, 8),
        None
    );
    assert_eq!(
        t.choice_for(Collective::AllGather, Buffers::Ordinary, 8),
        None
    );
}

#[test]
fn sizes_count_as_the_benchmark_counts_them() {
    assert_eq!(table_bytes(Collective::AllReduce, 1000, 2, 4), 2000);
    assert_eq!(table_bytes(Collective::ReduceScatter, 1000, 2, 4), 8000);
    assert_eq!(table_bytes(Collective::AllGather, 1000, 2, 4), 8000);
    assert_eq!(table_bytes(Collective::AllGather, u64::MAX, 2, 4), u64::MAX);
}

#[test]
fn round_trips_through_json_with_the_same_fingerprint() {
    let t = table();
    let text = t.to_json();
    assert!(text.contains("\"collective\": \"all_reduce\""), "{text}");
    assert!(
        text.contains("\"algorithm\": \"zero_copy_two_shot\""),
        "{text}"
    );
    assert!(text.contains("\"buffers\": \"pool\""), "{text}");
    let back = ReduceTuneTable::from_json(&text).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.fingerprint(), t.fingerprint());
    let mut other = t.clone();
    other.entries[0].blocks = 16;
    assert_ne!(other.fingerprint(), t.fingerprint());
    // `pushed` may be left out (false).
    let without = text.replace("\"pushed\": false,", "");
    assert_eq!(ReduceTuneTable::from_json(&without).unwrap(), t);
}

#[test]
fn refuses_inconsistent_tables_and_says_what_is_wrong() {
    use Buffers::{Ordinary, Pool};
    use Collective::{AllGather, ReduceScatter};
    use TunedAlgorithm::*;
    let t = table();
    let with = |i: usize, f: &dyn Fn(&mut ReduceTuneEntry)| {
        let mut t = table();
        f(&mut t.entries[i]);
        reason(&t)
    };
    // Buckets out of order within a key (other keys between do not matter).
    let mut bad = t.clone();
    bad.entries.swap(0, 1);
    assert!(reason(&bad).contains("out of order"));
    let mut bad = t.clone();
    bad.entries[1].max_bytes = 64 << 10;
    assert!(reason(&bad).contains("out of order"));
    assert!(with(0, &|e| e.max_bytes = 0).contains("0 bytes"));
    assert!(with(0, &|e| e.blocks = 0).contains("blocks"));
    assert!(with(0, &|e| e.blocks = MAX_BLOCKS + 1).contains("blocks"));
    // Algorithms the collective or the buffers have no kernel of.
    let e = with(2, &|e| e.algorithm = LineTwoShot);
    assert!(
        e.contains("line_two_shot") && e.contains("reduce_scatter"),
        "{e}"
    );
    assert!(with(2, &|e| {
        e.collective = AllGather;
        e.algorithm = ZeroCopyOneShot;
        e.buffers = Pool;
    })
    .contains("no zero_copy_one_shot kernel"));
    assert!(with(0, &|e| e.algorithm = ZeroCopyTwoShot).contains("needs pool buffers"));
    assert!(with(2, &|e| e.pushed = true).contains("pushed"));
    assert!(with(0, &|e| e.pushed = true).contains("pushed"));
    // Beyond the window the table names: the one-shot's payload is the whole all-reduce,
    // a reduce-scatter's input over the ranks.
    let e = with(1, &|e| e.max_bytes = (1 << 20) + 8);
    assert!(e.contains("one-shot beyond"), "{e}");
    let mut fits = t.clone();
    fits.entries[2] = ReduceTuneEntry {
        collective: ReduceScatter,
        buffers: Ordinary,
        max_bytes: 4 << 20, // 1 MiB a sender
        algorithm: OneShot,
        ..t.entries[2].clone()
    };
    fits.check().unwrap();
    fits.entries[2].max_bytes = (4 << 20) + 4;
    assert!(reason(&fits).contains("one-shot beyond"));
    let mut lines = t.clone();
    lines.entries[1].algorithm = LineTwoShot;
    lines.check().unwrap();
    lines.entries[1].max_bytes = (4 << 20) + 2;
    lines.entries[3].max_bytes = 1 << 30;
    assert!(reason(&lines).contains("two-shot on lines beyond"));
    assert!(with(0, &|e| e.nccl_us = -1.0).contains("time"));
    assert!(with(0, &|e| e.us = f64::INFINITY).contains("time"));
    // The header.
    let mut bad = t.clone();
    bad.world_size = 1;
    assert!(reason(&bad).contains("world size"));
    bad.world_size = MAX_WORLD + 1;
    assert!(reason(&bad).contains("world size"));
    let mut bad = t.clone();
    bad.window.chunk_bytes = 3 << 19;
    assert!(reason(&bad).contains("whole MiB"));
    let mut bad = t.clone();
    bad.window.one_shot_bytes = 8 << 20;
    assert!(reason(&bad).contains("at most 4 MiB"));
    let mut bad = t.clone();
    bad.entries.clear();
    assert!(reason(&bad).contains("no entries"));
}

#[test]
fn refuses_other_versions_malformed_text_and_send_recv_tables() {
    let mut t = table();
    t.version = REDUCE_TUNE_VERSION + 1;
    let err = ReduceTuneTable::from_json(&t.to_json())
        .unwrap_err()
        .to_string();
    assert!(err.contains("version"), "{err}");
    assert!(ReduceTuneTable::from_json("{").is_err());
    assert!(ReduceTuneTable::from_json("[]").is_err());
    // A misspelt field, an unknown collective or algorithm: named.
    let text = table().to_json();
    let err = ReduceTuneTable::from_json(&text.replacen("\"blocks\"", "\"blokcs\"", 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("blokcs"), "{err}");
    let err = ReduceTuneTable::from_json(&text.replacen("all_reduce", "all_to_all", 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("all_to_all"), "{err}");
    let err = ReduceTuneTable::from_json(&text.replacen("one_shot", "three_shot", 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("three_shot"), "{err}");
    // An inconsistent table is refused when it is read.
    let mut bad = table();
    bad.entries[0].blocks = 0;
    assert!(ReduceTuneTable::from_json(&bad.to_json()).is_err());
    // A send/recv table in the reductions' place says so.
    let p2p = crate::p2p::tune::tests::table(&crate::p2p::P2PLimits::default());
    let err = ReduceTuneTable::from_json(&p2p.to_json())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("send/recv") && err.contains("DEVCOMM_TUNE_FILE"),
        "{err}"
    );
    // A file that is not there names itself.
    let missing = ReduceTuneTable::load(Path::new("/nonexistent/devcomm-reduce-tune.json"));
    let err = missing.unwrap_err().to_string();
    assert!(
        err.contains("cannot read") && err.contains("devcomm-reduce-tune.json"),
        "{err}"
    );
}

#[test]
fn a_table_serves_its_gpu_model_world_size_and_round_only() {
    let t = table();
    t.validate("NVIDIA H200", 4, 32 << 20).unwrap();
    let e = t
        .validate("NVIDIA H100 80GB HBM3", 4, 32 << 20)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("NVIDIA H100 80GB HBM3") && e.contains("NVIDIA H200"),
        "{e}"
    );
    let e = t
        .validate("NVIDIA H200", 8, 32 << 20)
        .unwrap_err()
        .to_string();
    assert!(e.contains("4 ranks"), "{e}");
    let e = t
        .validate("NVIDIA H200", 4, 8 << 20)
        .unwrap_err()
        .to_string();
    assert!(e.contains("DEVCOMM_REDUCE_CHUNK_MIB"), "{e}");
}

#[test]
fn the_window_holds_the_defaults_and_the_table() {
    let d = ReduceLimits::for_world(4);
    let t = table();
    let w = t.window.widen(&d);
    assert_eq!(
        (w.one_shot_bytes, w.line_two_shot_bytes),
        (1 << 20, 4 << 20)
    );
    assert_eq!(w.chunk_bytes, d.chunk_bytes);
    // A smaller table window leaves the defaults' sizes.
    let small = TunedWindow {
        one_shot_bytes: 64 << 10,
        line_two_shot_bytes: 0,
        chunk_bytes: 32 << 20,
    };
    assert_eq!(small.widen(&d), d);
    assert_eq!(TunedWindow::of(&d).widen(&d), d);
}
