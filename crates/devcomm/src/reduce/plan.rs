//! The pure choices of the reductions: which algorithm, how many blocks, how the message is
//! cut into shards, rounds and block pieces. Every rank computes the same plan from the same
//! arguments, and the kernels derive the same pieces from it (docs/COLLECTIVES.md,
//! "Reductions").

/// Which collective a plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank gets the reduction of every rank's whole buffer.
    AllReduce,
    /// Rank r gets the reduction of every rank's shard r.
    ReduceScatter,
    /// Every rank gets every rank's buffer, in rank order.
    AllGather,
}

impl Collective {
    /// The kernel's mode code (`devcomm::red::Mode` in `reduce.cuh`).
    pub(crate) const fn code(self) -> u32 {
        match self {
            Collective::AllReduce => 0,
            Collective::ReduceScatter => 1,
            Collective::AllGather => 2,
        }
    }

    /// The method's name, for errors.
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
        }
    }
}

/// The algorithm of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Every rank pushes its data into every peer as flag-in-data lines (LL128); every rank
    /// reduces all copies in rank order. One kernel, no separate signal.
    OneShot,
    /// All-reduce: every rank pushes shard q of its data to rank q as lines, rank q reduces it
    /// and pushes the result to every rank as lines. One kernel, no signal but the lines'.
    LineTwoShot,
    /// Staged into the symmetric window, each rank reduces its shard reading every rank's copy
    /// in rank order, then every rank reads every reduced shard: one round.
    TwoShot,
    /// The two-shot in rounds through a bounded window (two halves alternate).
    Pipelined,
    /// A job with network links: all-to-alls of the collective kernel (NVLink and network
    /// peers in one launch) around local steps, in rounds through the network scratch
    /// ([`super::net_plan`]).
    Network,
    /// Buffers in the memory pool (the input, and the output unless it is this rank's own):
    /// every rank reduces the whole buffer reading every rank's input in place. One exchange
    /// of a word per block and peer before, one after; nothing staged.
    ZeroCopyOneShot,
    /// Buffers in the memory pool: all-reduce: each rank reduces its shard reading every
    /// rank's input in place and writes it into every rank's output (in place too);
    /// reduce-scatter: the first half (into this rank's output, anywhere); all-gather: the
    /// second (this rank's input, anywhere, into every rank's pool output).
    ZeroCopyTwoShot,
}

impl Algorithm {
    /// Short name.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::OneShot => "one-shot",
            Algorithm::LineTwoShot => "two-shot (lines)",
            Algorithm::TwoShot => "two-shot",
            Algorithm::Pipelined => "pipelined",
            Algorithm::Network => "network",
            Algorithm::ZeroCopyOneShot => "zero-copy one-shot",
            Algorithm::ZeroCopyTwoShot => "zero-copy two-shot",
        }
    }

    /// The kernels' `ZcAlgo` code (`reduce.cuh`): 0 for the staged algorithms.
    pub(crate) const fn zero_copy_code(self) -> u32 {
        match self {
            Algorithm::ZeroCopyOneShot => 1,
            Algorithm::ZeroCopyTwoShot => 2,
            _ => 0,
        }
    }
}

/// Most blocks of a reduction kernel; also the signal slots per (rank, kind) and the
/// per-block sequence counters (`kMaxBlocks` in `reduce.cuh`).
pub const MAX_BLOCKS: u32 = 128;

/// Most blocks of a call on lines, the one-shot and the two-shot on lines (`kLineMaxBlocks`
/// in `reduce.cuh`: the line calls' release slots).
pub const LINE_MAX_BLOCKS: u32 = 64;

