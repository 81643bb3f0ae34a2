//! Compiles every reduction kernel with NVRTC for sm_90 (no GPU needed): one-shot, two-shot and
//! zero-copy for every element type and operation, the network path's local steps, the RMSNorm,
//! RMSNorm + FP8 and accumulate epilogues (on both paths), and the error a user gets for a hook
//! of the wrong element size.
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
