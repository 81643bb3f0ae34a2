//! Compiles every reduction kernel with NVRTC for sm_90 (no GPU needed): one-shot, two-shot and
//! zero-copy for every element type and operation, the network path's local steps, the RMSNorm,
//! RMSNorm + FP8 and accumulate epilogues (on both paths), hooks whose rows run on more than a
//! warp (`kRowThreads`), and the errors a user gets for a hook of the wrong element size or a
//! row group that is no width.
//!
//! Needs libnvrtc on the loader path; without it the tests print SKIPPED and pass, unless
//! `DEVCOMM_REQUIRE_NVRTC` is set (CI sets it).

mod common;
use common::{nvrtc_available, SM90};
use devcomm::jit;
use devcomm::reduce::plan::Algorithm;
use devcomm::{
    kernel_spec as spec_of, Config, DataType, Error, Hooks, KernelKind, RawHooks, ReduceOp,
};

fn kernel_spec(dtype: DataType) -> jit::KernelSpec {
    let kind = KernelKind::Reduce {
        dtype,
        hooked: None,
    };
    spec_of(kind, &Config::default(), false)
}

fn hooked_kernel_spec(dtype: DataType, op: ReduceOp, hooks: &RawHooks) -> jit::KernelSpec {
    let kind = KernelKind::Reduce {
        dtype,
        hooked: Some((op, hooks)),
    };
    spec_of(kind, &Config::default(), false)
}

fn net_step_spec(dtype: DataType) -> jit::KernelSpec {
    let kind = KernelKind::ReduceNetStep {
        dtype,
        hooked: None,
    };
    spec_of(kind, &Config::default(), true)
}

fn hooked_net_step_spec(dtype: DataType, op: ReduceOp, hooks: &RawHooks) -> jit::KernelSpec {
    let kind = KernelKind::ReduceNetStep {
        dtype,
        hooked: Some((op, hooks)),
    };
    spec_of(kind, &Config::default(), true)
}

#[test]
fn every_type_and_operation_compiles() {
    if !nvrtc_available() {
        return;
    }
    for dtype in DataType::ALL {
        let spec = kernel_spec(dtype);
        assert_eq!(spec.name_expressions.len(), 16, "{dtype}");
        let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        for expr in &spec.name_expressions {
            assert!(module.lowered_names[expr].starts_with("_Z"), "{expr}");
        }
        assert!(module.log.is_empty(), "{dtype}: warnings:\n{}", module.log);
    }
}

#[test]
fn the_rmsnorm_epilogue_compiles() {
    if !nvrtc_available() {
        return;
    }
    let hooks = Hooks::<f32, f32>::new("RmsNorm", include_str!("../examples/hooks/rmsnorm.cu"));
    let spec = hooked_kernel_spec(DataType::F32, ReduceOp::Sum, hooks.raw());
    let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{e}"));
    // The one-shot on lines, the staged two-shot and the zero-copy kernel.
    assert_eq!(module.lowered_names.len(), 3);
    assert!(module.log.is_empty(), "warnings:\n{}", module.log);
}

#[test]
fn the_rmsnorm_fp8_epilogue_compiles() {
    if !nvrtc_available() {
        return;
    }
    let hooks = Hooks::<half::bf16, half::bf16>::new(
        "RmsNormFp8",
        include_str!("../examples/hooks/rmsnorm_fp8.cu"),
    );
    let spec = hooked_kernel_spec(DataType::BF16, ReduceOp::Sum, hooks.raw());
    let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{e}"));
    // The one-shot on lines and the staged two-shot, which hooked calls on ordinary buffers
    // take (the count of kernels beside them is the module's business, not this hook's).
    for a in [Algorithm::OneShot, Algorithm::TwoShot] {
        let e = devcomm::reduce::kernel_expression(
            a,
            DataType::BF16,
            ReduceOp::Sum,
            Some("RmsNormFp8"),
        );
        let lowered = module.lowered_names.get(&e);
        assert!(
            lowered.is_some_and(|n| n.starts_with("_Z")),
            "{e} not in {:?}",
            module.lowered_names
        );
    }
    assert!(module.log.is_empty(), "warnings:\n{}", module.log);
    // The network path's local step with the same hook.
    let spec = hooked_net_step_spec(DataType::BF16, ReduceOp::Sum, hooks.raw());
    let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("net step: {e}"));
    assert_eq!(module.lowered_names.len(), 1);
    assert!(module.log.is_empty(), "net step warnings:\n{}", module.log);
    // Before sm_89 the hook converts to e4m3 in software (no cvt ... e4m3x2).
    let spec = hooked_kernel_spec(DataType::BF16, ReduceOp::Sum, hooks.raw());
    let module = jit::compile(&spec, (8, 0)).unwrap_or_else(|e| panic!("sm_80: {e}"));
    assert!(module.log.is_empty(), "sm_80 warnings:\n{}", module.log);
}

#[test]
fn the_accumulate_epilogue_compiles_for_every_operation() {
    if !nvrtc_available() {
        return;
    }
    let hooks = Hooks::<f32, f32>::new(
        "Accumulate",
        include_str!("../examples/hooks/accumulate.cu"),
    );
    for op in ReduceOp::ALL {
        let spec = hooked_kernel_spec(DataType::F32, op, hooks.raw());
        let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(module.lowered_names.len(), 3);
        assert!(module.log.is_empty(), "{op}: warnings:\n{}", module.log);
    }
}

