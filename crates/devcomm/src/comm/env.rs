//! The communicator's environment variables: device and setup timeouts and the send/recv
//! window's sizes (every rank must see the same).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::p2p::P2PLimits;

/// Environment variable: bound of every device wait, in milliseconds (default 10,000).
pub const TIMEOUT_ENV: &str = "DEVCOMM_TIMEOUT_MS";
/// Environment variable: bound of every host setup step, in milliseconds (default 120,000).
pub const SETUP_TIMEOUT_ENV: &str = "DEVCOMM_SETUP_TIMEOUT_MS";

pub(super) const DEFAULT_DEVICE_TIMEOUT: Duration = Duration::from_secs(10);
pub(super) const DEFAULT_SETUP_TIMEOUT: Duration = Duration::from_secs(120);

/// Environment variables that size the send/recv window (every rank must see the same).
pub const P2P_SLOT_KIB_ENV: &str = "DEVCOMM_P2P_SLOT_KIB";
/// Staging slots per channel.
pub const P2P_DEPTH_ENV: &str = "DEVCOMM_P2P_DEPTH";
/// Most blocks per direction of a send/recv launch (1 to 64, default 32): the channels, their
/// staging and signals, and the low-latency credit slots scale with it. For experiments; set
/// it alike on every rank.
pub const P2P_MAX_BLOCKS_ENV: &str = "DEVCOMM_P2P_MAX_BLOCKS";

pub(super) fn p2p_limits_env() -> Result<P2PLimits> {
    let mut limits = P2PLimits::default();
    // A variable's value if set: a number in `lo..=hi` (`unit` names it in the error).
    let parse = |var: &'static str, lo: u64, hi: u64, unit: &str| -> Result<Option<u64>> {
        let Ok(v) = std::env::var(var) else {
            return Ok(None);
        };
        let n = v
            .trim()
            .parse::<u64>()
            .map_err(|_| Error::InvalidArgument {
                op: "Comm",
                reason: format!("{var}={v:?} is not a number"),
            })?;
        if !(lo..=hi).contains(&n) {
            return Err(Error::InvalidArgument {
                op: "Comm",
                reason: format!("{var}={n}: use {lo} to {hi}{unit}"),
            });
        }
        Ok(Some(n))
    };
    if let Some(kib) = parse(P2P_SLOT_KIB_ENV, 1, 1024, " KiB")? {
        limits.slot_bytes = kib << 10;
    }
    if let Some(depth) = parse(P2P_DEPTH_ENV, 2, 16, "")? {
        limits.depth = depth as u32;
    }
    if let Some(blocks) = parse(P2P_MAX_BLOCKS_ENV, 1, 64, "")? {
        limits.max_blocks = blocks as u32;
    }
    Ok(limits)
}

pub(super) fn duration_env(var: &'static str, default: Duration) -> Result<Duration> {
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| Error::InvalidArgument {
                op: "Comm",
                reason: format!("{var}={v:?} is not milliseconds"),
            }),
        Err(_) => Ok(default),
    }
}