/// Bytes of a sender's one-shot payload per block, by which its block count grows from
/// [`LINE_MIN_BLOCKS`] to the most (64): 4 KiB. `devcomm tune` on 4 H200s (bf16 all-reduce,
/// 2026-11-28, 284465b; the block counts were then one per 8 KiB from 1) chose the one-shot on
/// 32 blocks from 8 to 128 KiB (8.6-8.8 us against 11.3-12.0 on 1-16 blocks, where a block
/// walks its lines in two passes), on 64 at 256 KiB (10.3 against 12.0 on 32), and the two-shot
/// on lines on 64 blocks at 512 KiB and 1 MiB (13.9 and 16.1 us against 15.4 for the one-shot
/// and 20.4 on 32 blocks); below 8 KiB every count took 8.4-9.4 us (docs/PERFORMANCE.md,
/// "Block counts of the calls on lines, by the tuner").
pub const LINE_BLOCK_BYTES: u64 = 4 << 10;

/// Fewest blocks of a one-shot call (within [`ReduceLimits::one_shot_blocks`]): 32.
pub const LINE_MIN_BLOCKS: u32 = 32;

/// Threads per block of the reduction kernels (`kThreads` in `reduce.cuh`).
pub const THREADS: u32 = 512;

/// Bytes one block of the two-shot reduces per round, by which the block count grows (the
/// default of [`ReduceLimits::block_bytes`]). 16 KiB: on 4 H200s (bf16 all-reduce, 2026-11-27)
/// 512 KiB took 23.7 us on 32 blocks against 25.7 on 8 (64 KiB a block), 8 MiB 62.4 against
/// 67.5 (docs/PERFORMANCE.md, "Reduction block counts").
pub const BLOCK_BYTES: u64 = 16 << 10;

/// Most blocks of a launch by default ([`ReduceLimits::max_blocks`]).
pub const DEFAULT_MAX_BLOCKS: u32 = 32;

/// Most blocks of the staged two-shot by default ([`ReduceLimits::staged_max_blocks`]): 64.
/// On 4 H200s (bf16 all-reduce, 2026-11-27) 1 GiB took 5628 us on 64 blocks against 6141 on
/// 32, 32 MiB 202 against 213, 4 MiB 40 against 41 (docs/PERFORMANCE.md, "The staged
/// two-shot: 64 blocks, pushed results").
pub const STAGED_MAX_BLOCKS: u32 = 64;

/// Most blocks of a pipelined call of [`WIDE_MIN_ROUNDS`] rounds or more by default
/// ([`ReduceLimits::wide_max_blocks`]): 128. On 4 H200s (bf16 all-reduce, 2026-11-28) 1 GiB
/// took 5112-5150 us on 128 blocks against 5486-5491 on 64, 256 MiB 1372-1377 against
/// 1462-1475, 128 MiB 731-737 against 752-774; 32-64 MiB did not gain (docs/PERFORMANCE.md,
/// "The pipelined two-shot on 128 blocks").
pub const WIDE_MAX_BLOCKS: u32 = 128;

/// Rounds from which a pipelined call takes up to [`ReduceLimits::wide_max_blocks`] blocks
/// (128 MiB on 4 ranks with the default rounds of 32 MiB).
pub const WIDE_MIN_ROUNDS: u64 = 4;

/// Rounds from which an all-reduce on 3 ranks or more pushes its reduced pieces
/// ([`Plan::pushed`]); on 2 ranks every staged all-reduce does. On 4 H200s with 64 blocks:
/// 64 MiB (2 rounds) 414 us pushed against 399 pulled, 128 MiB (4) 756 against 727, 256 MiB
/// (8) 1439 against 1487, 1 GiB 5542 against 5628; on 2 H200s pushed 1 GiB 3533 us against
/// 4368 pulled on 32 blocks.
pub const PUSHED_MIN_ROUNDS: u64 = 8;