#[test]
fn a_hook_of_the_wrong_size_is_a_compile_error_with_its_reason() {
    if !nvrtc_available() {
        return;
    }
    let hooks = Hooks::<f32, f32>::new("RmsNorm", include_str!("../examples/hooks/rmsnorm.cu"));
    let spec = hooked_kernel_spec(DataType::BF16, ReduceOp::Sum, hooks.raw());
    match jit::compile(&spec, SM90) {
        Err(Error::Compile { log, .. }) => {
            assert!(log.contains("the hook's T is not"), "{log}")
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

/// A hook whose rows run on THREADS threads: each element becomes the row's sum over its
/// largest magnitude (`row_sum` and `row_max`, each called once by every thread of the group);
/// beside it `Plain`, a hook without `kRowThreads`, and the widths the trait gives both.
const ROW_GROUP_HOOK: &str = r#"
struct Wide {
  using T = float;
  static constexpr unsigned kRowThreads = THREADS;
  static __device__ void epilogue(const devcomm::red::RowCtx& c, float* row) {
    float s = 0.0f, m = 0.0f;
    for (unsigned long long j = c.lane; j < c.cols; j += c.lanes) {
      s += row[j];
      m = fmaxf(m, fabsf(row[j]));
    }
    const float t = devcomm::red::row_sum(c, s) / devcomm::red::row_max(c, m);
    for (unsigned long long j = c.lane; j < c.cols; j += c.lanes) row[j] = t;
  }
};
struct Plain {
  using T = float;
  static __device__ void epilogue(const devcomm::red::RowCtx&, float*) {}
};
static_assert(devcomm::red::RowThreads<Plain>::value == 32, "no kRowThreads: a warp");
static_assert(devcomm::red::RowThreads<Wide>::value == THREADS, "kRowThreads");
"#;

fn row_group_hook(threads: &str) -> String {
    ROW_GROUP_HOOK.replace("THREADS", threads)
}

#[test]
fn hooks_with_row_groups_wider_than_a_warp_compile_on_every_path() {
    if !nvrtc_available() {
        return;
    }
    for threads in ["64", "256", "512"] {
        let hooks = Hooks::<f32, f32>::new("Wide", row_group_hook(threads));
        let spec = hooked_kernel_spec(DataType::F32, ReduceOp::Sum, hooks.raw());
        let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{threads}: {e}"));
        // The one-shot on lines, the staged two-shot and the zero-copy kernel.
        assert_eq!(module.lowered_names.len(), 3, "{threads}");
        assert!(
            module.log.is_empty(),
            "{threads}: warnings:\n{}",
            module.log
        );
        let spec = hooked_net_step_spec(DataType::F32, ReduceOp::Sum, hooks.raw());
        let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{threads}: {e}"));
        assert!(
            module.log.is_empty(),
            "{threads} net step: warnings:\n{}",
            module.log
        );
    }
    // The RMSNorm example (128 threads a row) with the whole block on a row.
    let example = include_str!("../examples/hooks/rmsnorm.cu");
    assert!(example.contains("kRowThreads = 128;"));
    let wide = example.replace("kRowThreads = 128;", "kRowThreads = 512;");
    let hooks = Hooks::<f32, f32>::new("RmsNorm", wide);
    let spec = hooked_kernel_spec(DataType::F32, ReduceOp::Sum, hooks.raw());
    let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("RmsNorm at 512: {e}"));
    assert!(
        module.log.is_empty(),
        "RmsNorm at 512: warnings:\n{}",
        module.log
    );
}

#[test]
fn a_row_group_that_is_no_width_is_a_compile_error_with_its_reason() {
    if !nvrtc_available() {
        return;
    }
    for threads in ["96", "16", "0", "1024", "-32"] {
        let hooks = Hooks::<f32, f32>::new("Wide", row_group_hook(threads));
        let spec = hooked_kernel_spec(DataType::F32, ReduceOp::Sum, hooks.raw());
        match jit::compile(&spec, SM90) {
            Err(Error::Compile { log, .. }) => assert!(
                log.contains("the hook's kRowThreads must be 32, 64, 128, 256 or 512"),
                "{threads}: {log}"
            ),
            other => panic!("{threads}: expected a compile error, got {other:?}"),
        }
    }
}

#[test]
fn every_network_step_compiles_plain_and_hooked() {
    if !nvrtc_available() {
        return;
    }
    for dtype in DataType::ALL {
        let spec = net_step_spec(dtype);
        assert_eq!(spec.name_expressions.len(), 4, "{dtype}");
        let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        assert_eq!(module.lowered_names.len(), 4);
        assert!(module.log.is_empty(), "{dtype}: warnings:\n{}", module.log);
    }
    for (name, source) in [
        ("RmsNorm", include_str!("../examples/hooks/rmsnorm.cu")),
        (
            "Accumulate",
            include_str!("../examples/hooks/accumulate.cu"),
        ),
    ] {
        let hooks = Hooks::<f32, f32>::new(name, source);
        let spec = hooked_net_step_spec(DataType::F32, ReduceOp::Sum, hooks.raw());
        let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(module.lowered_names.len(), 1);
        assert!(module.log.is_empty(), "{name}: warnings:\n{}", module.log);
    }
}
