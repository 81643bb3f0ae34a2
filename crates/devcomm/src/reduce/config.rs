//! The reductions' window sizes: the pure rule that turns the settings (`Config::reduce_*`,
//! docs/CONFIG.md, "reductions"; every rank holds the same, compared at setup) and the group's
//! smallest SM count into [`ReduceLimits`].

use super::plan::ReduceLimits;

/// The limits on `world` ranks from the settings (`None`: the default; an explicit
/// `max_blocks` bounds every algorithm, the staged two-shot's 64 and the long pipelined
/// calls' 128 included) and the smallest SM count of the group (a GPU's, or a rank's share
/// where ranks share one): at most half its SMs in blocks, so that ranks sharing a GPU for
/// tests and the next kernel's early blocks still find room; long pipelined calls, which
/// gain from every SM, all but 4 of them.
pub(crate) fn limits(
    world: usize,
    max_blocks: Option<u32>,
    one_shot_kib: Option<u32>,
    zero_copy_one_shot_kib: Option<u32>,
    chunk_mib: Option<u32>,
    fewest_sms: u32,
) -> ReduceLimits {
    let d = ReduceLimits::for_world(world);
    ReduceLimits {
        block_bytes: d.block_bytes,
        one_shot_blocks: d.one_shot_blocks,
        zero_copy_min_bytes: d.zero_copy_min_bytes,
        line_two_shot_bytes: d.line_two_shot_bytes,
        max_blocks: max_blocks
            .unwrap_or(d.max_blocks)
            .min((fewest_sms / 2).max(1)),
        staged_max_blocks: max_blocks
            .unwrap_or(d.staged_max_blocks)
            .min((fewest_sms / 2).max(1)),
        wide_max_blocks: max_blocks
            .unwrap_or(d.wide_max_blocks)
            .min(fewest_sms.saturating_sub(4).max(1)),
        one_shot_bytes: one_shot_kib.map_or(d.one_shot_bytes, |k| u64::from(k) << 10),
        zero_copy_one_shot_bytes: zero_copy_one_shot_kib
            .map_or(d.zero_copy_one_shot_bytes, |k| u64::from(k) << 10),
        chunk_bytes: chunk_mib.map_or(d.chunk_bytes, |m| u64::from(m.max(1)) << 20),
    }
}

/// `limits` with tracing on: no line algorithm (the one-shot and the two-shot on LL128 lines)
/// unless its limit was set explicitly (`one_shot_set`, `line_two_shot_set`: the experimental
/// `DEVCOMM_REDUCE_ONE_SHOT_KIB` / `DEVCOMM_REDUCE_LINE_TWO_SHOT_KIB`, to study the defect
/// below); every other size takes the staged two-shot, or on pool buffers the zero-copy paths.
/// Traced, the line algorithms returned stale first words of some lines (those that thread 0
/// of a block, the one that records the events, writes or reads) on 4 H200s, although they
/// pass every check untraced (docs/PERFORMANCE.md, "Tracing and the line reductions"). So a
/// trace of a small reduction shows the staged two-shot, not what an untraced call runs.
pub(crate) fn without_lines(
    limits: ReduceLimits,
    one_shot_set: bool,
    line_two_shot_set: bool,
) -> ReduceLimits {
    ReduceLimits {
        one_shot_bytes: if one_shot_set {
            limits.one_shot_bytes
        } else {
            0
        },
        line_two_shot_bytes: if line_two_shot_set {
            limits.line_two_shot_bytes
        } else {
            0
        },
        ..limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fit_the_gpu() {
        assert_eq!(
            limits(2, None, None, None, None, 132),
            ReduceLimits::for_world(2)
        );
        // Rounds of 64 MiB on 2 ranks, 32 on more.
        assert_eq!(ReduceLimits::for_world(2).chunk_bytes, 64 << 20);
        assert_eq!(limits(4, None, None, None, None, 132).chunk_bytes, 32 << 20);
        assert_eq!(
            limits(2, Some(64), None, None, Some(32), 100).max_blocks,
            50
        );
        // Half the SMs of the smallest GPU (a 33-SM share: 16 blocks).
        assert_eq!(limits(4, None, None, None, Some(8), 33).max_blocks, 16);
        assert_eq!(
            limits(4, None, None, None, Some(8), 33).staged_max_blocks,
            16
        );
        assert_eq!(
            limits(4, None, None, None, Some(8), 132).staged_max_blocks,
            64
        );
        assert_eq!(
            limits(4, Some(8), None, None, Some(8), 132).staged_max_blocks,
            8
        );
        assert_eq!(limits(4, None, None, None, Some(8), 1).max_blocks, 1);
        // Long pipelined calls: all but 4 SMs, or an explicit limit.
        assert_eq!(
            limits(4, None, None, None, Some(8), 132).wide_max_blocks,
            128
        );
        assert_eq!(limits(4, None, None, None, Some(8), 66).wide_max_blocks, 62);
        assert_eq!(
            limits(4, Some(32), None, None, Some(8), 132).wide_max_blocks,
            32
        );
        assert_eq!(limits(4, None, None, None, Some(8), 3).wide_max_blocks, 1);
        assert_eq!(
            limits(4, None, None, None, Some(8), 132).one_shot_bytes,
            512 << 10
        );
    }

    #[test]
    fn tracing_leaves_the_line_algorithms() {
        use crate::reduce::plan::{plan, Algorithm, Collective, Shape};
        let untraced = ReduceLimits::for_world(4);
        let traced = without_lines(untraced, false, false);
        assert_eq!((traced.one_shot_bytes, traced.line_two_shot_bytes), (0, 0));
        // A limit set explicitly stays (to study the traced line kernels).
        let kept = without_lines(untraced, true, false);
        assert_eq!(kept.one_shot_bytes, untraced.one_shot_bytes);
        assert_eq!(kept.line_two_shot_bytes, 0);
        let kept = without_lines(untraced, false, true);
        assert_eq!(kept.line_two_shot_bytes, untraced.line_two_shot_bytes);
        for bytes in [8u64, 4096, 256 << 10, 1 << 20, 2 << 20] {
            let shape = Shape {
                collective: Collective::AllReduce,
                count: bytes / 2,
                elem_bytes: 2,
                world: 4,
                row_len: None,
            };
            let algorithm = |l: &ReduceLimits| plan(&shape, l).map(|p| p.algorithm);
            assert_eq!(algorithm(&traced), Ok(Algorithm::TwoShot), "{bytes} B");
            assert_ne!(algorithm(&untraced), Ok(Algorithm::TwoShot), "{bytes} B");
        }
    }

    #[test]
    fn settings_override_the_defaults() {
        let l = limits(2, Some(8), Some(0), Some(64), Some(2), 132);
        assert_eq!(
            (
                l.max_blocks,
                l.one_shot_bytes,
                l.chunk_bytes,
                l.zero_copy_one_shot_bytes
            ),
            (8, 0, 2 << 20, 64 << 10)
        );
        let l = limits(8, None, Some(256), None, Some(8), 132);
        assert_eq!(l.one_shot_bytes, 256 << 10);
        assert_eq!(l.chunk_bytes, 8 << 20);
    }
}