/// Most blocks of a call on lines (the one-shot and the two-shot on lines) by default
/// ([`ReduceLimits::one_shot_blocks`]): 64. On 4 H200s (bf16 all-reduce, 2026-11-28) 512 KiB
/// took 15.0-15.3 us on 64 blocks against 16.8-17.0 on 32, the two-shot on lines 2 MiB
/// 22.7-23.3 against 26.1-26.9 and 4 MiB 35.6-36.8 against 39.6-40.2 (staged); on 2 H200s the
/// one-shot of 1 MiB 11.7 against 13.3 (docs/PERFORMANCE.md, "Calls on lines: 64 blocks").
/// Earlier, with 16-byte lines: 256 KiB 15.8 us on 32 blocks against 18.6 on 16.
pub const ONE_SHOT_BLOCKS: u32 = 64;

/// Bytes of an LL128 line of the one-shot: 15 payload words of 8 bytes and the flag word.
pub const LINE_BYTES: u64 = 128;

/// Payload words (8 bytes) of an LL128 line.
pub const LINE_WORDS: u64 = 15;

/// Most ranks of a reduction (the signal pad holds `SLOT_KINDS x world x MAX_BLOCKS` slots).
pub const MAX_WORLD: usize = 32;

/// Signal-slot kinds of the reduce window per (rank, block): the staged protocol's four, the
/// call agreement's ring of two words, the zero-copy calls' two and the staged two-shot's
/// pushed results (`kSlotKinds` in `reduce.cuh`).
pub const SLOT_KINDS: usize = 9;

/// The window sizes the plans are made for (every rank must use the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceLimits {
    /// Largest one-shot payload (bytes each rank sends each peer); 0: never one-shot. The
    /// window holds flag-in-data lines for it (twice the bytes, two parities, every sender).
    pub one_shot_bytes: u64,
    /// Bytes of one half of the two-shot area: one round stages at most this much per rank.
    pub chunk_bytes: u64,
    /// Most blocks of a launch (1 to [`MAX_BLOCKS`]).
    pub max_blocks: u32,
    /// Most blocks of the staged two-shot (1 to [`MAX_BLOCKS`]).
    pub staged_max_blocks: u32,
    /// Most blocks of a pipelined call of [`WIDE_MIN_ROUNDS`] rounds or more (1 to
    /// [`MAX_BLOCKS`]).
    pub wide_max_blocks: u32,
    /// Bytes of a two-shot round per block: the block count grows with the size by this step.
    pub block_bytes: u64,
    /// Most blocks of a call on lines, the one-shot and the two-shot on lines (1 to
    /// [`LINE_MAX_BLOCKS`]; the settings cap it as they cap `staged_max_blocks`).
    pub one_shot_blocks: u32,
    /// Largest all-reduce (bytes of the buffer) that takes the zero-copy one-shot when its
    /// buffers are in the memory pool; larger ones take the zero-copy two-shot (or, with only
    /// the input in the pool, the staged paths).
    pub zero_copy_one_shot_bytes: u64,
    /// Largest all-reduce (bytes of the buffer) above the one-shot's payload that takes the
    /// two-shot on lines ([`Algorithm::LineTwoShot`]); 0: never.
    pub line_two_shot_bytes: u64,
    /// Calls on pool buffers up to this many bytes (and within the line one-shot's payload)
    /// take the line one-shot: a push of 16-byte lines is one crossing of NVLink, a read of
    /// peers' buffers a round trip.
    pub zero_copy_min_bytes: u64,
}

impl ReduceLimits {
    /// The defaults on `world` ranks: one-shot up to [`one_shot_max_bytes`], rounds of 32 MiB
    /// (measured on 2 H200s against 8 and 2 MiB: docs/PERFORMANCE.md, "Reductions"),
    /// 32 blocks.
    pub const fn for_world(world: usize) -> Self {
        Self {
            one_shot_bytes: one_shot_max_bytes(world),
            chunk_bytes: chunk_max_bytes(world),
            max_blocks: DEFAULT_MAX_BLOCKS,
            staged_max_blocks: STAGED_MAX_BLOCKS,
            wide_max_blocks: WIDE_MAX_BLOCKS,
            block_bytes: BLOCK_BYTES,
            one_shot_blocks: ONE_SHOT_BLOCKS,
            zero_copy_one_shot_bytes: zero_copy_one_shot_max_bytes(world),
            zero_copy_min_bytes: zero_copy_min_bytes(world),
            line_two_shot_bytes: line_two_shot_max_bytes(world),
        }
    }
}

