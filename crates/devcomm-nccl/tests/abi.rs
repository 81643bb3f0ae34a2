//! The exported ABI against the real `nccl.h` (NCCL 2.28.9, from the `nvidia-nccl-cu13` wheel
//! that scripts/test.sh installs into `.tools/nccl`): a C program compiled with the host
//! compiler (`cc`) includes the header, references every function it declares (so linking
//! it against `libdevcomm_nccl.so` fails for a missing symbol), and prints the sizes, field
//! offsets and values that this crate's `ffi` module must match.
//!
//! Without the header the test says it was skipped, or fails when
//! `DEVCOMM_REQUIRE_NCCL_HEADER=1` (as in CI).

use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use devcomm_nccl::ffi::{self, NcclConfig, NcclUniqueId};

fn header() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates = [
        std::env::var_os("DEVCOMM_NCCL_HEADER").map(PathBuf::from),
        Some(root.join(".tools/nccl/nvidia/nccl/include/nccl.h")),
    ];
    candidates.into_iter().flatten().find(|p| p.is_file())
}

/// The folder holding the cdylib cargo built beside this test.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder").to_path_buf();
    for dir in [
        deps.clone(),
        deps.parent().expect("profile folder").to_path_buf(),
    ] {
        if dir.join("libdevcomm_nccl.so").is_file() {
            return dir;
        }
    }
    panic!("libdevcomm_nccl.so not found beside {}", exe.display());
}

