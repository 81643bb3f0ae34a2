//! Rust twin of `ReduceLaunch` in `cuda/devcomm/reduce.cuh`.

use std::mem::{offset_of, size_of};

use cudarc::driver::DeviceRepr;

use crate::handles::DeviceWindow;

/// Launch arguments of the reduction kernels (see the header for each field's meaning).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReduceLaunch {
    /// The reduce window.
    pub w: DeviceWindow,
    /// Input buffer.
    pub input: u64,
    /// Output buffer.
    pub output: u64,
    /// All-reduce: elements; reduce-scatter and all-gather: elements per shard.
    pub count: u64,
    /// Elements of the whole buffer.
    pub total: u64,
    /// Elements per shard (two-shot) or per sender (one-shot).
    pub shard: u64,
    /// Elements of each shard per round.
    pub chunk: u64,
    /// Rounds.
    pub rounds: u64,
    /// Block pieces are whole units of this many elements.
    pub unit: u64,
    /// Device `u64[3 x MAX_BLOCKS]`: the per-block sequence counters and call numbers.
    pub counters: u64,
    /// Hook arguments.
    pub user: u64,
    /// Hooked: elements per row.
    pub row_len: u64,
    /// Bytes: the one-shot lines' offset in the window.
    pub ll_offset: u64,
    /// Bytes of lines per sender per parity.
    pub ll_sender_bytes: u64,
    /// Bytes: the two-shot area's offset in the window.
    pub pipe_offset: u64,
    /// Bytes of one half of the two-shot area.
    pub half_bytes: u64,
    /// Blocks of the launch.
    pub blocks: u32,
    /// `Collective::code`.
    pub mode: u32,
    /// `ReduceOp::code`.
    pub op: u32,
    /// `DataType::code` (the call agreement's descriptor carries it).
    pub dtype: u32,
    /// Zero-copy: device `u64[world]` of the input's segment base on every rank as mapped
    /// here, or 0.
    pub in_peers: u64,
    /// Zero-copy: the input's byte offset in its segment.
    pub in_offset: u64,
    /// Zero-copy: the output's segment bases, or 0.
    pub out_peers: u64,
    /// Zero-copy: the output's byte offset in its segment.
    pub out_offset: u64,
    /// Zero-copy: the layout word (48 bits) every rank must announce alike.
    pub layout: u64,
    /// `Algorithm::zero_copy_code` (0: staged).
    pub zc: u32,
    /// The staged two-shot's `TwoShotFlags` (`TWO_SHOT_*`).
    pub flags: u32,
}

/// `kTwoShotPushed`: the staged all-reduce pipelines its rounds with pushed results
/// (`Plan::pushed`).
pub const TWO_SHOT_PUSHED: u32 = 1;

const _: () = assert!(size_of::<ReduceLaunch>() == 264);
const _: () = assert!(offset_of!(ReduceLaunch, in_peers) == 216);
const _: () = assert!(offset_of!(ReduceLaunch, zc) == 256);
const _: () = assert!(offset_of!(ReduceLaunch, input) == 80);
const _: () = assert!(offset_of!(ReduceLaunch, counters) == 144);
const _: () = assert!(offset_of!(ReduceLaunch, blocks) == 200);

// SAFETY: plain #[repr(C)] integers whose layout equals the C++ struct (asserted above, in the
// header, and in tests/layout.rs).
unsafe impl DeviceRepr for ReduceLaunch {}

macro_rules! fields {
    ($($rust:ident => $cpp:literal),* $(,)?) => {
        &[$(("red::ReduceLaunch", $cpp, offset_of!(ReduceLaunch, $rust), size_of::<ReduceLaunch>())),*]
    };
}

/// Field offsets for the layout test, as in `handles::LAYOUT` (C++ names `in`, `out`; all: [`crate::abi::layout`]).
pub const LAYOUT: &[(&str, &str, usize, usize)] = fields!(
    w => "w", input => "in", output => "out", count => "count", total => "total",
    shard => "shard", chunk => "chunk", rounds => "rounds", unit => "unit",
    counters => "counters", user => "user", row_len => "row_len", ll_offset => "ll_offset",
    ll_sender_bytes => "ll_sender_bytes", pipe_offset => "pipe_offset",
    half_bytes => "half_bytes", blocks => "blocks", mode => "mode", op => "op",
    dtype => "dtype", in_peers => "in_peers", in_offset => "in_offset",
    out_peers => "out_peers", out_offset => "out_offset", layout => "layout", zc => "zc",
);

/// Launch arguments of `net_step_kernel` (`NetStep` in `cuda/devcomm/reduce.cuh`): one local
/// step of a reduction with network peers (`src/reduce/net.rs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStepLaunch {
    /// Source: `pieces` pieces (copies) `in_stride` elements apart.
    pub input: u64,
    /// Destination.
    pub output: u64,
    /// Elements between the pieces of `input`.
    pub in_stride: u64,
    /// Elements between the pieces of `output` (copy step).
    pub out_stride: u64,
    /// Elements per piece.
    pub count: u64,
    /// Blocks take whole units of this many elements (hooked: a row).
    pub unit: u64,
    /// Hook arguments.
    pub user: u64,
    /// Hooked: elements per row.
    pub row_len: u64,
    /// Hooked: where `output[0]` goes in the caller's output (`RowCtx::dest`).
    pub dest: u64,
    /// Hooked: the row index of `output[0]` in the caller's output.
    pub row0: u64,
    /// The communicator's device error state: nothing is written once it is aborted.
    pub errors: u64,
    /// Pieces copied, or copies reduced (the world size).
    pub pieces: u32,
    /// [`NetStepKind`] code.
    pub step: u32,
    /// This rank (`RowCtx::rank`).
    pub rank: i32,
    /// The world size (`RowCtx::world_size`).
    pub world: i32,
}

/// What a [`NetStepLaunch`] does (`NetStepKind` in `reduce.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetStepKind {
    /// Copies `pieces` pieces of `count` elements.
    Copy = 0,
    /// Reduces `pieces` copies into `output` in rank order (then the epilogue, if hooked).
    Reduce = 1,
    /// As `Reduce`, then copies the hooked rows to `dest`.
    ReduceToDest = 2,
}

const _: () = assert!(size_of::<NetStepLaunch>() == 104);
const _: () = assert!(offset_of!(NetStepLaunch, errors) == 80);
const _: () = assert!(offset_of!(NetStepLaunch, pieces) == 88);

// SAFETY: plain #[repr(C)] integers whose layout equals the C++ struct (asserted above, in the
// header, and in tests/layout.rs).
unsafe impl DeviceRepr for NetStepLaunch {}

macro_rules! step_fields {
    ($($rust:ident => $cpp:literal),* $(,)?) => {
        &[$(("red::NetStep", $cpp, offset_of!(NetStepLaunch, $rust), size_of::<NetStepLaunch>())),*]
    };
}

/// Field offsets of [`NetStepLaunch`] for the layout test.
pub const NET_STEP_LAYOUT: &[(&str, &str, usize, usize)] = step_fields!(
    input => "in", output => "out", in_stride => "in_stride", out_stride => "out_stride",
    count => "count", unit => "unit", user => "user", row_len => "row_len", dest => "dest",
    row0 => "row0", errors => "errors", pieces => "pieces", step => "step", rank => "rank",
    world => "world",
);
