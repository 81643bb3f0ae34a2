//! Compiles the MoE kernels with NVRTC (no GPU needed), for every row type, every kernel of
//! the native and FP8 wires, and checks that `MoeArgs` has the size of its twin in
//! `src/moe/mod.rs` (a `static_assert` in the module). sm_90 takes the hardware e4m3 encoder,
//! sm_80 its software twin (`cuda/devcomm/fp8.cuh`): both must compile.
//!
//! Needs libnvrtc on the loader path; without it the test prints SKIPPED and passes, unless
//! `DEVCOMM_REQUIRE_NVRTC` is set (CI sets it).

mod common;
use common::{nvrtc_available, SM90};
use devcomm::moe::{Fp8Output, Fp8Scales, Wire};
use devcomm::{jit, kernel_spec, moe, Config, DataType, KernelKind};

#[test]
fn every_row_type_compiles() {
    if !nvrtc_available() {
        return;
    }
    for arch in [SM90, (8, 0)] {
        for dtype in [DataType::BF16, DataType::F16, DataType::F32] {
            let spec = kernel_spec(KernelKind::Moe { dtype }, &Config::default(), false);
            assert_eq!(spec.name_expressions.len(), moe::KERNELS.len());
            let module =
                jit::compile(&spec, arch).unwrap_or_else(|e| panic!("{dtype} sm_{arch:?}: {e}"));
            for expr in &spec.name_expressions {
                assert!(module.lowered_names.contains_key(expr), "{expr}");
            }
            assert!(
                module.log.is_empty(),
                "{dtype} {arch:?}: warnings:\n{}",
                module.log
            );
        }
    }
}

#[test]
fn every_wire_s_kernels_are_in_the_module() {
    let spec = kernel_spec(
        KernelKind::Moe {
            dtype: DataType::BF16,
        },
        &Config::default(),
        false,
    );
    for scales in [Fp8Scales::PerRow, Fp8Scales::Per128] {
        for output in [Fp8Output::Dequantised, Fp8Output::Fp8] {
            for wire in [Wire::Native, Wire::Fp8 { scales, output }] {
                let (pack, unpack) = wire.kernels();
                for k in [pack, unpack] {
                    let expr = moe::kernel_expression(k, DataType::BF16);
                    assert!(spec.name_expressions.contains(&expr), "{expr}");
                }
            }
        }
    }
}
