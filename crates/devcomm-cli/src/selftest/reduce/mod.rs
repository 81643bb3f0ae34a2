//! Checks of the reductions (all-reduce, reduce-scatter, all-gather): every type x operation
//! in and out of place around every algorithm switch and up to 256 MiB, bit for bit against a
//! host reduction in rank order and across ranks, the argument errors, the RMSNorm and
//! RMSNorm + FP8 examples, graph replays, back-to-back calls mixed with send/recv and
//! all-to-all, and calls across the wrap of the call agreement's numbers (`wrap`).
//!
//! `reference` is the host side (data and the reduction in rank order); `cases`, `hooked` and
//! `stress` import it; nothing imports them but this list.

mod cases;
mod hooked;
mod pool_adopted;
mod pool_cases;
mod reference;
mod stress;
mod wrap;

use super::harness::{verified, Check, Ranks};

/// The group's checks, in run order.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "reduce_sizes",
        ranks: Ranks::AtLeast(2),
        about: "7 types x ops, in/out of place, 0 to past each algorithm switch, bitwise",
        run: |cx, _| verified(cases::check_sizes(cx)),
    },
    Check {
        name: "reduce_large",
        ranks: Ranks::AtLeast(2),
        about: "256 MiB (64 MiB on 3+ ranks) calls; prefixes equal the large call",
        run: |cx, _| verified(cases::check_large(cx)),
    },
    Check {
        name: "reduce_args",
        ranks: Ranks::AtLeast(2),
        about: "bad lengths, overlap, alignment, hooks: InvalidArgument, then a call works",
        run: |cx, _| verified(cases::check_args(cx)),
    },
    Check {
        name: "reduce_rmsnorm",
        ranks: Ranks::AtLeast(2),
        about: "all-reduce + residual + RMSNorm example, 128 and 512 lanes a row, bitwise",
        run: |cx, _| verified(cases::check_rmsnorm(cx)),
    },
    Check {
        name: "reduce_rmsnorm_fp8",
        ranks: Ranks::AtLeast(2),
        about: "all-reduce + RMSNorm + e4m3 example, ordinary and pool, 128/512/32 lanes, bitwise",
        run: |cx, _| verified(hooked::check_rmsnorm_fp8(cx)),
    },
    Check {
        name: "reduce_accumulate",
        ranks: Ranks::AtLeast(2),
        about: "reduce-scatter with an accumulate epilogue, in/out of place, bitwise",
        run: |cx, _| verified(hooked::check_accumulate(cx)),
    },
    Check {
        name: "reduce_pool",
        ranks: Ranks::AtLeast(2),
        about: "zero-copy on pool buffers, every arrangement, bitwise = reference = ordinary",
        run: |cx, _| verified(pool_cases::check_pool(cx)),
    },
    Check {
        name: "reduce_pool_adopted",
        ranks: Ranks::AtLeast(2),
        about: "caller's memory adopted into the pool: zero-copy bitwise, refusals, release",
        run: |cx, _| verified(pool_adopted::check_pool_adopted(cx)),
    },
    Check {
        name: "reduce_pool_prefixes",
        ranks: Ranks::AtLeast(2),
        about: "batch invariance across zero-copy and staged: every prefix equals the whole's",
        run: |cx, _| verified(pool_cases::check_pool_prefixes(cx)),
    },
    Check {
        name: "reduce_pool_hooked",
        ranks: Ranks::AtLeast(2),
        about: "an epilogue on pool buffers (one-shot, two-shot, in place) = ordinary buffers",
        run: |cx, _| verified(pool_cases::check_pool_hooked(cx)),
    },
    Check {
        name: "reduce_pool_graph",
        ranks: Ranks::AtLeast(2),
        about: "--replays (at most 100) replays of a graph of zero-copy calls on pool slices, verified",
        run: |cx, p| verified(pool_cases::check_pool_graph(cx, p.replays)),
    },
    Check {
        name: "reduce_pool_asymmetric",
        ranks: Ranks::AtLeast(2),
        about: "pool buffers at different offsets: refused on every rank, nothing written",
        run: |cx, _| pool_cases::check_pool_asymmetric(cx),
    },
    Check {
        name: "reduce_graph",
        ranks: Ranks::AtLeast(2),
        about: "--replays replays of a graph of 4 reductions, fresh data, each verified",
        run: |cx, p| verified(stress::check_graph(cx, p.replays)),
    },
    Check {
        name: "reduce_back_to_back",
        ranks: Ranks::AtLeast(2),
        about: "--calls calls mixing the reductions with send/recv and all-to-all",
        run: |cx, p| verified(stress::check_back_to_back(cx, p.calls)),
    },
    Check {
        name: "reduce_call_wrap",
        ranks: Ranks::AtLeast(2),
        about: "calls 65,536 and 131,072 on blocks new or idle since: no stale agreement, verified",
        run: |cx, _| wrap::check_call_wrap(cx),
    },
];
