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
