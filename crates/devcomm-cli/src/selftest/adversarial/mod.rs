//! The `adversarial` group: what a user meets by testing as a user would. A soft error of an
//! earlier call before every kind of call; every overlap layout of every raw call; an
//! all-gather of any element type; a registration dropped on one rank alone; a rank compiling
//! its kernels cold while its peers load theirs from a warm cache, before every kind of kernel.

use super::harness::{verified, Check, Ranks};

mod calls;
mod cold_compile;
mod overlap;
mod soft_errors;

/// The group's checks.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "soft_error_before_every_call",
        ranks: Ranks::AtLeast(2),
        about: "an uncollected all-to-all-v count error on rank 0, then each kind of call \
                (send/recv, all-to-all, all-to-all-v, one- and two-shot all-reduce, \
                reduce-scatter, all-gather, barrier, zero-copy, hooked all-to-all, hooked \
                all-reduce, registered all-to-all): launched and verified on every rank, the \
                error with rank 0's synchronise alone",
        run: |cx, p| verified(soft_errors::soft_error_before_every_call(cx, p.timeout)),
    },
    Check {
        name: "overlap_refused_everywhere",
        ranks: Ranks::AtLeast(2),
        about: "partial overlaps of every raw reduction, hooked reduction, all-to-all, \
                all-to-all-v, send/recv and zero-copy call: refused on every rank before \
                launch; the in-place layouts verified after",
        run: |cx, _| verified(overlap::refused_everywhere(cx)),
    },
    Check {
        name: "overlap_another_ranks_shard",
        ranks: Ranks::AtLeast(2),
        about: "reduce-scatter and all-gather with a buffer at another rank's shard (one shard \
                for all, and each rank its next's): every rank's call fails at once with a call \
                mismatch, nothing written",
        run: |cx, p| verified(overlap::another_ranks_shard(cx, p.timeout)),
    },
    Check {
        name: "all_gather_any_type",
        ranks: Ranks::AtLeast(2),
        about: "all-gathers of u16, u32, i8, [f32; 4], a 16-byte struct and [u8; 3], in and \
                out of place: bitwise",
        run: |cx, _| verified(calls::all_gather_any_type(cx)),
    },
    Check {
        name: "registration_dropped_alone",
        ranks: Ranks::AtLeast(2),
        about: "rank 0 drops a registration alone: its drop returns at once, the peers' \
                collective release counts it, a new registration works",
        run: |cx, _| verified(calls::registration_dropped_alone(cx)),
    },
    Check {
        name: "cold_compile_rank0",
        ranks: Ranks::AtLeast(2),
        about: "rank 0 compiles every kernel (empty cache) while its peers load theirs, short \
                device timeout: the first call of every kind passes",
        run: |cx, p| verified(cold_compile::cold_round(cx, p, "cold_compile_rank0", |r| r == 0)),
    },
    Check {
        name: "cold_compile_peers",
        ranks: Ranks::AtLeast(2),
        about: "every rank but 0 compiles every kernel (empty caches) while rank 0 loads its own",
        run: |cx, p| verified(cold_compile::cold_round(cx, p, "cold_compile_peers", |r| r != 0)),
    },
];
