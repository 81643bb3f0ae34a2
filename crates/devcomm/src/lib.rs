//! devcomm: device-initiated GPU communication.
//!
//! GPU kernels write into other GPUs' memory over NVLink and signal them directly; on that,
//! devcomm builds send/recv and collectives and lets users fuse small CUDA C++ hooks into the
//! transfer. `docs/ARCHITECTURE.md` describes the layers; each is a module here, and a layer
//! uses only the layers below it and its own (`scripts/check_layers.py` checks every
//! `crate::` path against this table; an import that had to run up would be listed, with
//! why, in `scripts/layer-exceptions.txt`, empty today):
//!
//! | layer | modules | what |
//! |---|---|---|
//! | 0 | `handles`, [`error`], [`config`], [`abi`] | the `#[repr(C)]` twins of the device handles; the one error type (and the network's, with the wording of its error records); every knob with its environment variable; what the kernels share with the host: constants, every launch struct and the network structs |
//! | 1 | `cuda` | the thin layer over cudarc (VMM, IPC, host-mapped memory, device queries, graph capture, NVRTC); the only caller of cudarc's raw bindings |
//! | 2 | [`topology`], `mesh`, [`device`] | link kind of every peer; the mesh: each peer's transport, decided once at setup (what the operation families ask instead of link kinds or network flags); the embedded CUDA headers (device API) |
//! | 3 | [`jit`], [`trace`] | compilation through `cuda::nvrtc` with an on-disk cache; the device event rings, the GPU clock and the merge into one trace |
//! | 4 | `group`, `kernel_load` | rank, store (`devcomm_bootstrap`), context, topology, error state and trace in one `Arc`; the one load path of the kernel modules |
//! | 5 | `net`, `memory` | the network transport (UCX proxy, descriptor queues, routes); symmetric allocations, registered user buffers and the memory pool |
//! | 6 | `window_net`, `window` | a window's network side; [`Window<T>`](Window) and its [`DeviceWindow`] handle |
//! | 7 | [`p2p`], `collective` | send/recv (`plan` decides, `launch` carries out); the hooked collectives on its protocol |
//! | 8 | [`reduce`], [`moe`] | the reductions (planners, window and launch); MoE dispatch and combine, the pure part (row layout, buffer sizes, the host reference) |
//! | 9 | [`kernels`] | every kernel module by kind and its spec |
//! | top | `comm`, [`testing`] | [`Comm`]: builder, setup, send/recv, collectives, hooked send/recv, zero-copy, registration, reductions, MoE; helpers of the self-test on raw device memory |
//!
//! The public surface is what a user needs: [`Comm`] and the types its calls take and return
//! (re-exported here), the kernel ABI ([`abi`]), the kernel compiler ([`jit`]) and the kernels'
//! specs by kind ([`kernels`]), the send/recv
//! settings ([`p2p`]), the device headers ([`device`]) and [`testing`] (helpers of the
//! self-test on raw device memory; in [`testing::net`], the pieces of the crate-private network
//! transport that the network tests drive from host threads). Everything else is crate-private,
//! and `unreachable_pub` holds in every module: a `pub` item is one a user can reach. The
//! naming of the communicator's calls is in `docs/ARCHITECTURE.md`, "API naming".
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod abi;
pub(crate) mod collective;
pub(crate) mod comm;
pub mod config;
pub(crate) mod cuda;
pub mod device;
pub mod error;
pub(crate) mod group;
pub(crate) mod handles;
pub mod jit;
pub(crate) mod kernel_load;
pub mod kernels;
pub(crate) mod memory;
pub(crate) mod mesh;
pub mod moe;
pub(crate) mod net;
pub mod p2p;
pub mod reduce;
pub mod testing;
pub mod topology;
pub mod trace;
pub(crate) mod window;
pub(crate) mod window_net;

pub use abi::net::WindowNetHandle;
pub use abi::{DeviceOp, DeviceWindow, RegisteredBuffer};
pub use collective::{AllToAllVCounts, CollShape, Hooks, RawHooks};
pub use comm::raw;
pub use comm::{
    Comm, CommBuilder, DispatchBuffers, HookArgs, Moe, PoolSlice, RegisteredRange, Registration,
    Tuning,
};
pub use config::Config;
pub use cuda::ensure_driver;
pub use cuda::info::DeviceInfo;
pub use error::{Error, Result};
pub use kernels::{kernel_spec, KernelKind};
pub use memory::{PoolAllocator, PoolLocation, PoolUsage};
pub use moe::{MoeConfig, MoePlan};
pub use reduce::{DataType, ReduceOp, Reducible};
pub use topology::{LinkKind, Topology};
pub use window::Window;
