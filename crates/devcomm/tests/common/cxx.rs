//! Compiling small C++ programs against `cuda/` with the host compiler (`c++`, or `$CXX`), for
//! the CPU tests of the headers. Included by path (`#[path = "common/cxx.rs"] mod cxx;`) from
//! the test files that need it.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".to_string())
}

/// A directory of its own for each test (they run in parallel and remove theirs at the end).
pub fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("devcomm-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles `source` (a C++ file written into `dir` as `name.cpp`) against `cuda/` with `flags`
/// and returns the binary, or `None` when there is no host compiler (a failure instead when
/// `DEVCOMM_REQUIRE_CXX` is set, as in CI).
pub fn compile_cpp(dir: &Path, name: &str, source: &str, flags: &[&str]) -> Option<PathBuf> {
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
    let source_path = dir.join(format!("{name}.cpp"));
    let binary = dir.join(name);
    std::fs::write(&source_path, source).unwrap();
    let output = match Command::new(compiler())
        .arg("-std=c++17")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg("-I")
        .arg(&include)
        .arg(&source_path)
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
        "{name}.cpp does not compile as host C++:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(binary)
}

/// Runs `binary`, which prints `OK` when all its checks pass (and its failures otherwise).
pub fn run_ok(binary: &Path) {
    let run = Command::new(binary).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("OK"),
        "{} failed ({}):\n{stdout}{}",
        binary.display(),
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Compiles a host C++ program that includes `headers` and prints `struct field offset size`
/// for every entry of `layout` (`devcomm::` structs), runs it and asserts that every line
/// equals Rust's entry. False when no host compiler is there (the caller skips).
pub fn assert_layout(test: &str, headers: &[&str], layout: &[(&str, &str, usize, usize)]) -> bool {
    use std::fmt::Write as _;
    let mut src = String::from("#include <cstddef>\n#include <cstdio>\n");
    for h in headers {
        writeln!(src, "#include \"{h}\"").unwrap();
    }
    src.push_str("\nint main() {\n");
    for (strukt, field, _, _) in layout {
        writeln!(
            src,
            "  std::printf(\"%s %s %zu %zu\\n\", \"{strukt}\", \"{field}\", \
             offsetof(devcomm::{strukt}, {field}), sizeof(devcomm::{strukt}));"
        )
        .unwrap();
    }
    src.push_str("  return 0;\n}\n");
    let dir = scratch_dir(test);
    let Some(binary) = compile_cpp(&dir, "layout_probe", &src, &["-Wall", "-Wextra", "-Werror"])
    else {
        return false;
    };
    let output = Command::new(&binary).output().unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let cpp: Vec<&str> = stdout.lines().collect();
    assert_eq!(cpp.len(), layout.len(), "C++ printed:\n{stdout}");
    for (line, (strukt, field, offset, size)) in cpp.iter().zip(layout) {
        assert_eq!(
            *line,
            format!("{strukt} {field} {offset} {size}"),
            "C++ and Rust disagree (left: C++, right: Rust)"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    true
}