/// The default of [`ReduceLimits::chunk_bytes`] (a staged two-shot round per rank; the window
/// holds two) on `world` ranks: 64 MiB on 2 ranks, 32 MiB on more. On 2 ranks every staged
/// all-reduce is pushed, and a pushed round holds half the chunk (its result slots); on 2 H200s
/// (bf16, 2026-11-28, two processes of each alternating) 64 MiB took 1 GiB from 0.96x NCCL
/// (3424, 3481 us) to 1.01-1.02x (3211, 3239 us), 512 MiB from 0.98-0.99x to 1.06-1.07x and
/// 256 MiB from 1.02-1.03x to 1.08x, for a window of 128 MiB instead of 64 (docs/PERFORMANCE.md,
/// "Rounds of 64 MiB on 2 ranks"). On 3 or more ranks not measured: 32.
pub const fn chunk_max_bytes(world: usize) -> u64 {
    if world == 2 {
        64 << 20
    } else {
        32 << 20
    }
}

/// The default of [`ReduceLimits::zero_copy_min_bytes`] on `world` ranks: 256 KiB. On 4 H200s
/// (bf16 all-reduce, 2026-11-27) pool buffers took 10.4-12.2 us zero-copy from 8 B to 128 KiB
/// and 13.4 at 256 KiB, against 11.1-11.8 on the LL128 one-shot up to 128 KiB and 11.5 at
/// 256 KiB (16-byte lines: 15.9); on 2 ranks, 10.5 zero-copy against 9.3 on 16-byte lines at
/// 256 KiB and 11.2 against 11.9 at 512 KiB.
pub const fn zero_copy_min_bytes(_world: usize) -> u64 {
    256 << 10
}

/// The default largest all-reduce (bytes) of the zero-copy one-shot on `world` ranks: each
/// rank reads `world - 1` peers' whole buffers, against the two-shot's one shard of each and a
/// write of its shard into each; the two-shot's extra step costs a store round per peer.
pub const fn zero_copy_one_shot_max_bytes(world: usize) -> u64 {
    match world {
        0..=2 => 1 << 20,
        3..=4 => 256 << 10,
        _ => 64 << 10,
    }
}

/// The default largest payload (bytes per sender) of a one-shot call on `world` ranks: each
/// rank receives `world - 1` copies, so the cut-over comes earlier with more ranks. 2 ranks:
/// on 2 H200s with LL128 lines (2026-11-27, bf16 sum, docs/PERFORMANCE.md) all-reduce 1 MiB
/// 13.3 us one-shot against 19.8 two-shot, 2 MiB 21.6 against 23.0 and 4 MiB 38.0 against
/// 32.6; reduce-scatter and all-gather of 2 MiB (1 MiB a sender) 13.9-14.0 against
/// 15.6-16.1, of 4 MiB 22.5-22.6 against 20.8-21.1: 1 MiB serves all three. 3-4 ranks: on
/// 4 H200s with LL128 lines (2026-11-27), bf16 all-reduce 512 KiB 16.9 us one-shot against
/// 23.0 two-shot, 1 MiB 28.1 against 25.2 (unhooked all-reduces above
/// [`LINE_TWO_SHOT_FROM_BYTES`] take the two-shot on lines instead); more ranks: not measured.
pub const fn one_shot_max_bytes(world: usize) -> u64 {
    match world {
        0..=2 => 1 << 20,
        3..=4 => 512 << 10,
        _ => 32 << 10,
    }
}

