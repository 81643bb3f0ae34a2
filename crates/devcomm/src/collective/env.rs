//! The collectives' environment variables, read here and nowhere else in `collective` (each
//! once per process).

use std::sync::OnceLock;

#[allow(unused_imports)]
use super::shape::fit_low_latency;
use super::shape::SELF_BLOCK_BYTES;

/// Environment variable: own-chunk KiB per block of the own chunk's role instead of
/// [`SELF_BLOCK_BYTES`] (experiments; every rank must set the same value). `0` gives the own
/// chunk as many blocks as a peer, as before this knob existed.
pub const SELF_BLOCK_ENV: &str = "DEVCOMM_COLL_SELF_BLOCK_KIB";

pub(super) fn self_block_bytes() -> u64 {
    // Read once: every launch of the process must use the same shape rule.
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var(SELF_BLOCK_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(SELF_BLOCK_BYTES, |k| k << 10)
    })
}

/// Environment variable: `0` keeps the full grid for small all-to-alls (see
/// [`fit_low_latency`]; experiments, every rank must set the same value).
pub const FIT_GRID_ENV: &str = "DEVCOMM_COLL_FIT_GRID";

pub(super) fn fit_grid() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var(FIT_GRID_ENV).map_or(true, |v| v.trim() != "0"))
}

/// `DEVCOMM_COLL_OPTIONS`: extra NVRTC options for the collective kernel, split at whitespace,
/// e.g. `-DDC_COLL_SELF_ILP=1`, to try other values of its tuning constants (the `DC_COLL_*`
/// macros of `cuda/devcomm/collective.cuh`, docs/TUNING.md). For experiments: every rank must
/// set the same, since both ends of a transfer derive their plan from these constants. They
/// are part of the kernel cache's key.
pub const OPTIONS_ENV: &str = "DEVCOMM_COLL_OPTIONS";

pub(super) fn options_from_env() -> &'static [String] {
    static OPTIONS: OnceLock<Vec<String>> = OnceLock::new();
    OPTIONS.get_or_init(|| crate::jit::env_options(OPTIONS_ENV))
}
