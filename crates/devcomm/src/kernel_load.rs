//! The one load path of the library's kernel modules, below the kernel families: each family
//! builds its module's spec with [`configured`] (its `DEVCOMM_*_OPTIONS` and the trace option)
//! in a `module_spec` function, which is also what [`crate::kernels::kernel_spec`] returns for
//! its kind, and loads it through [`load`]. So the spec a user prewarms is the spec a call
//! loads, and every compile marks the rank as loading (a peer at the kernel's gate waits for
//! the compile instead of giving up after the device timeout).

use std::sync::Arc;

use crate::error::Result;
use crate::group::Group;
use crate::jit::{Jit, KernelSpec, LoadedModule, Prepared};

/// The NVRTC option that compiles the kernels' timeline events in (`cuda/devcomm/trace.cuh`).
pub const TRACE_OPTION: &str = "-DDC_TRACE=1";

/// `spec` with a family's extra NVRTC `options` and, with tracing on, [`TRACE_OPTION`]: both
/// part of the cache key.
pub(crate) fn configured(mut spec: KernelSpec, options: &[String], trace: bool) -> KernelSpec {
    spec.options.extend(options.iter().cloned());
    if trace {
        // Another cache key; without it the source and options are those of an untraced build.
        spec.options.push(TRACE_OPTION.to_owned());
    }
    spec
}

/// Loads the module of `spec` (a family's `module_spec`) with every kernel's code (not at its
/// first launch: under the driver's lazy loading a kernel's first launch can wait for kernels
/// already running, which may wait on a peer). The only place where the library loads a
/// kernel module.
///
/// Only the compile (NVRTC or the disk cache: seconds, and no GPU work) runs with the rank
/// marked as loading in the store. The driver's load, the kernels' code and the trace ring's
/// address can each wait for this rank's kernels already running; those kernels may wait for
/// a peer's next call, and that peer's first launch of a kernel waits at its gate while any
/// rank is marked as loading ([`crate::group::KernelGate`]). Marked through those steps, two
/// ranks would wait on each other until the device timeout.
pub(crate) fn load(group: &Group, jit: &Jit, spec: &KernelSpec) -> Result<Arc<LoadedModule>> {
    let module = match group.loading(|| jit.compile_for(&group.ctx, spec))? {
        Prepared::Loaded(loaded) => loaded,
        Prepared::Compiled(compiled) => jit.load_compiled(&group.ctx, compiled)?,
    };
    module.load_every_kernel()?;
    if let Some(trace) = group.trace.get() {
        trace.attach(&module)?;
    }
    Ok(module)
}
