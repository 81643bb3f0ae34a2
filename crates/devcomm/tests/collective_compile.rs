//! Compiles the collective kernel with NVRTC for sm_90 (no GPU needed): the default copy hooks
//! for every element size, both examples' hooks, the instantiation with network peers, and the
//! errors a user gets for bad hooks.
//!
//! Needs libnvrtc on the loader path; without it the tests print SKIPPED and pass, unless
//! `DEVCOMM_REQUIRE_NVRTC` is set (CI sets it).

mod common;
use common::{nvrtc_available, SM90};
use devcomm::jit;
use devcomm::{Config, Error, Hooks, KernelKind};

/// The collective's spec for `hooks`, as a communicator with default settings loads it
/// (`net`: with network links).
fn spec<I, O>(hooks: &Hooks<I, O>, net: bool) -> jit::KernelSpec {
    let kind = KernelKind::Collective { hooks: hooks.raw() };
    devcomm::kernel_spec(kind, &Config::default(), net)
}

fn compiles<I, O>(hooks: &Hooks<I, O>) {
    compiles_spec(hooks, spec(hooks, false), 2);
}

fn compiles_spec<I, O>(hooks: &Hooks<I, O>, spec: jit::KernelSpec, kernels: usize) {
    let module = jit::compile(&spec, SM90).unwrap_or_else(|e| panic!("{}: {e}", hooks.name()));
    assert_eq!(module.lowered_names.len(), kernels);
    for expr in &spec.name_expressions {
        assert!(module.lowered_names[expr].starts_with("_Z"), "{expr}");
    }
    assert!(
        module.log.is_empty(),
        "{}: warnings:\n{}",
        hooks.name(),
        module.log
    );
}

#[test]
fn copy_hooks_compile_for_every_element_size() {
    if !nvrtc_available() {
        return;
    }
    compiles(&Hooks::<u8>::copy());
    compiles(&Hooks::<u16>::copy());
    compiles(&Hooks::<f32>::copy());
    compiles(&Hooks::<u64>::copy());
    compiles(&Hooks::<[u32; 4]>::copy());
}

#[test]
fn network_instantiation_compiles() {
    if !nvrtc_available() {
        return;
    }
    // The kernel of a communicator with network links: the two NVLink instantiations and the
    // one whose network peers' roles go through the staging (docs/NETWORK.md).
    let copy = Hooks::<u16>::copy();
    let spec = spec(&copy, true);
    assert!(spec.name_expressions[2].ends_with(", true, true>"));
    compiles_spec(&copy, spec, 3);
}

#[test]
fn example_hooks_compile() {
    if !nvrtc_available() {
        return;
    }
    compiles(&Hooks::<f32, f32>::new(
        "Transpose",
        include_str!("../examples/hooks/transpose.cu"),
    ));
    compiles(&Hooks::<f32, f32>::new(
        "Fp8",
        include_str!("../examples/hooks/fp8.cu"),
    ));
}

#[test]
fn transpose_cost_variants_compile() {
    if !nvrtc_available() {
        return;
    }
    // The hooks `devcomm bench --hooks` times to place the transpose's cost
    // (scripts/experiments/transpose): kept compiling with the headers they use. These three
    // use every helper of the file; the other structs only combine them.
    let source = include_str!("../../../scripts/experiments/transpose/variants.cu");
    for name in ["TPeers", "BlockedVec", "TSend"] {
        compiles(&Hooks::<f32, f32>::new(name, source));
    }
}

#[test]
fn a_hook_that_does_not_compile_names_its_line() {
    if !nvrtc_available() {
        return;
    }
    let source = "struct Bad {\n  using In = float; using Out = float; using Wire = float;\n  \
                  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {\n    \
                  return undefined_thing(c);\n  }\n  \
                  static __device__ void consume(const devcomm::Ctx&, const devcomm::Tile<float>&) {}\n};\n";
    let err = jit::compile(&spec(&Hooks::<f32, f32>::new("Bad", source), false), SM90).unwrap_err();
    let Error::Compile { log, .. } = err else {
        panic!("expected a compile error, got {err}");
    };
    assert!(log.contains("hooks.cu(4)"), "log:\n{log}");
    assert!(log.contains("undefined_thing"), "log:\n{log}");
}

#[test]
fn hooks_for_other_element_sizes_are_refused_by_the_compiler() {
    if !nvrtc_available() {
        return;
    }
    // Declared for f64 buffers, but the struct says float.
    let hooks = Hooks::<f64, f64>::new("devcomm::CopyHooks<float>", "");
    let err = jit::compile(&spec(&hooks, false), SM90).unwrap_err();
    let Error::Compile { log, .. } = err else {
        panic!("expected a compile error, got {err}");
    };
    assert!(log.contains("In type is not the size"), "log:\n{log}");
}
