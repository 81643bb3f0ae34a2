//! Checks that `cuda/devcomm/net.cuh`, compiled by the host C++ compiler, lays out the network
//! queue structs exactly as Rust does (`devcomm::net::descriptor::LAYOUT`). Needs `c++` (or `$CXX`).

#[path = "common/cxx.rs"]
#[allow(dead_code)] // run_ok: this test reads the probe's output itself
mod cxx;

use cxx::{compile_cpp, scratch_dir};
use std::fmt::Write as _;
use std::process::Command;

use devcomm::net::descriptor::LAYOUT as QUEUE_LAYOUT;
use devcomm::net::route::LAYOUT as ROUTE_LAYOUT;

#[test]
fn net_cuh_layout_equals_rust_layout() {
    let layout: Vec<_> = QUEUE_LAYOUT.iter().chain(ROUTE_LAYOUT).collect();
    let mut src = String::from(
        "#include <cstddef>\n#include <cstdio>\n#include \"devcomm/net.cuh\"\n\
         #include \"devcomm/net_p2p.cuh\"\n\nint main() {\n",
    );
    for (strukt, field, _, _) in &layout {
        writeln!(
            src,
            "  std::printf(\"%s %s %zu %zu\\n\", \"{strukt}\", \"{field}\", \
             offsetof(devcomm::{strukt}, {field}), sizeof(devcomm::{strukt}));"
        )
        .unwrap();
    }
    src.push_str("  return 0;\n}\n");
    let dir = scratch_dir("net-layout");
    let Some(binary) = compile_cpp(
        &dir,
        "net_layout_probe",
        &src,
        &["-Wall", "-Wextra", "-Werror"],
    ) else {
        return;
    };
    let output = Command::new(&binary).output().unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let cpp: Vec<&str> = stdout.lines().collect();
    assert_eq!(cpp.len(), layout.len(), "C++ printed:\n{stdout}");
    for (line, (strukt, field, offset, size)) in cpp.iter().zip(&layout) {
        assert_eq!(
            *line,
            format!("{strukt} {field} {offset} {size}"),
            "C++ and Rust disagree (left: C++, right: Rust)"
        );
    }
    for strukt in [
        "NetDescriptor",
        "NetQueueHeader",
        "NetQueues",
        "NetChunkHeader",
        "NetP2PLaunch",
    ] {
        assert!(
            layout.iter().any(|(s, ..)| *s == strukt),
            "{strukt} missing"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
