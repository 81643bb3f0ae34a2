//! The reductions' knobs: environment variables for experiments (every rank must set the same;
//! the smallest value across ranks is used) and the pure rule that turns them and the group's
//! smallest SM count into the window's [`ReduceLimits`].

use super::plan::{ReduceLimits, MAX_BLOCKS};
use crate::error::{Error, Result};

/// Environment variable: most blocks of a two-shot reduction launch (1 to 32; default 32, at
/// most half the SMs of the smallest GPU). Functional tests of 3 or more ranks sharing one GPU
/// set 8 (scripts/shared-gpu.sh).
pub const MAX_BLOCKS_ENV: &str = "DEVCOMM_REDUCE_MAX_BLOCKS";
/// Environment variable: largest one-shot payload in KiB (0 to 1024; 0 turns the one-shot
/// off; default 128 on 2 ranks, 64 on 3-4, 32 on more).
pub const ONE_SHOT_KIB_ENV: &str = "DEVCOMM_REDUCE_ONE_SHOT_KIB";
/// Environment variable: MiB one two-shot round stages per rank (1 to 256; default 8); the
/// window holds two of them.
pub const CHUNK_MIB_ENV: &str = "DEVCOMM_REDUCE_CHUNK_MIB";

/// The knobs as this rank sees them: `[max blocks, one-shot KiB, chunk MiB]`, `u32::MAX` for
/// an unset one (the default), or the first bad value's error.
pub(crate) fn knobs_from_env() -> Result<[u32; 3]> {
    let read = |var: &'static str, lo: u32, hi: u32| -> Result<u32> {
        let Ok(v) = std::env::var(var) else {
            return Ok(u32::MAX);
        };
        match v.trim().parse::<u32>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(Error::InvalidArgument {
                op: "Comm",
                reason: format!("{var}={v:?}: use {lo} to {hi}"),
            }),
        }
    };
    Ok([
        read(MAX_BLOCKS_ENV, 1, MAX_BLOCKS)?,
        read(ONE_SHOT_KIB_ENV, 0, 1024)?,
        read(CHUNK_MIB_ENV, 1, 256)?,
    ])
}

/// The limits on `world` ranks from the knobs (smallest across ranks, `u32::MAX` = default)
/// and the smallest SM count of the group: at most half its SMs in blocks, so that the
/// ranks sharing a GPU for tests and the next kernel's early blocks still find room.
pub(crate) fn limits(world: usize, knobs: [u32; 3], fewest_sms: u32) -> ReduceLimits {
    let d = ReduceLimits::for_world(world);
    let pick = |v: u32, default: u64, scale: u64| {
        if v == u32::MAX {
            default
        } else {
            u64::from(v) * scale
        }
    };
    ReduceLimits {
        max_blocks: (pick(knobs[0], u64::from(d.max_blocks), 1) as u32)
            .min((fewest_sms / 2).max(1)),
        one_shot_bytes: pick(knobs[1], d.one_shot_bytes, 1 << 10),
        chunk_bytes: pick(knobs[2], d.chunk_bytes, 1 << 20),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNSET: u32 = u32::MAX;

    #[test]
    fn defaults_fit_the_gpu() {
        let l = limits(2, [UNSET; 3], 132);
        assert_eq!(l, ReduceLimits::for_world(2));
        // Half the SMs of the smallest GPU (a 33-SM share: 16 blocks).
        assert_eq!(limits(4, [UNSET; 3], 33).max_blocks, 16);
        assert_eq!(limits(4, [UNSET; 3], 1).max_blocks, 1);
        assert_eq!(limits(4, [UNSET; 3], 132).one_shot_bytes, 64 << 10);
    }

    #[test]
    fn knobs_override_the_defaults() {
        let l = limits(2, [8, 0, 2], 132);
        assert_eq!(
            (l.max_blocks, l.one_shot_bytes, l.chunk_bytes),
            (8, 0, 2 << 20)
        );
        let l = limits(8, [UNSET, 256, UNSET], 132);
        assert_eq!(l.one_shot_bytes, 256 << 10);
        assert_eq!(l.chunk_bytes, 8 << 20);
    }
}
