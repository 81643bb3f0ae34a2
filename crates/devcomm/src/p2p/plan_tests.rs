//! Every route of [`plan`] and every size boundary, one byte below and above.

use super::*;
use crate::p2p::defaults::{ce_config, staged_config};
use crate::p2p::defaults::{CE_DEFAULT_MIN, LL128_DEFAULT_MAX, PULL_MIN_BYTES};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn t(bytes: u64, peer: usize) -> Transfer {
    Transfer {
        ptr: 0x1000,
        bytes,
        peer,
        config: None,
    }
}

fn with(bytes: u64, peer: usize, config: P2PConfig) -> Transfer {
    Transfer {
        config: Some(config),
        ..t(bytes, peer)
    }
}

fn run(send: Option<Transfer>, recv: Option<Transfer>, sw: Switches) -> Result<Plan> {
    let limits = P2PLimits::default();
    let inputs = PlanInputs {
        limits: &limits,
        tune: None,
        switches: sw,
    };
    plan(send, recv, &inputs, |_, _| Ok(()))
}

fn one_way(bytes: u64) -> Plan {
    run(Some(t(bytes, 1)), None, Switches::default()).unwrap()
}

fn protocol(p: &Plan, i: usize) -> Protocol {
    p.sm[i].or(p.ce[i]).unwrap().config.protocol
}

#[test]
fn low_latency_up_to_128_kib_then_ll128() {
    let p = one_way(128 * KIB);
    assert_eq!(protocol(&p, 0), Protocol::LowLatency);
    assert_eq!(p.sm_kernel.unwrap().kernel, KernelKey::Fused(256, 0));
    assert_eq!(p.sm_kernel.unwrap().blocks, 32);
    let p = one_way(128 * KIB + 1);
    assert_eq!(protocol(&p, 0), Protocol::LowLatency128);
    assert_eq!(p.sm_kernel.unwrap().kernel, KernelKey::Fused(512, 0));
    assert_eq!(one_way(1).sm_kernel.unwrap().blocks, 1);
}

#[test]
fn ll128_up_to_its_default_max_then_staged() {
    assert_eq!(
        protocol(&one_way(LL128_DEFAULT_MAX), 0),
        Protocol::LowLatency128
    );
    assert_eq!(protocol(&one_way(LL128_DEFAULT_MAX + 1), 0), Protocol::Bulk);
    let off = Switches {
        ll128: false,
        ..Switches::default()
    };
    let p = run(Some(t(128 * KIB + 1, 1)), None, off).unwrap();
    assert_eq!(protocol(&p, 0), Protocol::Bulk);
}

#[test]
fn staged_threads_grow_above_4_mib() {
    let threads = |bytes| one_way(bytes).sm_kernel.unwrap().kernel;
    assert_eq!(threads(4 * MIB + 1), KernelKey::Fused(512, 0));
    let bulk = P2PConfig {
        protocol: Protocol::Bulk,
        ..staged_config(4 * MIB, &P2PLimits::default())
    };
    let p = run(Some(with(4 * MIB, 1, bulk)), None, Switches::default()).unwrap();
    assert_eq!(p.sm_kernel.unwrap().kernel, KernelKey::Fused(256, 0));
}

#[test]
fn one_way_bulk_pulls_from_the_threshold_both_ways_pushes() {
    let bulk = staged_config(PULL_MIN_BYTES, &P2PLimits::default());
    let sw = Switches::default();
    let below = run(Some(with(PULL_MIN_BYTES - 1, 1, bulk)), None, sw).unwrap();
    assert_eq!(below.sm[0].unwrap().flags, 0);
    let at = run(Some(with(PULL_MIN_BYTES, 1, bulk)), None, sw).unwrap();
    assert_eq!(at.sm[0].unwrap().flags, P2P_SIDE_PULL);
    let both = run(
        Some(with(PULL_MIN_BYTES, 1, bulk)),
        Some(with(PULL_MIN_BYTES, 1, bulk)),
        sw,
    )
    .unwrap();
    assert_eq!(both.sm[0].unwrap().flags, 0);
    // The receiver never pulls by its own flag: it follows the sender's chunks.
    assert_eq!(both.sm[1].unwrap().flags, 0);
    // A ring: the peer it receives from is another one, so the link carries one way.
    let ring = run(
        Some(with(PULL_MIN_BYTES, 1, bulk)),
        Some(with(PULL_MIN_BYTES, 2, bulk)),
        sw,
    )
    .unwrap();
    assert_eq!(ring.sm[0].unwrap().flags, P2P_SIDE_PULL);
}

