//! devcomm: device-initiated GPU communication.
//!
//! GPU kernels write into other GPUs' memory over NVLink and signal them directly; on that,
//! devcomm builds send/recv and collectives and lets users fuse small CUDA C++ hooks into the
//! transfer. `docs/ARCHITECTURE.md` describes the layers; each is a module here, and a layer
//! uses only the layers below it:
//!
//! | layer | module |
//! |---|---|
//! | 0 | [`abi`]: what the kernels share with the host: constants (copy-engine words, `P2PSide` bits) and, re-exported, the `#[repr(C)]` twins (defined in `handles` and beside their launchers); [`error`]: the one error type; [`config`]: every knob with its environment variable |
//! | 1 | `cuda`: the thin layer over cudarc (VMM, IPC, host-mapped memory, device queries, graph capture, NVRTC); the only caller of cudarc's raw bindings |
//! | 2 | `devcomm_bootstrap` (crate): ranks, store, fd passing, launcher; `group`: rank, store, context, topology and error state in one `Arc` |
//! | 3 | [`topology`]: link kind of every peer |
//! | 4 | `memory`: symmetric allocations, registered user buffers and the memory pool; `net`: the network transport (UCX proxy, descriptor queues, routes; on `handles`, `config` and `topology` only) |
//! | 5 | [`device`]: the embedded CUDA headers (device API) |
//! | 6 | [`jit`]: compilation through `cuda::nvrtc` with an on-disk cache |
//! | 8 | `window`: [`Window<T>`](Window) and its [`DeviceWindow`] handle |
//! | 9 | [`p2p`] (`plan` decides, `launch` carries out), [`collective`]: send/recv and the hooked collectives on its protocol; [`kernels`]: every kernel module by kind, its spec, the one load path; `trace`: the device event rings and their merge |
//! | 10 | [`moe`]: MoE dispatch and combine, the pure part (row layout, buffer sizes, the host reference); [`reduce`]: the reductions (the pure planners: the one-shot and two-shot on LL128 lines, the staged two-shot, zero-copy on pool buffers; their window and launch) |
//! | top | [`Comm`] (`comm`: builder, setup, send/recv, collectives, hooked send/recv, zero-copy, registration); [`testing`]: helpers of the self-test on raw device memory |
//!
//! The public surface is what a user needs: [`Comm`] and the types its calls take and return
//! (re-exported here), the kernel ABI ([`abi`]), the kernel compiler ([`jit`]) and the kernels'
//! specs by kind ([`kernels`]), the send/recv
//! settings ([`p2p`]), the device headers ([`device`]) and [`testing`] (helpers of the
//! self-test on raw device memory). Everything else is crate-private. The naming of the
//! communicator's calls is in `docs/ARCHITECTURE.md`, "API naming".
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod abi;
// The modules below marked `allow(unreachable_pub)` still have `pub` items that are private
// to the crate; they are being changed by other work and follow in a later commit.
#[allow(unreachable_pub)]
pub mod collective;
pub(crate) mod comm;
#[allow(unreachable_pub)]
pub mod config;
#[allow(unreachable_pub)]
pub(crate) mod cuda;
pub mod device;
pub mod error;
pub(crate) mod group;
pub(crate) mod handles;
#[allow(unreachable_pub)]
pub mod jit;
pub(crate) mod kernel_load;
pub mod kernels;
pub(crate) mod memory;
pub mod moe;
#[allow(unreachable_pub)]
pub mod net;
#[allow(unreachable_pub)]
pub mod p2p;
#[allow(unreachable_pub)]
pub mod reduce;
pub mod testing;
#[allow(unreachable_pub)]
pub mod topology;
pub mod trace;
pub(crate) mod window;
pub(crate) mod window_net;

pub use abi::{DeviceOp, DeviceWindow, RegisteredBuffer};
pub use collective::{AllToAllVCounts, Hooks, RawHooks};
pub use comm::raw;
pub use comm::{
    Comm, CommBuilder, DispatchBuffers, HookArgs, Moe, PoolSlice, RegisteredRange, Registration,
};
pub use config::Config;
pub use cuda::ensure_driver;
pub use cuda::info::DeviceInfo;
pub use error::{Error, Result};
pub use kernels::{kernel_spec, KernelKind};
pub use memory::{PoolAllocator, PoolLocation, PoolUsage};
pub use moe::{MoeConfig, MoePlan};
pub use net::WindowNetHandle;
pub use reduce::{DataType, ReduceOp, Reducible};
pub use topology::{LinkKind, Topology};
pub use window::Window;
