//! Compiles the embedded device API and the library's kernels with NVRTC (no GPU needed).
//!
//! Needs libnvrtc on the loader path (e.g. `LD_LIBRARY_PATH=.../nvidia/cu13/lib`). Without it
//! the tests print SKIPPED and pass, unless `DEVCOMM_REQUIRE_NVRTC` is set (CI sets it).

mod common;
use common::{nvrtc_available, SM90};
use std::time::Instant;

use devcomm::device::{self, HEADERS};
use devcomm::jit::{self, KernelSpec};
use devcomm::Error;

fn compile_timed(spec: &KernelSpec) -> jit::CompiledModule {
    let start = Instant::now();
    let module = jit::compile(spec, SM90).unwrap_or_else(|err| panic!("{err}"));
    eprintln!("compiled `{}` in {:?}", spec.name, start.elapsed());
    assert!(!module.cubin.is_empty());
    // A cubin is an ELF file.
    assert_eq!(
        &module.cubin[..4],
        b"\x7fELF",
        "`{}` is not a cubin",
        spec.name
    );
    module
}

/// A translation unit with just `header` and a kernel that touches nothing of it.
fn header_alone(include: &str) -> KernelSpec {
    let stem = include
        .trim_start_matches("devcomm/")
        .trim_end_matches(".cuh");
    let source = format!(
        "#include \"{include}\"\n\
         #include \"{include}\"  // twice: include guards work\n\
         extern \"C\" __global__ void header_probe(int* out) {{ *out = 1; }}\n"
    );
    KernelSpec::new(format!("header_{stem}"), source).name_expression("header_probe")
}

#[test]
fn every_header_compiles_on_its_own() {
    if !nvrtc_available() {
        return;
    }
    assert!(!HEADERS.is_empty());
    for (include, _) in HEADERS {
        let module = compile_timed(&header_alone(include));
        assert_eq!(module.lowered_names["header_probe"], "header_probe");
    }
}

#[test]
fn umbrella_instantiates_every_group_and_operation() {
    if !nvrtc_available() {
        return;
    }
    // Instantiates each template for each group so that errors in rarely used combinations
    // (NamedBarrier, Warp) show up here rather than in a user's kernel.
    let source = r#"#include "devcomm/devcomm.cuh"
using namespace devcomm;

template <class G>
__device__ void exercise(const G& g, const DeviceWindow& w, const RegisteredBuffer* reg,
                         void* dst, const void* src, dc_u64 bytes, int* out) {
  copy_bytes(g, dst, src, bytes);
  put(g, w, 1, 0, src, bytes);
  put_signal(g, w, 1, 64, src, bytes, 0, 7);
  bool ok = wait_signal(g, w, 0, 7);
  ok = ok && wait_signal(g, w, 1, 3, Cmp::Eq, 1);
  ok = ok && barrier(g, w);
  if (g.thread_rank() == 0) {
    signal(w, 1, 0, 1);
    signal_add(w, 1, 0, 1);
    signal_relaxed(w, 1, 0, 2);
    out[0] = ok && get_nvlink_address(reg, 1) != nullptr && get_nvlink_address(w, 1) != nullptr;
    out[1] = (int)(ld_relaxed_sys((const dc_u64*)w.signals) + globaltimer_ns());
  }
  g.sync();
}

template <class G>
__global__ void group_kernel(DeviceWindow w, const RegisteredBuffer* reg, void* dst,
                             const void* src, dc_u64 bytes, int* out) {
  exercise(G{}, w, reg, dst, src, bytes, out);
}

extern "C" __global__ void named_kernel(DeviceWindow w, const RegisteredBuffer* reg, void* dst,
                                        const void* src, dc_u64 bytes, int* out) {
  const NamedBarrier upper(1, 128, 128);
  if (threadIdx.x >= 128) exercise(upper, w, reg, dst, src, bytes, out);
}
"#;
    let spec = KernelSpec::new("umbrella", source)
        .name_expression("group_kernel<devcomm::Thread>")
        .name_expression("group_kernel<devcomm::Warp>")
        .name_expression("group_kernel<devcomm::Block>")
        .name_expression("named_kernel");
    let module = compile_timed(&spec);
    assert!(module.lowered_names["group_kernel<devcomm::Block>"].starts_with("_Z"));
    assert_eq!(module.lowered_names["named_kernel"], "named_kernel");
}

#[test]
fn sendrecv_kernels_compile() {
    if !nvrtc_available() {
        return;
    }
    let spec = devcomm::kernel_spec(
        devcomm::KernelKind::SendRecv,
        &devcomm::Config::default(),
        false,
    );
    let module = compile_timed(&spec);
    assert_eq!(module.lowered_names.len(), spec.name_expressions.len());
    for expr in &spec.name_expressions {
        assert!(
            module.lowered_names[expr].starts_with("_Z"),
            "{expr} not lowered"
        );
    }
    assert!(module.log.is_empty(), "warnings:\n{}", module.log);
}

#[test]
fn a_bad_user_hook_reports_its_own_line() {
    if !nvrtc_available() {
        return;
    }
    let source = "#include \"devcomm/devcomm.cuh\"\n\
                  __device__ float user_hook(float x) {\n\
                  \x20 return x * undefined_scale;  // line 3\n\
                  }\n\
                  extern \"C\" __global__ void k(float* p) { p[0] = user_hook(p[0]); }\n";
    let spec = KernelSpec::new("bad_hook", source).name_expression("k");
    match jit::compile(&spec, SM90) {
        Err(Error::Compile { kernel, log }) => {
            assert_eq!(kernel, "bad_hook");
            assert!(
                log.contains("bad_hook.cu(3)"),
                "log does not name line 3:\n{log}"
            );
            assert!(log.contains("undefined_scale"), "{log}");
        }
        other => panic!("expected Error::Compile, got {other:?}"),
    }
}

#[test]
fn every_header_file_is_embedded() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/devcomm");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".cuh"))
        .map(|name| format!("devcomm/{name}"))
        .collect();
    let mut embedded: Vec<String> = HEADERS.iter().map(|(n, _)| n.to_string()).collect();
    on_disk.sort();
    embedded.sort();
    assert_eq!(on_disk, embedded);
    assert!(device::header(device::UMBRELLA).is_some());
}

/// Without libnvrtc, compiling returns `Error::Nvrtc` instead of cudarc's loader panic. Runs
/// this test binary again with the library hidden from the loader path.
#[test]
fn missing_nvrtc_is_an_error_not_a_panic() {
    const CHILD: &str = "DEVCOMM_TEST_CHILD_WITHOUT_NVRTC";
    if std::env::var_os(CHILD).is_some() {
        let spec = KernelSpec::new("probe", "extern \"C\" __global__ void k() {}");
        match jit::compile(&spec, SM90) {
            Err(Error::Nvrtc { call, message }) => println!("CHILD-ERROR {call}: {message}"),
            // libnvrtc is installed system-wide: nothing to hide it from.
            Ok(_) => println!("CHILD-PRESENT"),
            Err(other) => panic!("unexpected error: {other}"),
        }
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "missing_nvrtc_is_an_error_not_a_panic",
            "--exact",
            "--nocapture",
        ])
        .env_remove("LD_LIBRARY_PATH")
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("CHILD-ERROR dlopen(libnvrtc)") || stdout.contains("CHILD-PRESENT"),
        "{stdout}"
    );
    eprintln!(
        "{}",
        stdout
            .lines()
            .find(|l| l.starts_with("CHILD-"))
            .unwrap_or("")
    );
}