#[test]
fn forced_pull_or_push_overrides_the_size() {
    let bulk = staged_config(MIB, &P2PLimits::default());
    for (force, flags) in [(Some(true), P2P_SIDE_PULL), (Some(false), 0)] {
        let sw = Switches {
            pull: force,
            ..Switches::default()
        };
        let small = run(Some(with(64 * KIB, 1, bulk)), None, sw).unwrap();
        assert_eq!(small.sm[0].unwrap().flags, flags);
        let large = run(Some(with(64 * MIB, 1, bulk)), None, sw).unwrap();
        assert_eq!(large.sm[0].unwrap().flags, flags);
    }
    let push = P2PConfig {
        protocol: Protocol::Push,
        ..bulk
    };
    let pull = P2PConfig {
        protocol: Protocol::Pull,
        ..bulk
    };
    let sw = Switches::default();
    let p = run(Some(with(64 * MIB, 1, push)), None, sw).unwrap();
    assert_eq!(p.sm[0].unwrap().flags, 0);
    let p = run(Some(with(KIB, 1, pull)), Some(with(KIB, 1, pull)), sw).unwrap();
    assert_eq!([p.sm[0].unwrap().flags, p.sm[1].unwrap().flags], [1, 0]);
}

#[test]
fn copy_engine_alone_from_its_default_min_announces() {
    let below = one_way(CE_DEFAULT_MIN - 1);
    assert_eq!(protocol(&below, 0), Protocol::Bulk);
    assert!(below.ce_send.is_none());
    let at = one_way(CE_DEFAULT_MIN);
    assert_eq!(at.ce[0].unwrap().flags, P2P_SIDE_ANNOUNCE);
    assert!(at.sm_kernel.is_none());
    assert!(at.pushes_by_copy_engine());
    let g = at.ce_send.unwrap();
    assert_eq!(
        (g.kernel, g.blocks, g.threads),
        (KernelKey::CeSend, 16, 512)
    );
    let recv = run(None, Some(t(CE_DEFAULT_MIN, 1)), Switches::default()).unwrap();
    let g = recv.ce_recv.unwrap();
    assert_eq!(
        (g.kernel, g.blocks, g.threads),
        (KernelKey::CeRecv(512), 16, 512)
    );
    assert!(recv.pulls_by_copy_engine());
    let off = Switches {
        ce: false,
        ..Switches::default()
    };
    let p = run(Some(t(CE_DEFAULT_MIN, 1)), None, off).unwrap();
    assert_eq!(protocol(&p, 0), Protocol::Bulk);
}

#[test]
fn large_messages_with_two_roles_are_negotiated() {
    let p = run(
        Some(t(CE_DEFAULT_MIN, 1)),
        Some(t(CE_DEFAULT_MIN, 2)),
        Switches::default(),
    )
    .unwrap();
    for i in 0..2 {
        assert_eq!(p.sm[i].unwrap().flags & P2P_SIDE_GATED, P2P_SIDE_GATED);
        assert_eq!(p.sm[i].unwrap().config.protocol, Protocol::Bulk);
        assert_eq!(
            p.negotiated[i].unwrap().flags,
            P2P_SIDE_GATED | P2P_SIDE_PULL
        );
        assert!(p.ce[i].is_none());
    }
    let g = p.sm_kernel.unwrap();
    // Each role: max(32 staged blocks, 15 copy-engine blocks + a pacing block).
    assert_eq!(
        (g.kernel, g.blocks, g.threads),
        (KernelKey::Negotiated(true), 64, 512)
    );
    assert!(p.ce_send.is_none() && p.ce_recv.is_none());
    // One negotiated role beside a small one: the small one rides in the same kernel.
    let p = run(
        Some(t(CE_DEFAULT_MIN, 1)),
        Some(t(KIB, 1)),
        Switches {
            interleave: false,
            ..Switches::default()
        },
    )
    .unwrap();
    assert_eq!(p.sm_kernel.unwrap().kernel, KernelKey::Negotiated(false));
    assert_eq!(p.sm_kernel.unwrap().blocks, 32 + 1);
    assert_eq!(p.sm_threads, [512, 256]);
}

