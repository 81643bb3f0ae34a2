//! Checks the transcribed UCX structs and constants against the installed `ucp.h`: writes a C
//! file of `_Static_assert`s from `ucx_ffi::abi_facts` / `abi_constants` and compiles it with
//! the host C compiler. Without headers or a compiler it prints SKIPPED and passes, unless
//! `DEVCOMM_REQUIRE_UCX` is set (CI sets it), which makes it fail.

use std::path::PathBuf;
use std::process::Command;

use super::ucx_ffi::{abi_constants, abi_facts};

/// The directory holding `ucp/api/ucp.h`: `DEVCOMM_UCX_INCLUDE`, else `include/` beside the
/// library directory of `DEVCOMM_UCX_LIB`, else /usr/include.
fn include_dir() -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = crate::config::test_variable("DEVCOMM_UCX_INCLUDE") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(l) = crate::config::test_variable(super::UCX_LIB_ENV) {
        let l = PathBuf::from(l);
        let dir = if l.is_dir() {
            l
        } else {
            l.parent()?.to_path_buf()
        };
        dirs.push(dir.join("../include"));
    }
    dirs.push(PathBuf::from("/usr/include"));
    dirs.into_iter().find(|d| d.join("ucp/api/ucp.h").is_file())
}

fn unavailable(why: &str) {
    assert!(
        crate::config::test_variable("DEVCOMM_REQUIRE_UCX").is_none(),
        "DEVCOMM_REQUIRE_UCX is set but {why}"
    );
    eprintln!("SKIPPED ucx_abi: {why}");
}

#[test]
fn structs_and_constants_match_ucp_h() {
    let Some(include) = include_dir() else {
        return unavailable("no ucp/api/ucp.h found (set DEVCOMM_UCX_INCLUDE or DEVCOMM_UCX_LIB)");
    };
    let mut c = String::from("#include <stddef.h>\n#include <ucp/api/ucp.h>\n");
    for (ty, field, value) in abi_facts() {
        let expr = if field.is_empty() {
            format!("sizeof({ty})")
        } else {
            format!("offsetof({ty}, {field})")
        };
        c += &format!("_Static_assert({expr} == {value}, \"{expr} is not {value}\");\n");
    }
    for (name, value) in abi_constants() {
        c += &format!(
            "_Static_assert((long long)({name}) == {value}LL, \"{name} is not {value}\");\n"
        );
    }
    let dir = std::env::temp_dir().join(format!("devcomm-ucx-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("abi.c");
    std::fs::write(&src, &c).unwrap();
    let cc = crate::config::test_variable("CC").unwrap_or_else(|| "cc".to_owned());
    let out = match Command::new(&cc)
        .args(["-std=c11", "-fsyntax-only", "-I"])
        .arg(&include)
        .arg(&src)
        .output()
    {
        Ok(o) => o,
        Err(e) => return unavailable(&format!("the C compiler `{cc}` did not start: {e}")),
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "the UCX ABI transcribed in ucx_ffi.rs differs from {}:\n{}",
        include.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}
