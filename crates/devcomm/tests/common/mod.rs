//! Shared by the NVRTC test files.

/// The architecture the library targets first (H100/H200).
pub const SM90: (u32, u32) = (9, 0);

/// Whether NVRTC can be loaded; without it the tests print SKIPPED and pass, unless
/// `DEVCOMM_REQUIRE_NVRTC` is set (CI sets it), which makes this panic.
pub fn nvrtc_available() -> bool {
    match devcomm::jit::nvrtc_version() {
        Ok(_) => true,
        Err(err) => {
            assert!(
                std::env::var_os("DEVCOMM_REQUIRE_NVRTC").is_none(),
                "DEVCOMM_REQUIRE_NVRTC is set but NVRTC is unusable: {err}"
            );
            eprintln!("SKIPPED: {err}");
            false
        }
    }
}