/// Smallest unhooked all-reduce (bytes, exclusive) that takes the two-shot on lines where it
/// is on (3 ranks or more by default), before the one-shot: 256 KiB. On 4 H200s (2026-11-28,
/// `devcomm tune`) 512 KiB took 13.9 us on the two-shot on lines (64 blocks) against 15.4 on
/// the one-shot. Hooked calls, reduce-scatters and all-gathers keep the one-shot to its limit.
pub const LINE_TWO_SHOT_FROM_BYTES: u64 = 256 << 10;

/// The default largest all-reduce (bytes) of the two-shot on lines on `world` ranks (0: never).
/// On 2 ranks it would send each peer as much as the one-shot does, in two steps: never. On 3
/// ranks or more, 4 MiB: on 4 H200s (bf16, 64 blocks, 2026-11-28) 4 MiB took 35.6-36.8 us on
/// lines against 39.6-40.2 staged, 8 MiB 67.7-68.0 against 61.5-62.3.
pub const fn line_two_shot_max_bytes(world: usize) -> u64 {
    match world {
        0..=2 => 0,
        _ => 4 << 20,
    }
}

/// LL128 lines of `bytes` of payload.
pub const fn lines_of(bytes: u64) -> u64 {
    bytes.div_ceil(8).div_ceil(LINE_WORDS)
}

/// Bytes of LL128 lines one sender owns in a receiver's window, per parity: the largest
/// one-shot payload, or the two-shot on lines' largest shard twice (its data, then the
/// reduced shard), in 128-byte lines of 15 payload words.
pub const fn ll_sender_bytes(world: usize, limits: &ReduceLimits) -> u64 {
    let one = lines_of(limits.one_shot_bytes);
    // A shard is rounded up to 16 bytes (the planner's `vec`).
    let two = match limits.line_two_shot_bytes {
        0 => 0,
        b => 2 * lines_of(b.div_ceil(if world == 0 { 1 } else { world as u64 }) + 16),
    };
    (if one > two { one } else { two }) * LINE_BYTES
}

/// Bytes of the reduce window: the one-shot lines (`world` senders x 2 parities), then the
/// two halves of the two-shot area.
pub fn window_bytes(world: usize, limits: &ReduceLimits) -> u64 {
    world as u64 * 2 * ll_sender_bytes(world, limits) + 2 * limits.chunk_bytes
}

/// What a call moves, as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The collective.
    pub collective: Collective,
    /// All-reduce: elements of the buffer; reduce-scatter: output elements; all-gather: input
    /// elements.
    pub count: u64,
    /// Bytes per element.
    pub elem_bytes: u64,
    /// Number of ranks.
    pub world: usize,
    /// Hooked calls: elements per row (shards and block pieces hold whole rows).
    pub row_len: Option<u64>,
}

/// How a call runs. Elements are counted in the buffer's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Blocks of the kernel.
    pub blocks: u32,
    /// Elements per shard (two-shot, pipelined): shard q is elements `[q S, (q + 1) S)` of the
    /// whole buffer (all-reduce buffer, reduce-scatter input, all-gather output). One-shot: the
    /// elements each rank sends to each peer.
    pub shard: u64,
    /// Elements of each shard per round (two-shot, pipelined); 0 for one-shot.
    pub chunk: u64,
    /// Rounds (1 for one-shot and two-shot).
    pub rounds: u64,
    /// Block pieces are multiples of this many elements (16 bytes, or a row when hooked).
    pub unit: u64,
    /// The staged all-reduce's rounds are pipelined with pushed results: each block takes the
    /// same span of every round, stages round k + 1 before it gathers round k, and the
    /// reducers write their reduced pieces, as they reduce them, into a result slot of every
    /// peer's window (a round holds half a pulled round's elements), so that the links carry
    /// stores only (`TwoShotFlags` in `reduce.cuh`). Otherwise peers read the reduced pieces
    /// from the reducer's window, round after round.
    pub pushed: bool,
}

