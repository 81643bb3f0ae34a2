//! Checks the transcribed UCX structs and constants against the installed `ucp.h`: writes a C
//! file of `_Static_assert`s from `ucx_ffi::abi_facts` / `abi_constants` and compiles it with
//! the host C compiler. Without headers or a compiler it prints SKIPPED and passes, unless
//! `DEVCOMM_REQUIRE_UCX` is set (CI sets it), which makes it fail.

use std::path::PathBuf;
use std::process::Command;

#[allow(unused_imports)]
use super::ucx_ffi::*;

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

/// Layout of the structs above as compiled here: `(struct, field, offset)` plus sizes, for the
/// ABI test (`ucx_abi_test.rs`) to compare with the C headers.
fn abi_facts() -> Vec<(&'static str, &'static str, usize)> {
    use std::mem::{offset_of, size_of};
    vec![
        ("ucp_params_t", "", size_of::<UcpParams>()),
        ("ucp_params_t", "features", offset_of!(UcpParams, features)),
        ("ucp_params_t", "name", offset_of!(UcpParams, name)),
        ("ucp_worker_params_t", "", size_of::<UcpWorkerParams>()),
        (
            "ucp_worker_params_t",
            "thread_mode",
            offset_of!(UcpWorkerParams, thread_mode),
        ),
        (
            "ucp_worker_params_t",
            "events",
            offset_of!(UcpWorkerParams, events),
        ),
        (
            "ucp_worker_params_t",
            "client_id",
            offset_of!(UcpWorkerParams, client_id),
        ),
        ("ucp_ep_params_t", "", size_of::<UcpEpParams>()),
        (
            "ucp_ep_params_t",
            "address",
            offset_of!(UcpEpParams, address),
        ),
        (
            "ucp_ep_params_t",
            "err_mode",
            offset_of!(UcpEpParams, err_mode),
        ),
        (
            "ucp_ep_params_t",
            "err_handler",
            offset_of!(UcpEpParams, err_handler),
        ),
        (
            "ucp_ep_params_t",
            "user_data",
            offset_of!(UcpEpParams, user_data),
        ),
        ("ucp_ep_params_t", "flags", offset_of!(UcpEpParams, flags)),
        ("ucp_ep_params_t", "name", offset_of!(UcpEpParams, name)),
        ("ucp_mem_map_params_t", "", size_of::<UcpMemMapParams>()),
        (
            "ucp_mem_map_params_t",
            "length",
            offset_of!(UcpMemMapParams, length),
        ),
        (
            "ucp_mem_map_params_t",
            "prot",
            offset_of!(UcpMemMapParams, prot),
        ),
        (
            "ucp_mem_map_params_t",
            "memory_type",
            offset_of!(UcpMemMapParams, memory_type),
        ),
        ("ucp_request_param_t", "", size_of::<UcpRequestParam>()),
        (
            "ucp_request_param_t",
            "request",
            offset_of!(UcpRequestParam, request),
        ),
        (
            "ucp_request_param_t",
            "datatype",
            offset_of!(UcpRequestParam, datatype),
        ),
        (
            "ucp_request_param_t",
            "reply_buffer",
            offset_of!(UcpRequestParam, reply_buffer),
        ),
        (
            "ucp_request_param_t",
            "memory_type",
            offset_of!(UcpRequestParam, memory_type),
        ),
        (
            "ucp_request_param_t",
            "memh",
            offset_of!(UcpRequestParam, memh),
        ),
        (
            "ucp_request_param_t",
            "remote_count",
            offset_of!(UcpRequestParam, remote_count),
        ),
    ]
}

/// The constants above by their C names, for the ABI test.
fn abi_constants() -> Vec<(&'static str, i64)> {
    vec![
        ("UCS_OK", UCS_OK.into()),
        ("UCS_INPROGRESS", UCS_INPROGRESS.into()),
        ("UCS_ERR_CONNECTION_RESET", UCS_ERR_CONNECTION_RESET.into()),
        ("UCS_ERR_LAST", UCS_ERR_LAST as i64),
        ("UCP_API_MAJOR", UCP_API_MAJOR.into()),
        ("UCP_API_MINOR", UCP_API_MINOR.into()),
        ("UCP_PARAM_FIELD_FEATURES", UCP_PARAM_FIELD_FEATURES as i64),
        ("UCP_PARAM_FIELD_NAME", UCP_PARAM_FIELD_NAME as i64),
        ("UCP_FEATURE_RMA", UCP_FEATURE_RMA as i64),
        (
            "UCP_WORKER_PARAM_FIELD_THREAD_MODE",
            UCP_WORKER_PARAM_FIELD_THREAD_MODE as i64,
        ),
        (
            "UCS_THREAD_MODE_SERIALIZED",
            UCS_THREAD_MODE_SERIALIZED.into(),
        ),
        (
            "UCP_EP_PARAM_FIELD_REMOTE_ADDRESS",
            UCP_EP_PARAM_FIELD_REMOTE_ADDRESS as i64,
        ),
        (
            "UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE",
            UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE as i64,
        ),
        (
            "UCP_EP_PARAM_FIELD_ERR_HANDLER",
            UCP_EP_PARAM_FIELD_ERR_HANDLER as i64,
        ),
        (
            "UCP_ERR_HANDLING_MODE_PEER",
            UCP_ERR_HANDLING_MODE_PEER.into(),
        ),
        ("UCP_EP_CLOSE_FLAG_FORCE", UCP_EP_CLOSE_FLAG_FORCE.into()),
        (
            "UCP_MEM_MAP_PARAM_FIELD_ADDRESS",
            UCP_MEM_MAP_PARAM_FIELD_ADDRESS as i64,
        ),
        (
            "UCP_MEM_MAP_PARAM_FIELD_LENGTH",
            UCP_MEM_MAP_PARAM_FIELD_LENGTH as i64,
        ),
        (
            "UCP_MEM_MAP_PARAM_FIELD_PROT",
            UCP_MEM_MAP_PARAM_FIELD_PROT as i64,
        ),
        (
            "UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE",
            UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE as i64,
        ),
        (
            "UCP_MEM_MAP_PROT_LOCAL_READ",
            UCP_MEM_MAP_PROT_LOCAL_READ.into(),
        ),
        (
            "UCP_MEM_MAP_PROT_LOCAL_WRITE",
            UCP_MEM_MAP_PROT_LOCAL_WRITE.into(),
        ),
        (
            "UCP_MEM_MAP_PROT_REMOTE_READ",
            UCP_MEM_MAP_PROT_REMOTE_READ.into(),
        ),
        (
            "UCP_MEM_MAP_PROT_REMOTE_WRITE",
            UCP_MEM_MAP_PROT_REMOTE_WRITE.into(),
        ),
        ("UCS_MEMORY_TYPE_HOST", UCS_MEMORY_TYPE_HOST.into()),
        ("UCS_MEMORY_TYPE_CUDA", UCS_MEMORY_TYPE_CUDA.into()),
        ("UCP_OP_ATTR_FIELD_FLAGS", UCP_OP_ATTR_FIELD_FLAGS.into()),
    ]
}
