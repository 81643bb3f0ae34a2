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
    embed!("call_word.cuh"),
    embed!("ordering.cuh"),
    embed!("trace.cuh"),
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
    embed!("window_net.cuh"),
    embed!("reduce.cuh"),
    embed!("fp8.cuh"),
    embed!("devcomm.cuh"),
];

/// The umbrella header's include name.
pub const UMBRELLA: &str = "devcomm/devcomm.cuh";

/// Looks up an embedded header by include name.
pub fn header(include_name: &str) -> Option<&'static str> {
    HEADERS
        .iter()
        .find(|(name, _)| *name == include_name)
        .map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::HEADERS;

    /// Headers hold device functions; kernels live in `cuda/kernels/` (docs/ARCHITECTURE.md,
    /// "Kernels at run time").
    #[test]
    fn no_header_defines_a_kernel() {
        for (name, text) in HEADERS {
            assert!(
                !text.contains("__global__"),
                "{name} defines a kernel: move it into cuda/kernels/"
            );
        }
    }
}
