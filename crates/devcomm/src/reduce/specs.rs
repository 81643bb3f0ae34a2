//! The reductions' kernel modules: the source, the name expression of every instantiation
//! (algorithm, element type, operation, epilogue hook, or a local step of the network path) and
//! the module specs the JIT compiles and the launch loads.

use super::plan::Algorithm;
use super::types::{DataType, ReduceOp};
use crate::collective::RawHooks;
use crate::jit::KernelSpec;

/// The kernels' source (`cuda/kernels/reduce.cu`); instantiations are appended.
pub const KERNEL_SOURCE: &str = include_str!("../../cuda/kernels/reduce.cu");

/// The name expression of a kernel instantiation.
pub fn kernel_expression(
    algorithm: Algorithm,
    dtype: DataType,
    op: ReduceOp,
    hook: Option<&str>,
) -> String {
    let t = dtype.device_type();
    let op = op.code();
    let hook = hook.unwrap_or("devcomm::red::NoEpilogue");
    match algorithm {
        Algorithm::OneShot => format!("devcomm::red::one_shot_kernel<{t}, {op}, {hook}>"),
        Algorithm::LineTwoShot => format!("devcomm::red::line_two_shot_kernel<{t}, {op}>"),
        Algorithm::ZeroCopyOneShot | Algorithm::ZeroCopyTwoShot => {
            format!("devcomm::red::zero_copy_kernel<{t}, {op}, {hook}>")
        }
        _ => format!("devcomm::red::two_shot_kernel<{t}, {op}, {hook}>"),
    }
}

/// The module of `dtype`'s plain kernels: one-shot, two-shot on lines, two-shot and zero-copy
/// for every operation
/// (the all-gather runs the sum's instantiations, which it never reduces with).
pub(crate) fn kernel_spec(dtype: DataType) -> KernelSpec {
    let mut spec = KernelSpec::new(format!("reduce_{}", dtype.name()), KERNEL_SOURCE);
    for op in ReduceOp::ALL {
        for a in [
            Algorithm::OneShot,
            Algorithm::LineTwoShot,
            Algorithm::TwoShot,
            Algorithm::ZeroCopyTwoShot,
        ] {
            spec = spec.name_expression(kernel_expression(a, dtype, op, None));
        }
    }
    spec
}

/// The module of an all-reduce of `dtype` and `op` with the epilogue of `hooks` (one-shot on
/// lines, staged two-shot and zero-copy kernels): the kernels' source, then the user's (its
/// own line numbers in errors), then the check of the hook's type.
pub(crate) fn hooked_kernel_spec(dtype: DataType, op: ReduceOp, hooks: &RawHooks) -> KernelSpec {
    let mut spec = KernelSpec::new(
        format!("reduce_hooked_{}", dtype.name()),
        hooked_source(dtype, hooks),
    );
    for a in [
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::ZeroCopyTwoShot,
    ] {
        spec = spec.name_expression(kernel_expression(a, dtype, op, Some(hooks.name())));
    }
    spec
}

/// The kernels' source with the user's hooks appended, and the check of the hook's type.
fn hooked_source(dtype: DataType, hooks: &RawHooks) -> String {
    format!(
        "{KERNEL_SOURCE}\n#line 1 \"hooks.cu\"\n{src}\n#line 1 \"devcomm-checks\"\n\
         static_assert(sizeof({name}::T) == {size}, \"the hook's T is not the size of the \
         buffer's elements ({size} bytes, {dtype})\");\n",
        src = hooks.source(),
        name = hooks.name(),
        size = dtype.size_bytes(),
    )
}

/// The name expression of a local step of the reductions with network peers
/// (`net_step_kernel`).
pub fn net_step_expression(dtype: DataType, op: ReduceOp, hook: Option<&str>) -> String {
    format!(
        "devcomm::red::net_step_kernel<{}, {}, {}>",
        dtype.device_type(),
        op.code(),
        hook.unwrap_or("devcomm::red::NoEpilogue")
    )
}

/// The module of `dtype`'s local steps with network peers, every operation: loaded only by
/// communicators with network links, so NVLink jobs compile exactly what they did before.
pub(crate) fn net_step_spec(dtype: DataType) -> KernelSpec {
    let mut spec = KernelSpec::new(format!("reduce_net_{}", dtype.name()), KERNEL_SOURCE);
    for op in ReduceOp::ALL {
        spec = spec.name_expression(net_step_expression(dtype, op, None));
    }
    spec
}

/// The module of a hooked reduction's local step with network peers.
pub(crate) fn hooked_net_step_spec(dtype: DataType, op: ReduceOp, hooks: &RawHooks) -> KernelSpec {
    KernelSpec::new(
        format!("reduce_net_hooked_{}", dtype.name()),
        hooked_source(dtype, hooks),
    )
    .name_expression(net_step_expression(dtype, op, Some(hooks.name())))
}

/// The module of a reduction of `dtype` (with an epilogue: `hooked`) under `config`
/// (`DEVCOMM_REDUCE_OPTIONS`, tracing): the NVLink kernels, or the local steps of the network
/// path (`net_step`). What its load path loads and `crate::kernels::kernel_spec` returns.
pub(crate) fn module_spec(
    dtype: DataType,
    hooked: Option<(ReduceOp, &RawHooks)>,
    net_step: bool,
    config: &crate::config::Config,
) -> KernelSpec {
    let spec = match (hooked, net_step) {
        (None, false) => kernel_spec(dtype),
        (Some((op, h)), false) => hooked_kernel_spec(dtype, op, h),
        (None, true) => net_step_spec(dtype),
        (Some((op, h)), true) => hooked_net_step_spec(dtype, op, h),
    };
    crate::kernel_load::configured(spec, &config.reduce_options, config.trace)
}
