//! Checks of send/recv, a ring all-gather of sendrecv calls among them: fresh random data,
//! poisoned outputs, every byte compared with the sender's data regenerated on the host.
//!
//! `exchange` holds the exchanges the checks are made of; `basic` and `protocols` the checks
//! (both import `exchange`, nothing imports them but this list).

mod basic;
mod exchange;
pub(crate) use exchange::replay_graph_with;
mod protocols;

use super::harness::{verified, Check, Ranks};

/// The group's checks, in run order.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "sendrecv_guard",
        ranks: Ranks::AtLeast(2),
        about: "bad calls refused before launch, destination untouched",
        run: |cx, _| verified(basic::check_guard(cx)),
    },
    Check {
        name: "sendrecv_sizes",
        ranks: Ranks::Pairs,
        about: "1 B to 1 GiB, odd sizes and alignments, one way and both ways",
        run: |cx, _| verified(basic::check_sizes(cx)),
    },
    Check {
        name: "sendrecv_types",
        ranks: Ranks::Pairs,
        about: "the typed API on seven element types",
        run: |cx, _| verified(basic::check_types(cx)),
    },
    Check {
        name: "sendrecv_ring",
        ranks: Ranks::AtLeast(3),
        about: "send to rank + 1, receive from rank - 1",
        run: |cx, _| verified(basic::check_ring(cx)),
    },
    Check {
        name: "sendrecv_back_to_back",
        ranks: Ranks::Pairs,
        about: "--calls back-to-back calls of mixed sizes, every one verified",
        run: |cx, p| verified(basic::check_back_to_back(cx, p.calls)),
    },
    Check {
        name: "sendrecv_pull",
        ranks: Ranks::Pairs,
        about: "the pull protocol, alone and mixed with push and low-latency",
        run: |cx, p| verified(protocols::check_pull(cx, p.calls)),
    },
    Check {
        name: "sendrecv_ll128",
        ranks: Ranks::Pairs,
        about: "LL128 at every line shape, alone and mixed with LL and staged",
        run: |cx, p| verified(protocols::check_ll128(cx, p.calls)),
    },
    Check {
        name: "sendrecv_copy_engine",
        ranks: Ranks::Pairs,
        about: "the copy-engine protocol, mixed launches, graph replays",
        run: |cx, p| verified(protocols::check_copy_engine(cx, p.calls)),
    },
    Check {
        name: "sendrecv_negotiated",
        ranks: Ranks::Pairs,
        about: "large messages on the defaults, the layout negotiated per launch",
        run: |cx, _| verified(basic::check_negotiated(cx)),
    },
    Check {
        name: "sendrecv_graph",
        ranks: Ranks::Pairs,
        about: "--replays replays of a captured sendrecv",
        run: |cx, p| verified(basic::check_graph(cx, p.replays)),
    },
    Check {
        name: "sendrecv_ring_gather",
        ranks: Ranks::AtLeast(2),
        about: "a ring all-gather of sendrecv calls at three sizes",
        run: |cx, _| verified(basic::check_ring_gather(cx)),
    },
];