#[test]
fn explicit_copy_engine_both_ways_follows_ce_both() {
    let ce = ce_config(0, &P2PLimits::default());
    let both = |sw| {
        run(
            Some(with(CE_DEFAULT_MIN, 1, ce)),
            Some(with(CE_DEFAULT_MIN, 1, ce)),
            sw,
        )
        .unwrap()
    };
    // Default sm-ce: SMs push, the receiver's copy engine pulls; never negotiated.
    let p = both(Switches::default());
    assert_eq!([p.ce[0].unwrap().flags, p.ce[1].unwrap().flags], [1, 0]);
    assert!(!p.pushes_by_copy_engine() && p.pulls_by_copy_engine());
    let p = both(Switches {
        ce_both: [false, true],
        ..Switches::default()
    });
    assert!(p.pushes_by_copy_engine() && !p.pulls_by_copy_engine());
    // One way: the copy engine both halves, whatever ce_both says.
    let sw = Switches {
        ce_both: [true, true],
        ..Switches::default()
    };
    let p = run(Some(with(CE_DEFAULT_MIN, 1, ce)), None, sw).unwrap();
    assert_eq!(p.ce[0].unwrap().flags, 0);
    // A ring (other peers each way) counts as one way.
    let p = run(
        Some(with(CE_DEFAULT_MIN, 1, ce)),
        Some(with(CE_DEFAULT_MIN, 2, ce)),
        sw,
    )
    .unwrap();
    assert_eq!([p.ce[0].unwrap().flags, p.ce[1].unwrap().flags], [0, 0]);
}

#[test]
fn two_sm_roles_split_when_threads_match_else_fuse() {
    let sw = Switches::default();
    let p = run(Some(t(64 * KIB, 1)), Some(t(64 * KIB, 1)), sw).unwrap();
    let g = p.sm_kernel.unwrap();
    assert_eq!(
        (g.kernel, g.blocks, g.threads),
        (KernelKey::Split(256, true), 64, 256)
    );
    let fused = Switches { split: false, ..sw };
    let p = run(Some(t(64 * KIB, 1)), Some(t(KIB, 1)), fused).unwrap();
    let g = p.sm_kernel.unwrap();
    assert_eq!(
        (g.kernel, g.blocks, g.threads),
        (KernelKey::Fused(256, 256), 32, 512)
    );
    // LL send (256 threads) beside an LL128 receive (512): fused.
    let p = run(Some(t(64 * KIB, 1)), Some(t(MIB, 1)), sw).unwrap();
    assert_eq!(p.sm_kernel.unwrap().kernel, KernelKey::Fused(256, 512));
    let p = run(None, Some(t(64 * KIB, 1)), sw).unwrap();
    assert_eq!(p.sm_kernel.unwrap().kernel, KernelKey::Fused(0, 256));
}

#[test]
fn empty_calls_plan_nothing() {
    let sw = Switches::default();
    assert!(run(None, None, sw).unwrap().is_empty());
    let p = run(Some(t(0, 1)), Some(t(0, 1)), sw).unwrap();
    assert_eq!(p, Plan::default());
    assert_eq!(one_way(1).peers(), [1, -1]);
}

#[test]
fn refusals_name_the_peer_and_come_in_role_order() {
    let limits = P2PLimits::default();
    let ll = P2PConfig {
        protocol: Protocol::LowLatency,
        blocks: 1,
        threads: 256,
        chunk_bytes: 0,
    };
    let err = run(
        Some(with(limits.ll_max_bytes + 1, 3, ll)),
        None,
        Switches::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::CapacityExceeded { peer: 3, .. }),
        "{err}"
    );
    let inputs = PlanInputs {
        limits: &limits,
        tune: None,
        switches: Switches::default(),
    };
    let seen = std::cell::RefCell::new(Vec::new());
    let err = plan(Some(t(KIB, 1)), Some(t(KIB, 2)), &inputs, |op, peer| {
        seen.borrow_mut().push((op, peer));
        if peer == 2 {
            return Err(Error::InvalidArgument {
                op,
                reason: "no".into(),
            });
        }
        Ok(())
    })
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "recv", .. }));
    assert_eq!(*seen.borrow(), [("send", 1), ("recv", 2)]);
}

#[test]
fn a_tuned_size_takes_the_table_and_sizes_above_it_the_defaults() {
    let limits = P2PLimits::default();
    let table = crate::p2p::tune::tests::table(&limits);
    let inputs = PlanInputs {
        limits: &limits,
        tune: Some(&table),
        switches: Switches::default(),
    };
    let run = |bytes| plan(Some(t(bytes, 1)), Some(t(bytes, 1)), &inputs, |_, _| Ok(())).unwrap();
    // The table's buckets end at 4 KiB, 1 MiB and 64 MiB.
    for bytes in [KIB, 4 * KIB + 1, MIB, 64 * MIB] {
        let p = run(bytes);
        assert_eq!(p.sm[0].unwrap().config, table.config_for(bytes).unwrap());
    }
    assert_eq!(run(4 * KIB).sm[0].unwrap().config.blocks, 4);
    // Above the table: the built-in defaults, negotiated as without a table.
    let p = run(CE_DEFAULT_MIN);
    assert!(p.negotiated.iter().all(Option::is_some));
}
