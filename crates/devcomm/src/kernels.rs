//! The kernels the library loads, named one way: [`KernelKind`] names a kernel module (a
//! family), [`kernel_spec`] gives its [`KernelSpec`] for a configuration and for a job with or
//! without network links, and `load` is the one path by which the library compiles or loads a
//! module. Because `load` builds its spec with [`kernel_spec`], a spec that a user prewarms
//! ([`crate::Comm::prewarm`], [`crate::Comm::kernel_spec`]) or precompiles (`devcomm
//! precompile`) from the same kind and settings has the cache key of the call's load.
//!
//! `load` marks the rank as loading in the store (`Group::loading`) for the whole compile or
//! load: a peer already waiting at the kernel's gate then waits up to the setup timeout rather
//! than giving up after the device timeout (a compile takes seconds, the device timeout can be
//! shorter). No family calls `Jit::load` itself; a test below checks the sources for it.

use std::sync::{Arc, OnceLock};

use crate::collective::RawHooks;
use crate::config::Config;
use crate::error::Result;
use crate::group::Group;
use crate::jit::{Jit, KernelSpec, LoadedModule};
use crate::reduce::{DataType, ReduceOp};

/// A kernel module the library loads. Which calls load which:
///
/// | kind | calls |
/// |---|---|
/// | `SendRecv` | send/recv (every protocol, copy engine, network peers), zero-copy send/recv, the barrier without network links |
/// | `Collective { hooks }` | all-to-all, all-to-all-v, their hooked forms and hooked send/recv with `hooks` (the copy hooks of the element size for the plain forms: [`crate::raw::copy_hooks`]) |
/// | `Reduce { dtype, hooked }` | all-reduce, reduce-scatter, all-gather of `dtype` without network links (`hooked`: the operation and epilogue of `all_reduce_hooked`; all-gather uses the plain module) |
/// | `ReduceNetStep { dtype, hooked }` | the same calls with network links (their local steps; the data moves by the byte-copy collective, [`KernelKind::network_reduction`]) |
/// | `Moe { dtype }` | MoE dispatch and combine of rows of `dtype` (their local steps; the rows move by the 16-byte copy collective) |
/// | `TraceClock` | the GPU clock's offset, measured once at build with `DEVCOMM_TRACE=1` (docs/TRACING.md) |
///
/// With network links the barrier is the byte-copy collective ([`KernelKind::barrier`]).
#[derive(Debug, Clone, Copy)]
pub enum KernelKind<'a> {
    /// The send/recv module (every send/recv, zero-copy and copy-engine kernel, the barrier
    /// kernel and the network send/recv kernel).
    SendRecv,
    /// The collective kernel with `hooks`; with network links also its instantiation for
    /// network peers.
    Collective {
        /// The hooks compiled into the kernel.
        hooks: &'a RawHooks,
    },
    /// The reduction kernels of `dtype` over NVLink.
    Reduce {
        /// The element type.
        dtype: DataType,
        /// A hooked all-reduce's operation and epilogue; `None`: every plain kernel.
        hooked: Option<(ReduceOp, &'a RawHooks)>,
    },
    /// The local steps of the reductions of `dtype` with network peers.
    ReduceNetStep {
        /// The element type.
        dtype: DataType,
        /// A hooked all-reduce's operation and epilogue; `None`: every plain step.
        hooked: Option<(ReduceOp, &'a RawHooks)>,
    },
    /// The MoE layout, packing and combining kernels for rows of `dtype` (`crate::moe`).
    Moe {
        /// The rows' element type.
        dtype: DataType,
    },
    /// The kernel that reads `%globaltimer` for the trace's clock offset
    /// ([`crate::trace::clock`]); it records no events itself.
    TraceClock,
}

/// The byte-copy hooks of the network reductions' and barrier's all-to-alls.
fn byte_copy() -> &'static RawHooks {
    static HOOKS: OnceLock<RawHooks> = OnceLock::new();
    HOOKS.get_or_init(|| RawHooks::copy_of_size(1))
}

impl<'a> KernelKind<'a> {
    /// The kind of `Comm::barrier`: the send/recv module, or with network links the byte-copy
    /// collective.
    pub fn barrier(net_links: bool) -> KernelKind<'static> {
        match net_links {
            false => KernelKind::SendRecv,
            true => KernelKind::Collective { hooks: byte_copy() },
        }
    }

    /// Every kind a reduction (all-reduce, reduce-scatter, all-gather) of `dtype` loads:
    /// without network links its NVLink module; with them its local steps and the byte-copy
    /// collective.
    pub fn reduction(
        dtype: DataType,
        hooked: Option<(ReduceOp, &'a RawHooks)>,
        net_links: bool,
    ) -> Vec<KernelKind<'a>> {
        match net_links {
            false => vec![KernelKind::Reduce { dtype, hooked }],
            true => Self::network_reduction(dtype, hooked),
        }
    }

    /// The kinds of a reduction with network links: its local steps and the byte-copy
    /// collective that moves its data.
    pub fn network_reduction(
        dtype: DataType,
        hooked: Option<(ReduceOp, &'a RawHooks)>,
    ) -> Vec<KernelKind<'a>> {
        vec![
            KernelKind::ReduceNetStep { dtype, hooked },
            KernelKind::Collective { hooks: byte_copy() },
        ]
    }
}

/// The spec of `kind`'s module under `config` (its `DEVCOMM_*_OPTIONS`, part of the cache key)
/// in a job with (`net_links`) or without network links: what the library loads for it (each
/// family's `module_spec`, which its load path passes to [`crate::kernel_load::load`]).
pub fn kernel_spec(kind: KernelKind<'_>, config: &Config, net_links: bool) -> KernelSpec {
    match kind {
        KernelKind::SendRecv => crate::p2p::module_spec(config),
        KernelKind::Collective { hooks } => {
            crate::collective::module_spec(hooks, config, net_links)
        }
        KernelKind::Reduce { dtype, hooked } => {
            crate::reduce::specs::module_spec(dtype, hooked, false, config)
        }
        KernelKind::ReduceNetStep { dtype, hooked } => {
            crate::reduce::specs::module_spec(dtype, hooked, true, config)
        }
        KernelKind::Moe { dtype } => crate::moe::module_spec(dtype),
        // Nothing to configure, and no events of its own to record.
        KernelKind::TraceClock => crate::trace::clock::spec(),
    }
}

pub use crate::kernel_load::TRACE_OPTION;

/// Loads `kind`'s module ([`kernel_spec`] under the group's settings) through the one load
/// path ([`crate::kernel_load::load`]); for callers above the families (the communicator).
pub(crate) fn load(
    group: &Group,
    jit: &Jit,
    kind: KernelKind<'_>,
    net_links: bool,
) -> Result<Arc<LoadedModule>> {
    crate::kernel_load::load(group, jit, &kernel_spec(kind, &group.config, net_links))
}

#[cfg(test)]
#[path = "kernels_tests.rs"]
mod tests;
