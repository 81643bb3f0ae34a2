//! The plan of a tuned choice (docs/TUNING.md, "Reductions"): what a tuning table (or the
//! tuner, for the candidate it times) chooses for a size, the algorithm, its blocks and
//! whether the staged all-reduce pushes its reduced pieces, turned into a [`Plan`] when the
//! call can take it. A pure function of the call's shape, where its buffers lie, the window and
//! the choice, as the default planners ([`super::plan`], [`super::zero_copy_plan`]) are, and
//! built from them: the shards, rounds and units of a tuned plan are those the default
//! planners give the same algorithm, only the block count (and `pushed`) differ. Every
//! algorithm reduces element `i` in rank order, so a choice changes no bit of a result.

use super::plan::{
    plan, staged_plan, Algorithm, Collective, Plan, ReduceLimits, Shape, LINE_MAX_BLOCKS,
    MAX_BLOCKS,
};
use super::zero_copy_plan::{zero_copy_plan, Placement};

/// The algorithms a tuning table chooses among: the NVLink kernels the planners can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TunedAlgorithm {
    /// [`Algorithm::OneShot`]: LL128 lines, a payload within the window's one-shot lines.
    OneShot,
    /// [`Algorithm::LineTwoShot`]: all-reduce without a hook, within the window's lines.
    LineTwoShot,
    /// The staged two-shot through the window: [`Algorithm::TwoShot`] in one round,
    /// [`Algorithm::Pipelined`] in more (the rounds follow from the size and the window).
    Staged,
    /// [`Algorithm::ZeroCopyOneShot`]: all-reduce, input in the memory pool, out of place.
    ZeroCopyOneShot,
    /// [`Algorithm::ZeroCopyTwoShot`]: all-reduce with input and output in the pool,
    /// reduce-scatter with its input there, all-gather with its output there.
    ZeroCopyTwoShot,
}

impl TunedAlgorithm {
    /// Every tunable algorithm.
    pub const ALL: [Self; 5] = [
        Self::OneShot,
        Self::LineTwoShot,
        Self::Staged,
        Self::ZeroCopyOneShot,
        Self::ZeroCopyTwoShot,
    ];

    /// The tunable algorithm a plan's algorithm is (`None` for the network algorithm).
    pub const fn of(a: Algorithm) -> Option<Self> {
        Some(match a {
            Algorithm::OneShot => Self::OneShot,
            Algorithm::LineTwoShot => Self::LineTwoShot,
            Algorithm::TwoShot | Algorithm::Pipelined => Self::Staged,
            Algorithm::ZeroCopyOneShot => Self::ZeroCopyOneShot,
            Algorithm::ZeroCopyTwoShot => Self::ZeroCopyTwoShot,
            Algorithm::Network => return None,
        })
    }

    /// The name a tuning table spells it with.
    pub const fn name(self) -> &'static str {
        match self {
            Self::OneShot => "one_shot",
            Self::LineTwoShot => "line_two_shot",
            Self::Staged => "staged",
            Self::ZeroCopyOneShot => "zero_copy_one_shot",
            Self::ZeroCopyTwoShot => "zero_copy_two_shot",
        }
    }

    /// Whether it reads or writes peers' buffers in the memory pool.
    pub const fn zero_copy(self) -> bool {
        matches!(self, Self::ZeroCopyOneShot | Self::ZeroCopyTwoShot)
    }

    /// Whether a kernel of it exists for `c`.
    pub const fn serves(self, c: Collective) -> bool {
        match self {
            Self::LineTwoShot | Self::ZeroCopyOneShot => matches!(c, Collective::AllReduce),
            _ => true,
        }
    }
}

/// What a tuning table chooses for a size: the algorithm, its blocks, and whether the staged
/// all-reduce writes its reduced pieces into every peer's window ([`Plan::pushed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Choice {
    /// The algorithm.
    pub algorithm: TunedAlgorithm,
    /// Blocks of the kernel (1 to [`most_blocks`]).
    pub blocks: u32,
    /// The staged all-reduce's pushed results; false for everything else.
    pub pushed: bool,
}

impl Choice {
    /// The choice a plan made (`None` for the network algorithm).
    pub fn of(plan: &Plan) -> Option<Self> {
        Some(Self {
            algorithm: TunedAlgorithm::of(plan.algorithm)?,
            blocks: plan.blocks,
            pushed: plan.pushed
                && TunedAlgorithm::of(plan.algorithm) == Some(TunedAlgorithm::Staged),
        })
    }
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {} blocks", self.algorithm.name(), self.blocks)?;
        if self.pushed {
            f.write_str(", pushed")?;
        }
        Ok(())
    }
}

