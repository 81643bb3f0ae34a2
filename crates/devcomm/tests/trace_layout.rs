//! Checks that `cuda/devcomm/trace.cuh`, compiled by the host C++ compiler, lays out the trace
//! ring's header and records exactly as Rust does (`devcomm::trace::ring::LAYOUT`), and that
//! the event kinds' numbers agree. Needs `c++` (or `$CXX`) on PATH.

#[path = "common/cxx.rs"]
mod cxx;

use cxx::{assert_layout, compile_cpp, run_ok, scratch_dir};
use devcomm::trace::ring::{Kind, LAYOUT, PHASES};

#[test]
fn cpp_trace_layout_equals_rust_layout() {
    assert_layout("trace_layout", &["devcomm/trace.cuh"], LAYOUT);
}

#[test]
fn kinds_and_phases_have_the_same_numbers() {
    let kinds = [
        ("kTraceKernelBegin", Kind::KernelBegin),
        ("kTraceKernelEnd", Kind::KernelEnd),
        ("kTracePhaseBegin", Kind::PhaseBegin),
        ("kTracePhaseEnd", Kind::PhaseEnd),
        ("kTraceWaitBegin", Kind::WaitBegin),
        ("kTraceWaitEnd", Kind::WaitEnd),
        ("kTraceBytes", Kind::Bytes),
    ];
    let phases = [
        "kPhaseNone",
        "kPhaseStage",
        "kPhaseWait",
        "kPhaseReduce",
        "kPhaseWriteOut",
        "kPhaseSend",
        "kPhaseRecv",
        "kPhaseAgree",
    ];
    assert_eq!(
        phases.len(),
        PHASES.len(),
        "a phase without a name in ring::PHASES"
    );
    let mut src = String::from(
        "#include <cstdio>\n#include \"devcomm/trace.cuh\"\nint main() {\n  int bad = 0;\n",
    );
    for (name, kind) in kinds {
        assert_eq!(Kind::from_u16(kind as u16), Some(kind));
        src += &format!(
            "  if (devcomm::{name} != {}) {{ std::printf(\"{name}\\n\"); bad = 1; }}\n",
            kind as u16
        );
    }
    for (n, name) in phases.iter().enumerate() {
        src +=
            &format!("  if (devcomm::{name} != {n}) {{ std::printf(\"{name}\\n\"); bad = 1; }}\n");
    }
    src += "  if (!bad) std::printf(\"OK\\n\");\n  return bad;\n}\n";
    let dir = scratch_dir("trace_kinds");
    if let Some(binary) = compile_cpp(&dir, "trace_kinds", &src, &["-Wall", "-Werror"]) {
        run_ok(&binary);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