/// The plan of a call, or why it cannot run (the caller turns the reason into
/// `Error::InvalidArgument`). `count == 0` is not planned: such a call does nothing.
pub fn plan(s: &Shape, limits: &ReduceLimits) -> Result<Plan, String> {
    let es = s.elem_bytes;
    if !matches!(es, 1 | 2 | 4 | 8) {
        return Err(format!("element size {es} bytes is not 1, 2, 4 or 8"));
    }
    if s.world == 0 || s.world > MAX_WORLD {
        return Err(format!(
            "world size {}: use 1 to {MAX_WORLD} ranks",
            s.world
        ));
    }
    if s.count == 0 {
        return Err("nothing to plan for 0 elements".into());
    }
    let w = s.world as u64;
    let payload = s.count.checked_mul(es).ok_or("the size overflows")?;
    // Calls on lines: the one-shot one block per LINE_BLOCK_BYTES of a sender's payload, at
    // least LINE_MIN_BLOCKS, the two-shot on lines every block it may have; both at most
    // one_shot_blocks (which the settings and the SMs bound).
    let most_line_blocks = u64::from(limits.one_shot_blocks.clamp(1, LINE_MAX_BLOCKS));
    let line_blocks = |bytes: u64| {
        bytes
            .div_ceil(LINE_BLOCK_BYTES)
            .max(u64::from(LINE_MIN_BLOCKS))
            .min(most_line_blocks) as u32
    };
    // The two-shot on lines takes unhooked all-reduces up to its limit from
    // LINE_TWO_SHOT_FROM_BYTES (or from the one-shot's limit where that is lower).
    let line_two_shot = s.row_len.is_none()
        && s.collective == Collective::AllReduce
        && payload > LINE_TWO_SHOT_FROM_BYTES.min(limits.one_shot_bytes)
        && payload <= limits.line_two_shot_bytes;
    if payload <= limits.one_shot_bytes && !line_two_shot {
        // Hooked: block pieces of whole rows, each row starting a line of its own.
        let (unit, blocks) = match s.row_len {
            None => (Some(8 / es.min(8)), line_blocks(payload)),
            Some(row) => (
                hooked_line_rows(s, limits).map(|_| row),
                line_blocks(payload).min(u32::try_from(s.count / row.max(1)).unwrap_or(u32::MAX)),
            ),
        };
        if let Some(unit) = unit {
            return Ok(Plan {
                algorithm: Algorithm::OneShot,
                blocks,
                shard: s.count,
                chunk: 0,
                rounds: 1,
                unit,
                pushed: false,
            });
        }
    }
    let vec = 16 / es;
    if line_two_shot
        || (s.row_len.is_none()
            && s.collective == Collective::AllReduce
            && payload <= limits.line_two_shot_bytes)
    {
        let shard = s.count.div_ceil(w).div_ceil(vec) * vec;
        return Ok(Plan {
            algorithm: Algorithm::LineTwoShot,
            blocks: most_line_blocks as u32,
            shard,
            chunk: 0,
            rounds: 1,
            unit: 8 / es.min(8),
            pushed: false,
        });
    }
    let (unit, shard) = match (s.collective, s.row_len) {
        (_, Some(0)) => return Err("row length 0".into()),
        (Collective::AllReduce, Some(row)) => {
            if s.count % row != 0 {
                return Err(format!(
                    "row length {row} does not divide the {} elements",
                    s.count
                ));
            }
            (row, (s.count / row).div_ceil(w) * row)
        }
        (Collective::AllReduce, None) => (vec, s.count.div_ceil(w).div_ceil(vec) * vec),
        (Collective::ReduceScatter, Some(row)) => {
            if s.count % row != 0 {
                return Err(format!(
                    "row length {row} does not divide the output's {} elements",
                    s.count
                ));
            }
            (row, s.count)
        }
        (Collective::AllGather, Some(_)) => {
            return Err("all-gather takes no epilogue hook (it reduces nothing)".into())
        }
        (_, None) => (vec, s.count),
    };
    let full = staged_plan(s, limits, unit, shard, false)?;
    let pushed =
        s.collective == Collective::AllReduce && (s.world == 2 || full.rounds >= PUSHED_MIN_ROUNDS);
    // A row too long for a pushed round's half (its result slots) keeps the pulled rounds.
    if pushed {
        Ok(staged_plan(s, limits, unit, shard, true).unwrap_or(full))
    } else {
        Ok(full)
    }
}

