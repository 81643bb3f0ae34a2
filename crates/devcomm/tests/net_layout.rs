//! Checks that `cuda/devcomm/net.cuh`, `net_p2p.cuh` and `window_net.cuh`, compiled by the host
//! C++ compiler, lay out the network structs exactly as Rust does
//! (`devcomm::abi::net::LAYOUT`, `devcomm::testing::net::route::LAYOUT`). Needs `c++` (or `$CXX`).

#[path = "common/cxx.rs"]
#[allow(dead_code)] // run_ok: this test reads the probes' output itself
mod cxx;

use cxx::{assert_layout, compile_cpp, scratch_dir};
use std::fmt::Write as _;
use std::process::Command;

use devcomm::abi::net::LAYOUT as QUEUE_LAYOUT;
use devcomm::testing::net::route::LAYOUT as ROUTE_LAYOUT;

#[test]
fn net_cuh_layout_equals_rust_layout() {
    let layout: Vec<_> = QUEUE_LAYOUT.iter().chain(ROUTE_LAYOUT).copied().collect();
    for strukt in [
        "NetDescriptor",
        "NetQueueHeader",
        "NetQueues",
        "NetChunkHeader",
        "NetP2PLaunch",
        "WindowNet",
    ] {
        assert!(
            layout.iter().any(|(s, ..)| *s == strukt),
            "{strukt} missing"
        );
    }
    assert_layout(
        "net-layout",
        &[
            "devcomm/net.cuh",
            "devcomm/net_p2p.cuh",
            "devcomm/window_net.cuh",
        ],
        &layout,
    );
}

/// The staging offsets of `net_p2p.cuh` (`net_outbox`, `net_inbox`, `net_words_bytes`, host and
/// device functions) equal `StagingLayout`'s for a few shapes: sender and receiver of a chunk
/// compute them on different sides of the FFI.
#[test]
fn net_p2p_offsets_equal_rust_staging_layout() {
    use devcomm::testing::net::route::StagingLayout;
    let shapes = [
        (2usize, 4u32, 1u64 << 20),
        (3, 2, 4096),
        (4, 8, 64),
        (300, 3, 65536),
    ];
    let mut src = String::from(
        "#include <cstdio>\n#include \"devcomm/net_p2p.cuh\"\nusing namespace devcomm;\n\
         int main() {\n  NetP2PLaunch a{};\n",
    );
    let mut expect = String::new();
    for (world, slots, slot_bytes) in shapes {
        let l = StagingLayout::new(world, slots, slot_bytes).unwrap();
        writeln!(
            src,
            "  a.q.world_size = {world}; a.slots = {slots}; a.slot_bytes = {slot_bytes}ull;\n  \
             std::printf(\"%llu\\n\", (unsigned long long)net_words_bytes(a));"
        )
        .unwrap();
        writeln!(expect, "{}", l.words_bytes()).unwrap();
        for peer in [0, world - 1] {
            for slot in [0, u64::from(slots) - 1] {
                writeln!(
                    src,
                    "  std::printf(\"%llu %llu\\n\", (unsigned long long)net_outbox(a, {peer}, \
                     {slot}), (unsigned long long)net_inbox(a, {peer}, {slot}));"
                )
                .unwrap();
                writeln!(expect, "{} {}", l.outbox(peer, slot), l.inbox(peer, slot)).unwrap();
            }
        }
    }
    src.push_str("  return 0;\n}\n");
    let dir = scratch_dir("net-p2p-offsets");
    let Some(binary) = compile_cpp(
        &dir,
        "net_p2p_offsets",
        &src,
        &["-Wall", "-Wextra", "-Werror"],
    ) else {
        return;
    };
    let output = Command::new(&binary).output().unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        expect,
        "C++ (left) and Rust (right)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
