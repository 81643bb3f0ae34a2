//! The pure decisions of the network send/recv route.
use super::*;

#[test]
fn messages_are_cut_into_whole_slots() {
    assert_eq!(chunks(0, 1024), 0);
    assert_eq!(chunks(1, 1024), 1);
    assert_eq!(chunks(1024, 1024), 1);
    assert_eq!(chunks(1025, 1024), 2);
    assert_eq!(chunks(64 << 20, 1 << 20), 64);
}

#[test]
fn staging_offsets_are_disjoint_and_inside() {
    let l = StagingLayout::new(4, 3, 4096).unwrap();
    assert_eq!(l.words_bytes(), 4096);
    assert_eq!(l.slot_stride(), 4096 + 64);
    let total = l.total().unwrap();
    assert_eq!(total, 4096 + 2 * 4 * 3 * (4096 + 64));
    // Every slot (outbox and inbox of every peer) starts after the previous one ends.
    let mut starts: Vec<u64> = (0..4)
        .flat_map(|p| (0..3).flat_map(move |s| [l.outbox(p, s), l.inbox(p, s)]))
        .collect();
    starts.sort_unstable();
    assert_eq!(starts[0], l.words_bytes());
    for w in starts.windows(2) {
        assert_eq!(w[1] - w[0], l.slot_stride());
    }
    assert_eq!(starts.last().unwrap() + l.slot_stride(), total);
    // The signal words of every rank fit before the slots, each written by one peer.
    assert_eq!(StagingLayout::ready_word(3), 6);
    assert_eq!(StagingLayout::free_word(3), 7);
    assert!(8 * (StagingLayout::free_word(3) + 1) <= l.words_bytes());
}

#[test]
fn staging_shapes_are_checked() {
    assert!(StagingLayout::new(2, 4, 100).is_err());
    assert!(StagingLayout::new(2, 1, 4096).is_err());
    assert!(StagingLayout::new(2, 4, 0).is_err());
    let e = StagingLayout::new(1 << 16, 64, 16 << 20)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("16 GiB") && e.contains("DEVCOMM_NET_SLOT_KIB"),
        "{e}"
    );
}

#[test]
fn refusals_carry_the_field_and_value() {
    let w = refusal(2, 4096);
    assert_eq!(refused(w), Some((2, 4096)));
    assert_eq!(refused(5), None);
    assert_eq!(refused(refusal(5, u64::MAX)), Some((5, (1 << 56) - 1)));
    // A refusal satisfies every credit wait (>=), so a waiting sender sees it at once.
    assert!(w > u64::MAX / 2);
}