/// The staged two-shot's plan of a call of shape `s` cut into shards of `shard` elements and
/// block pieces of whole `unit`s, pushed or not: a pushed round needs a result slot beside
/// each staging slot of a window half, so its rounds hold half the elements. The rounds
/// follow from the window, the blocks from a round's bytes (more for a call of
/// [`WIDE_MIN_ROUNDS`] rounds or more).
pub fn staged_plan(
    s: &Shape,
    limits: &ReduceLimits,
    unit: u64,
    shard: u64,
    pushed: bool,
) -> Result<Plan, String> {
    let (w, es) = (s.world as u64, s.elem_bytes);
    let per_shard = limits.chunk_bytes / w / es / if pushed { 2 } else { 1 };
    let chunk = per_shard / unit * unit;
    if chunk == 0 {
        return Err(format!(
            "a row of {unit} elements of {es} bytes does not fit the window's round of {} bytes \
             per shard",
            per_shard * es
        ));
    }
    let chunk = chunk.min(shard.div_ceil(unit) * unit);
    let rounds = shard.div_ceil(chunk);
    let round_bytes = chunk * w * es;
    let most_blocks = if rounds >= WIDE_MIN_ROUNDS {
        limits.wide_max_blocks
    } else {
        limits.staged_max_blocks
    };
    Ok(Plan {
        algorithm: if rounds == 1 {
            Algorithm::TwoShot
        } else {
            Algorithm::Pipelined
        },
        blocks: round_bytes
            .div_ceil(limits.block_bytes.max(1))
            .clamp(1, most_blocks.clamp(1, MAX_BLOCKS) as u64) as u32,
        shard,
        chunk,
        rounds,
        unit,
        pushed,
    })
}

/// The rows of a hooked all-reduce or reduce-scatter that the one-shot on lines can take, or
/// `None`. Its lines start every row afresh (`lines_of(row bytes)` lines a row), so that a
/// block owns whole rows and whole lines at once and runs the hook on rows it reduced itself;
/// the rows' lines must fit a sender's area of the window and be at most twice the payload's
/// own lines (rows of a few elements, a line each, would multiply the bytes on the wire: they
/// take the two-shot). The payload limit (`one_shot_bytes`) is the caller's.
pub fn hooked_line_rows(s: &Shape, limits: &ReduceLimits) -> Option<u64> {
    let row = s.row_len.filter(|&r| r > 0)?;
    if !matches!(
        s.collective,
        Collective::AllReduce | Collective::ReduceScatter
    ) || s.count % row != 0
    {
        return None;
    }
    let rows = s.count / row;
    let lines = rows.checked_mul(lines_of(row.checked_mul(s.elem_bytes)?))?;
    let payload_lines = lines_of(s.count.checked_mul(s.elem_bytes)?);
    (lines <= payload_lines.saturating_mul(2)
        && lines.checked_mul(LINE_BYTES)? <= ll_sender_bytes(s.world, limits))
    .then_some(rows)
}

/// Block `b`'s piece `[lo, hi)` of `m` elements cut into `blocks` pieces of whole `unit`s
/// (the kernels' `block_piece`). Pieces are disjoint, in block order, and cover `[0, m)`.
pub fn block_piece(m: u64, blocks: u32, unit: u64, b: u32) -> (u64, u64) {
    let units = m.div_ceil(unit);
    let per = units.div_ceil(blocks.max(1) as u64) * unit;
    let lo = (b as u64 * per).min(m);
    (lo, (lo + per).min(m))
}

#[cfg(test)]
pub(super) mod tests;
