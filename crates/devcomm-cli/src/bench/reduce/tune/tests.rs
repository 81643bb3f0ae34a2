use super::*;

fn choice(algorithm: TunedAlgorithm, blocks: u32) -> Choice {
    Choice {
        algorithm,
        blocks,
        pushed: false,
    }
}

#[test]
fn the_window_is_twice_the_defaults_unless_asked() {
    let w = run_window(4, (None, None), 32 << 20);
    assert_eq!(
        (w.one_shot_bytes, w.line_two_shot_bytes, w.chunk_bytes),
        (1 << 20, 8 << 20, 32 << 20)
    );
    // 2 ranks: the line one-shot to 2 MiB, no line two-shot (it never pays there).
    let w = run_window(2, (None, None), 32 << 20);
    assert_eq!((w.one_shot_bytes, w.line_two_shot_bytes), (2 << 20, 0));
    let w = run_window(8, (Some(256), Some(0)), 8 << 20);
    assert_eq!(
        (w.one_shot_bytes, w.line_two_shot_bytes, w.chunk_bytes),
        (256 << 10, 0, 8 << 20)
    );
}

#[test]
fn the_grid_has_each_collectives_algorithms_on_each_block_count() {
    let ar = grid(Coll::AllReduce, &[8, 64]);
    // one-shot, line two-shot, staged pulled and pushed, zero-copy one- and two-shot.
    assert_eq!(ar.len(), 6 * 2);
    assert!(ar.contains(&Choice {
        pushed: true,
        ..choice(TunedAlgorithm::Staged, 64)
    }));
    assert!(ar.contains(&choice(TunedAlgorithm::LineTwoShot, 8)));
    for coll in [Coll::ReduceScatter, Coll::AllGather] {
        let g = grid(coll, &[8, 16, 32, 64]);
        // one-shot, staged, zero-copy two-shot.
        assert_eq!(g.len(), 3 * 4, "{coll:?}");
        assert!(g.iter().all(|c| !c.pushed
            && c.algorithm != TunedAlgorithm::LineTwoShot
            && c.algorithm != TunedAlgorithm::ZeroCopyOneShot));
    }
}

#[test]
fn the_fastest_wins_and_the_default_keeps_a_tie() {
    let d = choice(TunedAlgorithm::OneShot, 4);
    let a = choice(TunedAlgorithm::OneShot, 32);
    let b = choice(TunedAlgorithm::Staged, 16);
    assert_eq!(fastest(d, 10.0, &[(a, 9.0), (b, 9.5)]), (a, 9.0));
    assert_eq!(fastest(d, 10.0, &[(a, 10.0), (b, 11.0)]), (d, 10.0));
    assert_eq!(fastest(d, 10.0, &[]), (d, 10.0));
    assert_eq!(fastest(d, 10.0, &[(a, 9.0), (b, 9.0)]), (a, 9.0));
}

#[test]
fn appending_keeps_what_this_run_did_not_tune() {
    use devcomm::reduce::Collective;
    let table = |entries: Vec<(Collective, Buffers, u64)>| ReduceTuneTable {
        version: REDUCE_TUNE_VERSION,
        device: "NVIDIA H200".into(),
        world_size: 4,
        date: "2026-12-01".into(),
        dtype: "bf16".into(),
        window: run_window(4, (None, None), 32 << 20),
        entries: entries
            .into_iter()
            .map(|(collective, buffers, max_bytes)| ReduceTuneEntry {
                collective,
                buffers,
                max_bytes,
                algorithm: TunedAlgorithm::Staged,
                blocks: 8,
                pushed: false,
                us: 1.0,
                default_us: 1.0,
                nccl_us: 1.0,
            })
            .collect(),
    };
    let (ar, ag) = (Collective::AllReduce, Collective::AllGather);
    let (o, p) = (Buffers::Ordinary, Buffers::Pool);
    let old = table(vec![(ar, o, 8), (ar, o, 1024), (ag, o, 64), (ar, p, 32)]);
    let new = table(vec![(ar, o, 16), (ar, p, 8), (ar, p, 4096)]);
    let both = append(old.clone(), new).unwrap();
    let keys: Vec<(Collective, Buffers, u64)> = both
        .entries
        .iter()
        .map(|e| (e.collective, e.buffers, e.max_bytes))
        .collect();
    assert_eq!(
        keys,
        vec![(ag, o, 64), (ar, o, 16), (ar, p, 8), (ar, p, 4096)]
    );
    both.check().unwrap();
    // Only a table of the same GPU, world size, window and element type.
    for f in [
        (|t: &mut ReduceTuneTable| t.device = "NVIDIA H100 80GB HBM3".into()) as fn(&mut _),
        |t| t.world_size = 8,
        |t| t.window.one_shot_bytes = 0,
        |t| t.dtype = "f32".into(),
    ] {
        let mut other = table(vec![(ar, o, 16)]);
        f(&mut other);
        assert!(append(old.clone(), other).unwrap_err().contains("--append"));
    }
}

#[test]
fn adjacent_sizes_with_one_choice_merge_into_the_larger() {
    use devcomm::reduce::Collective;
    let e = |c: Collective, b: Buffers, bytes: u64, ch: Choice, us: f64| ReduceTuneEntry {
        collective: c,
        buffers: b,
        max_bytes: bytes,
        algorithm: ch.algorithm,
        blocks: ch.blocks,
        pushed: ch.pushed,
        us,
        default_us: us,
        nccl_us: us,
    };
    let one = choice(TunedAlgorithm::OneShot, 8);
    let staged = choice(TunedAlgorithm::Staged, 64);
    let (ar, rs, o) = (
        Collective::AllReduce,
        Collective::ReduceScatter,
        Buffers::Ordinary,
    );
    let merged = merge(vec![
        e(ar, o, 8, one, 1.0),
        e(ar, o, 16, one, 2.0),
        e(ar, o, 32, staged, 3.0),
        e(ar, o, 64, one, 4.0),
        e(ar, o, 128, one, 5.0),
        // Another collective starts its own entries, the same choice or not.
        e(rs, o, 8, one, 6.0),
        e(rs, o, 16, one, 7.0),
        e(rs, Buffers::Pool, 16, one, 8.0),
    ]);
    let got: Vec<(u64, f64)> = merged.iter().map(|e| (e.max_bytes, e.us)).collect();
    assert_eq!(
        got,
        vec![(16, 2.0), (32, 3.0), (128, 5.0), (16, 7.0), (16, 8.0)]
    );
    assert!(merge(Vec::new()).is_empty());
}