/// The functions `nccl.h` declares (not the `pnccl` profiling twins).
fn declared_functions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        let rest = ["ncclResult_t", "const char*", "void"]
            .iter()
            .find_map(|ret| line.strip_prefix(ret));
        let Some(rest) = rest else { continue };
        let name = rest.trim_start();
        if let Some(end) = name.find('(') {
            let name = &name[..end];
            if name.starts_with("nccl") && name.chars().all(|c| c.is_ascii_alphanumeric()) {
                out.push(name.to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn types_values_and_symbols_match_nccl_h() {
    let Some(h) = header() else {
        if std::env::var("DEVCOMM_REQUIRE_NCCL_HEADER").as_deref() == Ok("1") {
            panic!(
                "nccl.h not found (.tools/nccl/nvidia/nccl/include/nccl.h or DEVCOMM_NCCL_HEADER) \
                 and DEVCOMM_REQUIRE_NCCL_HEADER=1: scripts/test.sh installs it"
            );
        }
        eprintln!("SKIPPED: nccl.h not found; run scripts/test.sh to install it into .tools/nccl");
        return;
    };
    let text = std::fs::read_to_string(&h).expect("read nccl.h");
    let functions = declared_functions(&text);
    assert!(functions.len() > 40, "{functions:?}");
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"nccl.h\"\n");
    c.push_str("void* refs[] = {\n");
    for f in &functions {
        c.push_str(&format!("  (void*){f},\n"));
    }
    c.push_str("};\nint main(void) {\n");
    let values: &[(&str, &str)] = &[
        ("version", "NCCL_VERSION_CODE"),
        ("id_bytes", "(long)sizeof(ncclUniqueId)"),
        ("config_size", "(long)sizeof(ncclConfig_t)"),
        ("result_size", "(long)sizeof(ncclResult_t)"),
        ("type_size", "(long)sizeof(ncclDataType_t)"),
        ("op_size", "(long)sizeof(ncclRedOp_t)"),
        ("undef_int", "NCCL_CONFIG_UNDEF_INT"),
        ("nocolor", "NCCL_SPLIT_NOCOLOR"),
        (
            "magic",
            "(long)((ncclConfig_t)NCCL_CONFIG_INITIALIZER).magic",
        ),
        (
            "init_size",
            "(long)((ncclConfig_t)NCCL_CONFIG_INITIALIZER).size",
        ),
    ];
    let mut expected: Vec<(String, i64)> = vec![
        ("version".into(), ffi::NCCL_VERSION_CODE.into()),
        ("id_bytes".into(), size_of::<NcclUniqueId>() as i64),
        ("config_size".into(), size_of::<NcclConfig>() as i64),
        ("result_size".into(), size_of::<ffi::NcclResult>() as i64),
        ("type_size".into(), size_of::<ffi::NcclDataType>() as i64),
        ("op_size".into(), size_of::<ffi::NcclRedOp>() as i64),
        ("undef_int".into(), ffi::CONFIG_UNDEF_INT.into()),
        ("nocolor".into(), ffi::SPLIT_NOCOLOR.into()),
        ("magic".into(), ffi::CONFIG_MAGIC.into()),
        ("init_size".into(), size_of::<NcclConfig>() as i64),
    ];
    let mut printed: Vec<(String, String)> = values
        .iter()
        .map(|(k, e)| (k.to_string(), e.to_string()))
        .collect();
    let fields: &[(&str, usize)] = &[
        ("size", offset_of!(NcclConfig, size)),
        ("magic", offset_of!(NcclConfig, magic)),
        ("version", offset_of!(NcclConfig, version)),
        ("blocking", offset_of!(NcclConfig, blocking)),
        ("cgaClusterSize", offset_of!(NcclConfig, cga_cluster_size)),
        ("minCTAs", offset_of!(NcclConfig, min_ctas)),
        ("maxCTAs", offset_of!(NcclConfig, max_ctas)),
        ("netName", offset_of!(NcclConfig, net_name)),
        ("splitShare", offset_of!(NcclConfig, split_share)),
        ("trafficClass", offset_of!(NcclConfig, traffic_class)),
        ("commName", offset_of!(NcclConfig, comm_name)),
        ("collnetEnable", offset_of!(NcclConfig, collnet_enable)),
        ("CTAPolicy", offset_of!(NcclConfig, cta_policy)),
        ("shrinkShare", offset_of!(NcclConfig, shrink_share)),
        ("nvlsCTAs", offset_of!(NcclConfig, nvls_ctas)),
        (
            "nChannelsPerNetPeer",
            offset_of!(NcclConfig, n_channels_per_net_peer),
        ),
        (
            "nvlinkCentricSched",
            offset_of!(NcclConfig, nvlink_centric_sched),
        ),
    ];
    for (f, off) in fields {
        printed.push((
            format!("off_{f}"),
            format!("(long)offsetof(ncclConfig_t, {f})"),
        ));
        expected.push((format!("off_{f}"), *off as i64));
    }
    let enums: &[(&str, i32)] = &[
        ("ncclSuccess", ffi::SUCCESS),
        ("ncclUnhandledCudaError", ffi::UNHANDLED_CUDA_ERROR),
        ("ncclSystemError", ffi::SYSTEM_ERROR),
        ("ncclInternalError", ffi::INTERNAL_ERROR),
        ("ncclInvalidArgument", ffi::INVALID_ARGUMENT),
        ("ncclInvalidUsage", ffi::INVALID_USAGE),
        ("ncclRemoteError", ffi::REMOTE_ERROR),
        ("ncclInProgress", ffi::IN_PROGRESS),
        ("ncclNumResults", ffi::NUM_RESULTS),
        ("ncclInt8", ffi::INT8),
        ("ncclUint8", ffi::UINT8),
        ("ncclInt32", ffi::INT32),
        ("ncclUint32", ffi::UINT32),
        ("ncclInt64", ffi::INT64),
        ("ncclUint64", ffi::UINT64),
        ("ncclFloat16", ffi::FLOAT16),
        ("ncclFloat32", ffi::FLOAT32),
        ("ncclFloat64", ffi::FLOAT64),
        ("ncclBfloat16", ffi::BFLOAT16),
        ("ncclFloat8e4m3", ffi::FLOAT8E4M3),
        ("ncclFloat8e5m2", ffi::FLOAT8E5M2),
        ("ncclNumTypes", ffi::NUM_TYPES),
        ("ncclSum", ffi::SUM),
        ("ncclProd", ffi::PROD),
        ("ncclMax", ffi::MAX),
        ("ncclMin", ffi::MIN),
        ("ncclAvg", ffi::AVG),
        ("ncclNumOps", ffi::NUM_OPS),
        ("NCCL_UNIQUE_ID_BYTES", ffi::UNIQUE_ID_BYTES as i32),
    ];
    for (name, v) in enums {
        printed.push((name.to_string(), format!("(long){name}")));
        expected.push((name.to_string(), i64::from(*v)));
    }
    for (k, e) in &printed {
        c.push_str(&format!("  printf(\"{k} %ld\\n\", (long)({e}));\n"));
    }
    c.push_str("  return refs[0] == 0;\n}\n");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nccl-abi");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let src = dir.join("abi.c");
    let exe = dir.join("abi");
    std::fs::write(&src, &c).expect("write abi.c");
    // nccl.h includes the CUDA runtime's headers for `cudaStream_t` only (and the fp16/bf16
    // headers, unused by its declarations): stand-ins keep the test free of a CUDA toolkit.
    std::fs::write(
        dir.join("cuda_runtime.h"),
        "#define CUDART_VERSION 13000\ntypedef struct CUstream_st* cudaStream_t;\n",
    )
    .expect("write cuda_runtime.h");
    for empty in ["cuda_fp16.h", "cuda_bf16.h"] {
        std::fs::write(dir.join(empty), "").expect("write a stand-in header");
    }
    let lib = library_dir();
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(h.parent().expect("include folder"))
        .arg("-I")
        .arg(&dir)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-ldevcomm_nccl")
        .output()
        .expect("run the host C compiler `cc`");
    assert!(
        out.status.success(),
        "compiling and linking nccl.h's {} functions against libdevcomm_nccl.so failed \
         (an undefined reference is a function this library does not export):\n{}",
        functions.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    // The library just linked, not another copy on cargo's LD_LIBRARY_PATH (which a RUNPATH
    // would yield to).
    let run = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .expect("run the ABI probe");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let got: Vec<(String, i64)> = stdout
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect();
    assert_eq!(
        got, expected,
        "nccl.h (left) and devcomm_nccl::ffi (right) differ"
    );
}

#[test]
fn the_header_parser_finds_functions() {
    let text = "ncclResult_t  ncclSend(const void* b);\nncclResult_t pncclSend(x);\n\
                const char*  ncclGetErrorString(ncclResult_t r);\nvoid  ncclResetDebugInit();";
    assert_eq!(
        declared_functions(text),
        ["ncclGetErrorString", "ncclResetDebugInit", "ncclSend"]
    );
}