/// Most blocks of a tuned choice of `algorithm` under `limits`: what the default plans may
/// use at most, within the smallest GPU's SM cap and an explicit `DEVCOMM_REDUCE_MAX_BLOCKS`,
/// which both already bound the limits. Calls on lines stop at [`LINE_MAX_BLOCKS`] (their
/// kernels release and wait on that many slots); the others at the long pipelined calls'
/// 128 (`wide_max_blocks`).
pub fn most_blocks(limits: &ReduceLimits, algorithm: TunedAlgorithm) -> u32 {
    match algorithm {
        TunedAlgorithm::OneShot | TunedAlgorithm::LineTwoShot => limits
            .max_blocks
            .max(limits.staged_max_blocks)
            .clamp(1, LINE_MAX_BLOCKS),
        _ => limits
            .max_blocks
            .max(limits.staged_max_blocks)
            .max(limits.wide_max_blocks)
            .clamp(1, MAX_BLOCKS),
    }
}

/// The plan of `choice` for a call of shape `s` whose buffers lie as `at` says (`None`: not
/// in the memory pool, or the zero-copy paths switched off), on a window of `limits`; `None`
/// when the choice cannot serve the call, which then takes its default plan:
///
/// - blocks outside 1 to [`most_blocks`], or `pushed` on anything but the staged all-reduce;
/// - an algorithm without a kernel for the collective ([`TunedAlgorithm::serves`]);
/// - the one-shot on lines beyond the window's one-shot payload, the two-shot on lines beyond
///   its size or on a hooked call, the zero-copy paths on buffers outside the pool (or in
///   place, for the zero-copy one-shot);
/// - a hooked call (`s.row_len`) the algorithm cannot cut into whole rows: each case as the
///   default planners decide it for that algorithm.
pub fn plan_tuned(
    s: &Shape,
    at: Option<&Placement>,
    limits: &ReduceLimits,
    choice: &Choice,
) -> Option<Plan> {
    if choice.blocks == 0 || choice.blocks > most_blocks(limits, choice.algorithm) {
        return None;
    }
    if !choice.algorithm.serves(s.collective)
        || (choice.pushed
            && (choice.algorithm != TunedAlgorithm::Staged
                || s.collective != Collective::AllReduce))
    {
        return None;
    }
    // Each algorithm as the default planners give it, with the others out of their way.
    let p = match choice.algorithm {
        TunedAlgorithm::OneShot => plan(
            s,
            &ReduceLimits {
                line_two_shot_bytes: 0,
                ..*limits
            },
        )
        .ok()?,
        TunedAlgorithm::LineTwoShot => plan(
            s,
            &ReduceLimits {
                one_shot_bytes: 0,
                ..*limits
            },
        )
        .ok()?,
        TunedAlgorithm::Staged => plan(
            s,
            &ReduceLimits {
                one_shot_bytes: 0,
                line_two_shot_bytes: 0,
                ..*limits
            },
        )
        .ok()?,
        TunedAlgorithm::ZeroCopyOneShot | TunedAlgorithm::ZeroCopyTwoShot => zero_copy_plan(
            s,
            at?,
            &ReduceLimits {
                zero_copy_min_bytes: 0,
                zero_copy_one_shot_bytes: match choice.algorithm {
                    TunedAlgorithm::ZeroCopyOneShot => u64::MAX,
                    _ => 0,
                },
                ..*limits
            },
        )?,
    };
    if TunedAlgorithm::of(p.algorithm) != Some(choice.algorithm) {
        return None;
    }
    let blocks = match (p.algorithm, s.row_len) {
        // A hooked one-shot's blocks own whole rows: no more blocks than rows, as by default.
        (Algorithm::OneShot, Some(row)) => {
            let rows = s.count / row.max(1);
            choice
                .blocks
                .min(u32::try_from(rows).unwrap_or(u32::MAX))
                .max(1)
        }
        _ => choice.blocks,
    };
    // A pushed round holds half the elements of a pulled one (its result slots): the rounds
    // as the staged planner gives them for the choice's form.
    let p = if p.pushed == choice.pushed {
        p
    } else {
        staged_plan(s, limits, p.unit, p.shard, choice.pushed).ok()?
    };
    Some(Plan { blocks, ..p })
}

#[cfg(test)]
mod tests;
