//! devcomm: device-initiated GPU communication.
//!
//! GPU kernels write into other GPUs' memory over NVLink and signal them directly; on that,
//! devcomm builds send/recv and collectives and lets users fuse small CUDA C++ hooks into the
//! transfer. `docs/ARCHITECTURE.md` describes the layers; each is a module here, and a layer
//! uses only the layers below it:
//!
//! | layer | module |
//! |---|---|
//! | 1 | [`cuda`]: the thin layer over cudarc (VMM, IPC, host-mapped memory, device queries) |
//! | 2 | `devcomm_bootstrap` (crate): ranks, store, fd passing, launcher |
//! | 3 | [`topology`]: link kind of every peer |
//! | 4 | [`memory`]: symmetric allocations and registered user buffers |
//! | 5 | [`device`]: the embedded CUDA headers (device API) |
//! | 6 | [`jit`]: NVRTC compilation with an on-disk cache |
//! | 8 | [`window`]: `Window<T>` and its `DeviceWindow` handle |
//! | 9 | [`p2p`], [`collective`]: send/recv and the hooked collectives on its protocol |
//! | top | [`Comm`] |
#![warn(missing_docs)]

pub mod collective;
pub mod comm;
pub mod cuda;
pub mod device;
pub mod error;
pub(crate) mod group;
pub mod handles;
pub mod jit;
pub mod memory;
pub mod p2p;
pub mod reduce;
pub mod topology;
pub mod window;

pub use collective::{AllToAllVCounts, Hooks};
pub use comm::{Comm, CommBuilder, HookArgs, RegisteredRange};
pub use error::{Error, Result};
pub use handles::{DeviceOp, DeviceWindow, RegisteredBuffer};
pub use reduce::{DataType, ReduceOp, Reducible};
pub use topology::{LinkKind, Topology};
