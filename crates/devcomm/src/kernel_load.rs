//! The one load path of the library's kernel modules, below the kernel families: each family
//! builds its module's spec with [`configured`] (its `DEVCOMM_*_OPTIONS` and the trace option)
//! in a `module_spec` function, which is also what [`crate::kernels::kernel_spec`] returns for
//! its kind, and loads it through [`load`]. So the spec a user prewarms is the spec a call
//! loads, and every load marks the rank as loading (a peer at the kernel's gate waits for the
//! compile instead of giving up after the device timeout).

use std::sync::Arc;

use crate::error::Result;
use crate::group::Group;
use crate::jit::{Jit, KernelSpec, LoadedModule};

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
/// already running, which may wait on a peer), the rank marked as loading in the store
/// meanwhile. The only place where the library loads a kernel module.
pub(crate) fn load(group: &Group, jit: &Jit, spec: &KernelSpec) -> Result<Arc<LoadedModule>> {
    group.loading(|| {
        let module = jit.load(&group.ctx, spec)?;
        module.load_every_kernel()?;
        if let Some(trace) = group.trace.get() {
            trace.attach(&module)?;
        }
        Ok(module)
    })
}
