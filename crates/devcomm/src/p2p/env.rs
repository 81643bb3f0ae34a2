//! Every environment switch of send/recv, read here and nowhere else in `p2p` (each once per
//! process, except [`SPLIT_ENV`], read when a communicator is built). [`Switches`] carries
//! the ones that `plan::plan` takes as arguments.

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

/// [`ZC_BLOCKS_ENV`]: the most blocks a zero-copy message uses (default 16).
pub fn zero_copy_blocks_cap() -> u64 {
    static CAP: OnceLock<u64> = OnceLock::new();
    *CAP.get_or_init(|| {
        std::env::var(ZC_BLOCKS_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(16)
    })
}

/// [`ZC_STAGED_ENV`]: zero-copy messages between the low-latency and copy-engine sizes take
/// the staged path (default) rather than SM blocks.
pub fn zero_copy_staged() -> bool {
    static STAGED: OnceLock<bool> = OnceLock::new();
    *STAGED.get_or_init(|| std::env::var(ZC_STAGED_ENV).map_or(true, |v| v.trim() != "0"))
}

/// [`ZC_CE_MIN_ENV`]'s value: `off` is `u64::MAX`; anything unreadable is the default.
pub(super) fn parse_ce_min(v: Option<&str>) -> Option<u64> {
    match v.map(str::trim)? {
        "off" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// Environment variable: `0` gives the split kernel's roles runs of consecutive blocks (all
/// senders, then all receivers) instead of taking blocks in turn (docs/PERFORMANCE.md, v12).
/// Only which block serves which (role, index) changes, not the channels, so ranks may differ.
pub const INTERLEAVE_ENV: &str = "DEVCOMM_P2P_INTERLEAVE";

/// [`INTERLEAVE_ENV`]: the split kernel's roles take blocks in turn (default).
pub fn split_interleave() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var(INTERLEAVE_ENV).map_or(true, |v| v.trim() != "0"))
}

/// Environment variable: `2` alternates the pushed copy-engine chunks between two copy
/// streams (for comparison; the default queues them on one). Only the sender's setting
/// matters.
pub const CE_STREAMS_ENV: &str = "DEVCOMM_P2P_CE_STREAMS";

/// Copy streams for pushed chunks. One: two streams let the copy engine run two pushes at once,
/// each at half the link, so both slots wait to be copied out at the same time and the link
/// idles meanwhile (1 GiB one way: 375 GB/s on two streams, 393 on one; docs/PERFORMANCE.md,
/// v15).
pub fn ce_copy_streams() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(
        || match std::env::var(CE_STREAMS_ENV).as_deref().map(str::trim) {
            Ok("2") => 2,
            _ => 1,
        },
    )
}

/// Environment variable: which engines a launch that sends to and receives from the same peer
/// by copy engine uses for its copy-engine halves, as `SEND-RECV` with each of `ce` or `sm`
/// (the pushed chunks of its send, the pulled chunks of its receive). A one-way launch always
/// uses the copy engine for both. Each side's choice is its own: the slots and signals are
/// the same either way.
pub const CE_BOTH_ENV: &str = "DEVCOMM_P2P_CE_BOTH";

/// [`CE_BOTH_ENV`] as [send role by SMs, receive role by SMs]: whether the sending or
/// receiving side of a copy-engine message with an explicit configuration moves its
/// copy-engine half by SMs when the launch also moves data the other way with the same peer
/// (default `sm-ce`: SMs push, the receiver's copy engine pulls, the fastest of the four both
/// ways: docs/PERFORMANCE.md, v15).
pub fn ce_both() -> [bool; 2] {
    static MODE: OnceLock<[bool; 2]> = OnceLock::new();
    *MODE.get_or_init(|| parse_ce_both(&std::env::var(CE_BOTH_ENV).unwrap_or_default()))
}

