//! Checks that `cuda/devcomm/handles.cuh`, compiled by the host C++ compiler, lays out every
//! struct exactly as Rust does (`devcomm::handles::LAYOUT`). Needs `c++` (or `$CXX`) on PATH.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use devcomm::handles::LAYOUT;

/// A C++ program that prints `struct field offset size` for every entry of LAYOUT, in order.
fn probe_source() -> String {
    let mut src = String::from(
        "#include <cstddef>\n#include <cstdio>\n#include \"devcomm/handles.cuh\"\n\nint main() {\n",
    );
    for (strukt, field, _, _) in LAYOUT {
        writeln!(
            src,
            "  std::printf(\"%s %s %zu %zu\\n\", \"{strukt}\", \"{field}\", \
             offsetof(devcomm::{strukt}, {field}), sizeof(devcomm::{strukt}));"
        )
        .unwrap();
    }
    src.push_str("  return 0;\n}\n");
    src
}

fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".to_string())
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("devcomm-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn compile_probe(dir: &Path) -> Option<PathBuf> {
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
    let source = dir.join("layout_probe.cpp");
    let binary = dir.join("layout_probe");
    std::fs::write(&source, probe_source()).unwrap();
    let output = match Command::new(compiler())
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&binary)
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .output()
    {
        Ok(output) => output,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("DEVCOMM_REQUIRE_CXX").is_none(),
                "DEVCOMM_REQUIRE_CXX is set but `{}` was not found",
                compiler()
            );
            eprintln!("SKIPPED: no host C++ compiler `{}`", compiler());
            return None;
        }
        Err(err) => panic!("running {}: {err}", compiler()),
    };
    assert!(
        output.status.success(),
        "handles.cuh does not compile as host C++:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(binary)
}

#[test]
fn cpp_layout_equals_rust_layout() {
    let dir = scratch_dir();
    let Some(binary) = compile_probe(&dir) else {
        return;
    };
    let output = Command::new(&binary).output().unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let cpp: Vec<&str> = stdout.lines().collect();
    assert_eq!(cpp.len(), LAYOUT.len(), "C++ printed:\n{stdout}");
    for (line, (strukt, field, offset, size)) in cpp.iter().zip(LAYOUT) {
        assert_eq!(
            *line,
            format!("{strukt} {field} {offset} {size}"),
            "C++ and Rust disagree (left: C++, right: Rust)"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn layout_covers_every_shared_struct() {
    for strukt in [
        "ErrorRecord",
        "DeviceErrorState",
        "DeviceWindow",
        "DevicePeerTable",
        "RegisteredBuffer",
    ] {
        assert!(
            LAYOUT.iter().any(|(s, ..)| *s == strukt),
            "{strukt} missing from LAYOUT"
        );
    }
}
