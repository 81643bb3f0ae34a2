//! The device API's test and benchmark kernels (`cuda/foundation.cu` of this crate): they
//! serve the self-test and the benchmarks only, so they live here and not in the library's
//! shipped sources. Compiled through the library's public JIT like a user's kernel.
//!
//! All kernels are `extern "C"`, so their lowered names are the names in [`KERNELS`]:
//!
//! - `put_signal_all(DeviceWindow w, const void* src, u64 bytes_per_peer, u64 round)`
//! - `wait_all(DeviceWindow w, u64 round, int* status)`
//! - `barrier_loop(DeviceWindow w, u64 iters, u64* scratch, int* status)`
//! - `read_registered(const RegisteredBuffer* reg, int peer, void* dst, u64 bytes)`
//! - `wait_forever(DeviceWindow w, int peer, u64 slot, int* status)`
//! - `pingpong(DeviceWindow w, int peer, u64 iters, u64 base, u64* elapsed_ns)`
//! - `put_bandwidth(DeviceWindow w, int peer, const void* src, u64 bytes)`
//! - `routed_rounds(DeviceWindow w, WindowNet n, u64 chunk, u64 first, u64 rounds, u64* bad,
//!   int* status)`
//! - `routed_barrier_loop(DeviceWindow w, WindowNet n, u64 iters, u64* scratch, int* status)`
//! - `routed_registered(DeviceWindow w, WindowNet n, const RegisteredBuffer* reg, u64 chunk,
//!   u64 round, u64* bad, int* status)`

use devcomm::jit::KernelSpec;

/// The CUDA C++ source.
const SOURCE: &str = include_str!("../cuda/foundation.cu");

/// The module's name (its NVRTC program is `foundation.cu`).
const NAME: &str = "foundation";

/// The kernels in [`SOURCE`], usable as name expressions.
pub(crate) const KERNELS: &[&str] = &[
    "put_signal_all",
    "wait_all",
    "barrier_loop",
    "read_registered",
    "wait_forever",
    "pingpong",
    "put_bandwidth",
    "routed_rounds",
    "routed_barrier_loop",
    "routed_registered",
];

/// The spec of the foundation module: [`SOURCE`] with every kernel of [`KERNELS`].
pub(crate) fn spec() -> KernelSpec {
    KERNELS
        .iter()
        .fold(KernelSpec::new(NAME, SOURCE), |s, k| s.name_expression(*k))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles the module for sm_90 with NVRTC (no GPU needed). Without NVRTC it prints
    /// SKIPPED and passes, unless `DEVCOMM_REQUIRE_NVRTC` is set (the test script sets it).
    #[test]
    fn foundation_kernels_compile_with_plain_names() {
        if let Err(err) = devcomm::jit::nvrtc_version() {
            assert!(
                std::env::var_os("DEVCOMM_REQUIRE_NVRTC").is_none(),
                "DEVCOMM_REQUIRE_NVRTC is set but NVRTC is unusable: {err}"
            );
            eprintln!("SKIPPED: {err}");
            return;
        }
        let module = devcomm::jit::compile(&spec(), (9, 0)).expect("foundation.cu compiles");
        for kernel in KERNELS {
            assert_eq!(
                module.lowered_names[*kernel], *kernel,
                "extern \"C\" names stay plain"
            );
        }
        assert!(module.log.is_empty(), "warnings:\n{}", module.log);
    }
}
