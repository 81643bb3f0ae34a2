//! Every environment switch of send/recv, read here and nowhere else in `p2p` (each once per
//! process, except [`SPLIT_ENV`], read when a communicator is built). [`Switches`] carries
//! the ones that [`super::plan::plan`] takes as arguments.

use std::sync::OnceLock;

#[allow(unused_imports)]
use super::config::{Protocol, ZcRoute};
use super::defaults::ZC_CE_MIN_BYTES;
#[allow(unused_imports)]
use super::defaults::{auto_pull, default_config, zero_copy_route, CE_DEFAULT_MIN};

/// Environment variable: `0` keeps messages of [`CE_DEFAULT_MIN`] bytes or more on the staged
/// protocol; otherwise the defaults give them the copy-engine layout where it was measured
/// faster (one role alone in a launch; docs/PROTOCOL.md, "Copy engine"). Set it alike on every
/// rank.
pub const CE_ENV: &str = "DEVCOMM_P2P_CE";

/// Whether the defaults may use [`Protocol::CopyEngine`] (see [`CE_ENV`]).
pub fn ce_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(CE_ENV).map_or(true, |v| v.trim() != "0"))
}

/// Environment variable: `0` keeps [`Protocol::LowLatency128`] out of the defaults (sizes it
/// would take go to the staged protocol). Set it alike on every rank.
pub const LL128_ENV: &str = "DEVCOMM_P2P_LL128";

/// Whether the defaults may use [`Protocol::LowLatency128`] (see [`LL128_ENV`]).
pub fn ll128_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(LL128_ENV).map_or(true, |v| v.trim() != "0"))
}

/// Environment variable: `1` makes every [`Protocol::Bulk`] message pull, `0` push; unset,
/// [`auto_pull`] decides. Only the sender's setting matters: the receiver follows the choice
/// the sender records with each chunk.
pub const PULL_ENV: &str = "DEVCOMM_P2P_PULL";

/// Environment variable: the most blocks a zero-copy message uses (default 16).
pub const ZC_BLOCKS_ENV: &str = "DEVCOMM_ZC_BLOCKS";

/// Environment variable: the smallest zero-copy message, in bytes, that the sender's copy
/// engine moves (default [`ZC_CE_MIN_BYTES`]); `off` never. Sender and receiver both take the
/// route from the size, so set it alike on every rank.
pub const ZC_CE_MIN_ENV: &str = "DEVCOMM_ZC_CE_MIN";

/// Environment variable: `0` sends zero-copy messages between the low-latency size and the
/// copy-engine size by SM blocks straight into the receiver's buffer; otherwise (the default)
/// they take the staged path of [`default_config`] into it, measured faster there. Set it
/// alike on every rank.
pub const ZC_STAGED_ENV: &str = "DEVCOMM_ZC_STAGED";

/// The smallest zero-copy message the copy engine moves ([`ZC_CE_MIN_ENV`]).
pub fn zero_copy_ce_min() -> u64 {
    static MIN: OnceLock<u64> = OnceLock::new();
    *MIN.get_or_init(|| {
        parse_ce_min(std::env::var(ZC_CE_MIN_ENV).ok().as_deref()).unwrap_or(ZC_CE_MIN_BYTES)
    })
}

/// [`ZC_CE_MIN_ENV`]'s value: `off` is `u64::MAX`; anything unreadable is the default.
pub(super) fn parse_ce_min(v: Option<&str>) -> Option<u64> {
    match v.map(str::trim)? {
        "off" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}
