//! Layer 5: the device API, CUDA C++ headers embedded in the library.
//!
//! The headers live in `cuda/devcomm/` (namespace `devcomm`); kernels include the umbrella
//! `devcomm/devcomm.cuh`. The JIT ([`crate::jit`]) hands every header to NVRTC in memory, so
//! nothing needs to be installed on the machine that runs the kernels. `handles.cuh` holds the
//! structs shared with Rust ([`crate::abi`]).
//!
//! Rules the headers follow (DESIGN section 3): every operation takes its cooperating group;
//! signals are monotonic 64-bit values published with release semantics at system scope; every
//! wait is bounded by the window's timeout and the process-wide abort flag, and a caller whose
//! wait returns `false` stops without publishing further signals.

/// `(include name, text)` of one header under `cuda/devcomm/`.
macro_rules! embed {
    ($file:literal) => {
        (
            concat!("devcomm/", $file),
            include_str!(concat!("../cuda/devcomm/", $file)),
        )
    };
}

/// Every embedded header as `(include name, text)`, e.g. `("devcomm/window.cuh", "...")`.
/// The include name is what kernels write in `#include "..."`.
pub const HEADERS: &[(&str, &str)] = &[
    embed!("handles.cuh"),
    embed!("ordering.cuh"),
    embed!("group.cuh"),
    embed!("copy.cuh"),
    embed!("wait.cuh"),
    embed!("window.cuh"),
    embed!("barrier.cuh"),
    embed!("put.cuh"),
    embed!("registered.cuh"),
    embed!("p2p.cuh"),
    embed!("transfer_common.cuh"),
    embed!("bulk.cuh"),
    embed!("ll.cuh"),
    embed!("agree.cuh"),
    embed!("ll128.cuh"),
    embed!("low_latency.cuh"),
    embed!("transfer.cuh"),
    embed!("hooks.cuh"),
    embed!("collective.cuh"),
    embed!("net.cuh"),
    embed!("net_p2p.cuh"),
    embed!("reduce.cuh"),
    embed!("devcomm.cuh"),
];

/// The umbrella header's include name.
pub const UMBRELLA: &str = "devcomm/devcomm.cuh";

/// Source of the foundation's test and benchmark kernels (`cuda/kernels/foundation.cu`).
///
/// All kernels are `extern "C"`, so their lowered names are the names in
/// [`FOUNDATION_KERNELS`]:
///
/// - `put_signal_all(DeviceWindow w, const void* src, u64 bytes_per_peer, u64 round)`
/// - `wait_all(DeviceWindow w, u64 round, int* status)`
/// - `barrier_loop(DeviceWindow w, u64 iters, u64* scratch, int* status)`
/// - `read_registered(const RegisteredBuffer* reg, int peer, void* dst, u64 bytes)`
/// - `wait_forever(DeviceWindow w, int peer, u64 slot, int* status)`
/// - `pingpong(DeviceWindow w, int peer, u64 iters, u64 base, u64* elapsed_ns)`
/// - `put_bandwidth(DeviceWindow w, int peer, const void* src, u64 bytes)`
pub const FOUNDATION_SOURCE: &str = include_str!("../cuda/kernels/foundation.cu");

/// Name of the foundation module (its NVRTC program is `foundation.cu`).
pub const FOUNDATION_NAME: &str = "foundation";

/// The kernels in [`FOUNDATION_SOURCE`], usable as name expressions.
pub const FOUNDATION_KERNELS: &[&str] = &[
    "put_signal_all",
    "wait_all",
    "barrier_loop",
    "read_registered",
    "wait_forever",
    "pingpong",
    "put_bandwidth",
];

/// Looks up an embedded header by include name.
pub fn header(include_name: &str) -> Option<&'static str> {
    HEADERS
        .iter()
        .find(|(name, _)| *name == include_name)
        .map(|(_, text)| *text)
}
