//! Checks of the collectives: all-to-all, all-to-all-v with device counts, both examples'
//! hooks, back-to-back calls and graph replays, on fresh random data with poisoned outputs,
//! every byte compared with a host reference.
//!
//! `a2a` holds the all-to-all checks and the pieces the others share; `a2av` and `hooked`
//! import it; nothing imports them but this list.

mod a2a;
mod a2av;
mod hooked;

use super::harness::{verified, Check, Ranks};

/// The group's checks, in run order.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "a2a_sizes",
        ranks: Ranks::AtLeast(2),
        about: "all-to-all 1 B to 64 MiB per peer (u8) and f32, guard untouched",
        run: |cx, _| verified(a2a::check_all_to_all(cx)),
    },
    Check {
        name: "a2av_counts",
        ranks: Ranks::AtLeast(2),
        about: "all-to-all-v on random count matrices; counts and offsets returned",
        run: |cx, _| verified(a2av::check_all_to_all_v(cx)),
    },
    Check {
        name: "a2a_examples",
        ranks: Ranks::AtLeast(2),
        about: "the transpose and fp8 examples' hooks",
        run: |cx, _| verified(hooked::check_examples(cx)),
    },
    Check {
        name: "a2a_hooked_p2p",
        ranks: Ranks::AtLeast(2),
        about: "sendrecv_hooked ring and send_hooked/recv_hooked with a hook",
        run: |cx, _| verified(hooked::check_hooked_p2p(cx)),
    },
    Check {
        name: "a2a_mixed_kinds",
        ranks: Ranks::AtLeast(2),
        about: "all-to-all(-v) with peers tuned as network (DEVCOMM_TOPOLOGY_OVERRIDE)",
        run: |cx, _| verified(a2av::check_mixed_kinds(cx)),
    },
    Check {
        name: "a2a_late_loader",
        ranks: Ranks::AtLeast(2),
        about: "one rank loads a hooked kernel after the device wait bound",
        run: |cx, _| verified(hooked::check_late_loader(cx)),
    },
    Check {
        name: "a2av_back_to_back",
        ranks: Ranks::AtLeast(2),
        about: "--coll-calls all-to-all-v calls interleaved with all-to-alls",
        run: |cx, p| verified(a2av::check_back_to_back(cx, p.coll_calls)),
    },
    Check {
        name: "a2av_graph",
        ranks: Ranks::AtLeast(2),
        about: "--replays replays of a captured all-to-all-v, counts changed between",
        run: |cx, p| verified(a2av::check_graph(cx, p.replays)),
    },
    Check {
        name: "a2av_overflow",
        ranks: Ranks::AtLeast(2),
        about: "counts beyond a buffer: CountOverflow, nothing written, next calls work",
        run: |cx, _| verified(a2av::check_overflow(cx)),
    },
];
