//! Compiles the MoE kernels with NVRTC for sm_90 (no GPU needed), for every row type, and checks
//! that `MoeArgs` has the size of its twin in `src/moe/mod.rs` (a `static_assert` in the module).
//!
//! Needs libnvrtc on the loader path; without it the test prints SKIPPED and passes, unless
//! `DEVCOMM_REQUIRE_NVRTC` is set (CI sets it).

mod common;
use common::{nvrtc_available, SM90};
use devcomm::{jit, kernel_spec, moe, Config, DataType, KernelKind};

#[test]
fn every_row_type_compiles() {
    if !nvrtc_available() {
        return;
    }
    for dtype in [DataType::BF16, DataType::F16, DataType::F32] {
        let spec = kernel_spec(KernelKind::Moe { dtype }, &Config::default(), false);
        assert_eq!(spec.name_expressions.len(), moe::KERNELS.len());
        let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        for expr in &spec.name_expressions {
            assert!(module.lowered_names.contains_key(expr), "{expr}");
        }
        assert!(module.log.is_empty(), "{dtype}: warnings:\n{}", module.log);
    }
}
