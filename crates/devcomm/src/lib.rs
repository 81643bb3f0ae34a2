//! devcomm: device-initiated GPU communication.
//!
//! GPU kernels write into other GPUs' memory over NVLink and signal them directly; on that,
//! devcomm builds send/recv and collectives and lets users fuse small CUDA C++ hooks into the
//! transfer. `docs/ARCHITECTURE.md` describes the layers; each is a module here, and a layer
//! uses only the layers below it:
//!
//! | layer | module |
//! |---|---|
//! | 0 | [`abi`]: constants shared with the kernels (copy-engine words, `P2PSide` bits) |
//! | 1 | [`cuda`]: the thin layer over cudarc (VMM, IPC, host-mapped memory, device queries, NVRTC); the only caller of cudarc's raw bindings |
//! | 2 | `devcomm_bootstrap` (crate): ranks, store, fd passing, launcher |
//! | 3 | [`topology`]: link kind of every peer |
//! | 4 | [`memory`]: symmetric allocations and registered user buffers |
//! | 5 | [`device`]: the embedded CUDA headers (device API) |
//! | 6 | [`jit`]: compilation through `cuda::nvrtc` with an on-disk cache |
//! | 8 | [`window`]: `Window<T>` and its `DeviceWindow` handle |
//! | 9 | [`p2p`] (`plan` decides, `launch` carries out), [`collective`]: send/recv and the hooked collectives on its protocol |
//! | top | [`Comm`] ([`comm`]: builder, setup, send/recv, collectives, tiles, registration) |
#![warn(missing_docs)]

pub mod abi;
pub mod collective;
pub mod comm;
pub mod config;
pub mod cuda;
pub mod device;
pub mod error;
pub(crate) mod group;
pub mod handles;
pub mod jit;
pub mod memory;
pub mod p2p;
pub mod testing;
pub mod topology;
pub mod window;

pub use collective::{AllToAllVCounts, Hooks};
pub use comm::{Comm, CommBuilder, HookArgs, RegisteredRange, Registration};
pub use config::Config;
pub use error::{Error, Result};
pub use handles::{DeviceOp, DeviceWindow, RegisteredBuffer};
pub use topology::{LinkKind, Topology};
