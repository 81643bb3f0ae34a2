//! The pure decisions of the network send/recv route.
use super::*;

fn role(peer: usize, bytes: u64, kind: LinkKind) -> Option<RoleView> {
    Some(RoleView {
        peer,
        bytes,
        kind: Some(kind),
    })
}

#[test]
fn the_route_follows_the_peers_link_kinds() {
    use LinkKind::{Net, Nvl, Shm};
    assert_eq!(
        choose(0, role(1, 8, Nvl), role(1, 8, Nvl)).unwrap(),
        P2PRoute::Nvlink
    );
    assert_eq!(choose(0, role(1, 8, Net), None).unwrap(), P2PRoute::Network);
    assert_eq!(choose(0, None, role(2, 8, Net)).unwrap(), P2PRoute::Network);
    assert_eq!(
        choose(0, role(1, 8, Net), role(2, 8, Net)).unwrap(),
        P2PRoute::Network
    );
    // Nothing to move with the network peer: the NVLink role alone decides.
    assert_eq!(
        choose(0, role(1, 0, Net), role(2, 8, Nvl)).unwrap(),
        P2PRoute::Nvlink
    );
    assert_eq!(choose(0, None, None).unwrap(), P2PRoute::Nvlink);
    // A shared-memory peer stays with the NVLink path, which refuses it (NoPath).
    assert_eq!(choose(0, role(1, 8, Shm), None).unwrap(), P2PRoute::Nvlink);
    // Two roles on two routes: split, each on its own.
    assert_eq!(
        choose(3, role(1, 8, Nvl), role(2, 8, Net)).unwrap(),
        P2PRoute::Split {
            send_by_network: false
        }
    );
    assert_eq!(
        choose(3, role(2, 8, Net), role(1, 8, Nvl)).unwrap(),
        P2PRoute::Split {
            send_by_network: true
        }
    );
    // A peer that is not a rank (kind unknown) beside a network peer is named as such.
    let bad = Some(RoleView {
        peer: 9,
        bytes: 8,
        kind: None,
    });
    let e = choose(0, bad, role(1, 8, Net)).unwrap_err().to_string();
    assert!(e.contains("peer 9 is not another rank"), "{e}");
    // Alone, it is left to the NVLink path's own check.
    assert_eq!(choose(0, bad, None).unwrap(), P2PRoute::Nvlink);
}

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
