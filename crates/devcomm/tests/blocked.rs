//! The blocked wire order of `cuda/devcomm/hooks.cuh` on the CPU, compiled by the host C++
//! compiler (`c++` or `$CXX`; without one the tests print SKIPPED and pass, unless
//! `DEVCOMM_REQUIRE_CXX` is set):
//!
//! - `cxx/blocked_map.cpp` (plain host C++): position -> (row, col) is a bijection onto the
//!   chunk for many shapes, equals the order's forward formula, `blocked_position` inverts it,
//!   `BlockedCursor::next` steps through it, the 64-bit path agrees; whole-block f32 tiles touch
//!   whole sectors per warp.
//! - `cxx/blocked_hooks.cpp` (the device helpers with CUDA keywords stubbed out): the transpose
//!   example's hooks and `gather_blocked` / `scatter_blocked` over every element size move
//!   chunks exactly, touch nothing outside them, and take one 16-byte access per tile where
//!   they should.

#[allow(dead_code)] // assert_layout: the layout tests' only
#[path = "common/cxx.rs"]
mod cxx;

use cxx::{compile_cpp, run_ok, scratch_dir};

#[test]
fn blocked_order_is_a_bijection_onto_the_chunk() {
    let dir = scratch_dir("blocked-map");
    let Some(binary) = compile_cpp(
        &dir,
        "blocked_map",
        &[
            include_str!("cxx/check.hpp"),
            "#line 1 \"blocked_map.cpp\"\n",
            include_str!("cxx/blocked_map.cpp"),
        ]
        .concat(),
        &["-O2", "-Wall", "-Wextra", "-Werror"],
    ) else {
        return;
    };
    run_ok(&binary);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn blocked_hooks_move_chunks_exactly() {
    let dir = scratch_dir("blocked-hooks");
    let source = [
        include_str!("cxx/check.hpp"),
        "#line 1 \"blocked_hooks.cpp\"\n",
        include_str!("cxx/blocked_hooks.cpp"),
        "#line 1 \"examples/hooks/transpose.cu\"\n",
        include_str!("../examples/hooks/transpose.cu"),
        "#line 1 \"blocked_hooks_tests.cpp\"\n",
        include_str!("cxx/blocked_hooks_tests.cpp"),
    ]
    .concat();
    let Some(binary) = compile_cpp(
        &dir,
        "blocked_hooks",
        &source,
        // `#pragma unroll` is nvcc's; -fno-strict-aliasing for the 16-byte accesses.
        &[
            "-O2",
            "-fno-strict-aliasing",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-unknown-pragmas",
        ],
    ) else {
        return;
    };
    run_ok(&binary);
    std::fs::remove_dir_all(&dir).unwrap();
}