/// [`CE_BOTH_ENV`]'s value as [send role by SMs, receive role by SMs]; anything but the
/// other engine keeps a role's default (SMs push, the copy engine pulls).
pub(super) fn parse_ce_both(value: &str) -> [bool; 2] {
    let mut parts = value.trim().split('-');
    let send_sm = parts.next() != Some("ce");
    let recv_sm = parts.next() == Some("sm");
    [send_sm, recv_sm]
}

/// Environment variable: `0` runs both directions in one block per index (warp-specialised
/// roles sharing a CTA); otherwise, when both roles have the same thread count, sender and
/// receiver roles get blocks of their own in the same launch.
pub const SPLIT_ENV: &str = "DEVCOMM_P2P_SPLIT";

/// `DEVCOMM_P2P_OPTIONS`: extra NVRTC options for the send/recv kernels, split at whitespace
/// (e.g. `-DDC_LL128_UNROLL=4`, docs/TUNING.md). For experiments: both ends of a transfer must
/// use the same. Part of the kernel cache's key.
pub const P2P_OPTIONS_ENV: &str = "DEVCOMM_P2P_OPTIONS";

/// [`P2P_OPTIONS_ENV`] split at whitespace.
pub fn p2p_options() -> &'static [String] {
    static OPTIONS: OnceLock<Vec<String>> = OnceLock::new();
    OPTIONS.get_or_init(|| crate::jit::env_options(P2P_OPTIONS_ENV))
}

/// [`SPLIT_ENV`]: both directions in blocks of their own (read each time; a communicator
/// reads it once, when it is built).
pub fn split_from_env() -> bool {
    std::env::var(SPLIT_ENV).map_or(true, |v| v.trim() != "0")
}

/// [`PULL_ENV`]: `Some(true)` every bulk message pulls, `Some(false)` pushes, `None` the size
/// decides ([`auto_pull`]).
pub fn pull_forced() -> Option<bool> {
    static FORCE: OnceLock<Option<bool>> = OnceLock::new();
    *FORCE.get_or_init(|| match std::env::var(PULL_ENV).as_deref().map(str::trim) {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    })
}

/// The environment switches that decide a send/recv call's plan (`plan::plan`),
/// passed to it as arguments so that the decision is a pure function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    /// [`LL128_ENV`]: the defaults may use LL128.
    pub ll128: bool,
    /// [`CE_ENV`]: the defaults may use the copy engine.
    pub ce: bool,
    /// [`PULL_ENV`]: bulk messages forced to pull or push.
    pub pull: Option<bool>,
    /// [`CE_BOTH_ENV`]: [send role by SMs, receive role by SMs] in a launch both ways.
    pub ce_both: [bool; 2],
    /// [`SPLIT_ENV`]: both directions in blocks of their own.
    pub split: bool,
    /// [`INTERLEAVE_ENV`]: the split kernel's roles take blocks in turn.
    pub interleave: bool,
}

impl Default for Switches {
    /// What an unset environment gives.
    fn default() -> Self {
        Self {
            ll128: true,
            ce: true,
            pull: None,
            ce_both: [true, false],
            split: true,
            interleave: true,
        }
    }
}

impl Switches {
    /// The process's switches, with [`SPLIT_ENV`] as the communicator read it (`split`).
    pub fn current(split: bool) -> Self {
        Self {
            ll128: ll128_enabled(),
            ce: ce_enabled(),
            pull: pull_forced(),
            ce_both: ce_both(),
            split,
            interleave: split_interleave(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ce_both_names_each_roles_engine() {
        assert_eq!(parse_ce_both(""), [true, false]);
        assert_eq!(parse_ce_both("sm-ce"), [true, false]);
        assert_eq!(parse_ce_both("ce-ce"), [false, false]);
        assert_eq!(parse_ce_both("ce-sm"), [false, true]);
        assert_eq!(parse_ce_both(" sm-sm "), [true, true]);
        assert_eq!(parse_ce_both("ce"), [false, false]);
    }

    #[test]
    fn default_switches_are_an_unset_environment() {
        assert_eq!(Switches::default().ce_both, parse_ce_both(""));
    }
}
