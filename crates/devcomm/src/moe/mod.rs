//! Mixture-of-experts dispatch and combine (docs/MOE.md): the pure part. [`MoeConfig`] is what
//! a user chooses, [`MoePlan`] everything derived from it (the packed row's layout, the
//! buffers' rows), checked once; [`MoeArgs`] is the kernels' argument; [`module_spec`] their
//! module; [`reference`] the same computation on the host, in the same order, for the tests;
//! [`wire`] how rows cross (as they are, or FP8 with scales) and [`fp8`] the host's e4m3.
//! The calls themselves are [`crate::Moe`]'s (`comm/moe.rs`).

mod buffers;
mod elem;
pub mod fp8;
pub mod reference;
pub mod wire;

pub use buffers::DispatchBytes;
pub use wire::{Fp8Output, Fp8Scales, Wire};

use cudarc::driver::DeviceRepr;

use crate::error::{Error, Result};
use crate::jit::KernelSpec;
use crate::reduce::DataType;

/// The kernels' source (`cuda/kernels/moe.cu`); instantiations are appended.
pub const KERNEL_SOURCE: &str = include_str!("../../cuda/kernels/moe.cu");

/// The most ranks a token's destination mask holds.
pub const MAX_WORLD: usize = 64;
/// The most experts per token (the combine orders a token's entries in registers).
pub const MAX_TOP_K: usize = 32;
/// The most experts per rank (their group offsets sit in shared memory).
pub const MAX_LOCAL_EXPERTS: usize = 1024;

/// What a user chooses for a MoE layer's dispatch and combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts in the job; rank r holds `[r * experts / world, (r + 1) * experts / world)`.
    pub experts: usize,
    /// Experts per token (`topk_idx`'s second dimension).
    pub top_k: usize,
    /// Elements per token row.
    pub hidden: usize,
    /// The rows' element type (bf16, f16 or f32).
    pub dtype: DataType,
    /// The most tokens a rank dispatches in one call.
    pub max_tokens: usize,
    /// Each local expert's group of output rows starts at a multiple of this (grouped GEMMs
    /// want 64 or 128); 1: no padding.
    pub align: usize,
    /// How the dispatch's rows cross: as they are ([`Wire::Native`], the default) or FP8 with
    /// scales, dequantised on arrival or given back as FP8. The combine always sends `dtype`.
    pub wire: Wire,
}

/// Everything derived from a [`MoeConfig`] and the world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoePlan {
    /// The configuration.
    pub config: MoeConfig,
    /// Ranks.
    pub world: usize,
    /// Experts per rank.
    pub local_experts: usize,
    /// Bytes of one token row of `dtype` (the input's, the combine's).
    pub hidden_bytes: usize,
    /// Bytes of a row's values in a packed row: `hidden_bytes`, or `hidden` as FP8.
    pub wire_bytes: usize,
    /// Elements per scale (0: no scales, native rows).
    pub scale_block: usize,
    /// `f32` scales per packed row (0 for native rows).
    pub scales: usize,
    /// Byte offset of the scales in a packed row (right after the values).
    pub scales_off: usize,
    /// Bytes of one row of the expert-major output (`out_x`): `hidden_bytes`, or `hidden`
    /// when it holds FP8.
    pub out_row_bytes: usize,
    /// Byte offset of the `u16` local expert ids in a packed row.
    pub ids_off: usize,
    /// Byte offset of the `f32` weights in a packed row.
    pub w_off: usize,
    /// Bytes of a packed row (values, scales, ids, weights, padding to 16).
    pub row_bytes: usize,
    /// Rows a rank may send: each token at most once per rank.
    pub send_rows: usize,
    /// Rows a rank may receive: at most `max_tokens` from each rank.
    pub recv_rows: usize,
}

const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Where each part of a packed row sits: the values (as they are or e4m3), their `f32`
/// scales, the `u16` local expert ids, the `f32` weights, padding to 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RowLayout {
    wire_bytes: usize,
    scales: usize,
    scales_off: usize,
    ids_off: usize,
    w_off: usize,
    row_bytes: usize,
}

impl RowLayout {
    /// The layout of `c`'s rows (`c` checked: the values are whole 16-byte units).
    fn of(c: &MoeConfig) -> Self {
        let wire_bytes = c.wire.value_bytes(c.hidden, c.dtype);
        let scales = c.wire.scales_per_row(c.hidden);
        let scales_off = wire_bytes;
        let ids_off = scales_off + 4 * scales;
        let w_off = round_up(ids_off + 2 * c.top_k, 4);
        Self {
            wire_bytes,
            scales,
            scales_off,
            ids_off,
            w_off,
            row_bytes: round_up(w_off + 4 * c.top_k, 16),
        }
    }
}

impl MoePlan {
    /// The plan of `config` on `world` ranks, or why there is none.
    pub fn new(config: MoeConfig, world: usize) -> Result<Self> {
        let bad = |reason: String| Error::InvalidArgument { op: "moe", reason };
        let c = config;
        if !matches!(c.dtype, DataType::BF16 | DataType::F16 | DataType::F32) {
            return Err(bad(format!(
                "rows of {} are not supported (bf16, f16 or f32)",
                c.dtype.name()
            )));
        }
        if world == 0 || world > MAX_WORLD {
            return Err(bad(format!("{world} ranks (1 to {MAX_WORLD})")));
        }
        if c.experts == 0 || c.experts % world != 0 {
            return Err(bad(format!(
                "{} experts do not divide among {world} ranks",
                c.experts
            )));
        }
        let local_experts = c.experts / world;
        if local_experts > MAX_LOCAL_EXPERTS {
            return Err(bad(format!(
                "{local_experts} experts per rank (at most {MAX_LOCAL_EXPERTS})"
            )));
        }
        if c.top_k == 0 || c.top_k > MAX_TOP_K {
            return Err(bad(format!("top_k {} (1 to {MAX_TOP_K})", c.top_k)));
        }
        let hidden_bytes = c.hidden * c.dtype.size_bytes();
        if c.hidden == 0 || hidden_bytes % 16 != 0 {
            return Err(bad(format!(
                "hidden {} x {} bytes is not a positive multiple of 16 bytes",
                c.hidden,
                c.dtype.size_bytes()
            )));
        }
        if c.max_tokens == 0 || c.max_tokens > i32::MAX as usize / world {
            return Err(bad(format!("max_tokens {}", c.max_tokens)));
        }
        if c.align == 0 {
            return Err(bad("align 0 (1: no padding)".into()));
        }
        if let Some(reason) = c.wire.refusal(c.hidden, c.dtype) {
            return Err(bad(reason));
        }
        let layout = RowLayout::of(&c);
        if layout.row_bytes > u32::MAX as usize {
            return Err(bad(format!("a row of {} bytes", layout.row_bytes)));
        }
        Ok(Self {
            config,
            world,
            local_experts,
            hidden_bytes,
            wire_bytes: layout.wire_bytes,
            scale_block: c.wire.scale_block(c.hidden).unwrap_or(0),
            scales: layout.scales,
            scales_off: layout.scales_off,
            out_row_bytes: c.wire.out_row_bytes(c.hidden, c.dtype),
            ids_off: layout.ids_off,
            w_off: layout.w_off,
            row_bytes: layout.row_bytes,
            send_rows: c.max_tokens * world.min(c.top_k),
            recv_rows: c.max_tokens * world,
        })
    }

    /// Expert-major output rows that hold every routing of up to `max_tokens` tokens per rank:
    /// each received token once per local expert it chose, each group padded to `align`.
    pub fn worst_case_out_rows(&self) -> usize {
        let per_token = self.config.top_k.min(self.local_experts);
        self.recv_rows * per_token + self.local_experts * (self.config.align - 1)
    }

    /// Output rows for `tokens` tokens per rank spread evenly over the experts, with `slack`
    /// times the mean per expert (1.0: exactly even), padded: a size for routings near
    /// uniform; a call that needs more reports it ([`crate::Moe::check`]) and writes nothing.
    pub fn typical_out_rows(&self, tokens: usize, slack: f64) -> usize {
        let c = &self.config;
        let mean = (tokens * self.world * c.top_k) as f64 / c.experts as f64;
        let per_expert = round_up((mean * slack).ceil() as usize, c.align);
        (per_expert * self.local_experts).min(self.worst_case_out_rows())
    }
}

/// The direct path's area on each rank (`moe.cu`, "The direct path"): byte offsets of its
/// parts and its size. Rows and sums are double-buffered by call parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectArea {
    /// `u64 [2][world]`: the tokens of each rank's dispatch, by parity (the signal words,
    /// `u64 [2 x world]`, are at 0).
    pub tokens_off: usize,
    /// `[2][world][max_tokens]` packed rows.
    pub rows_off: usize,
    /// `[2][world][max_tokens]` rows of `hidden` elements: the combine's sums.
    pub sums_off: usize,
    /// Bytes of the area.
    pub bytes: usize,
}

/// Bytes of a row part: the kernels give a warp a 2 KiB part of a row (`kPartUnits`).
pub const ROW_PART_BYTES: usize = 2048;

impl MoePlan {
    /// Parts of a row of `hidden` elements: the warps the row-parallel kernels give a row.
    pub fn row_parts(&self) -> usize {
        self.hidden_bytes.div_ceil(ROW_PART_BYTES)
    }

    /// Warps kernel `name` (of [`KERNELS`]) gives a row (`moe.cu`: 2 KiB parts of a row of
    /// the row type or of e4m3 codes, 1,024 elements of a row quantised per 128 or
    /// dequantised; the per-row scale's pack works a row whole): what its grid is sized for.
    pub fn kernel_parts(&self, name: &str) -> usize {
        let hidden = self.config.hidden;
        match name {
            "moe_pack"
            | "moe_unpack"
            | "moe_combine_pack"
            | "moe_combine_pack_lean"
            | "moe_combine_final" => self.row_parts(),
            "moe_unpack_fp8" => hidden.div_ceil(2048),
            "moe_unpack_dequant" => hidden.div_ceil(1024),
            "moe_pack_fp8" if self.scale_block != hidden => hidden.div_ceil(1024),
            _ => 1,
        }
    }

    /// The rows a rank is expected to receive when it sends `tokens` (as many from every rank):
    /// what the receiving kernels' grids are sized for. The kernels stride over however many
    /// arrive, so a skewed routing costs time, never a row.
    pub fn expected_rows(&self, tokens: usize) -> usize {
        (tokens * self.world).clamp(1, self.recv_rows)
    }

    /// The direct path's area for this plan (pure; the same on every rank).
    pub fn direct_area(&self) -> DirectArea {
        let (w, cap) = (self.world, self.config.max_tokens);
        let tokens_off = round_up(2 * w * 8, 256);
        let rows_off = round_up(tokens_off + 2 * w * 8, 256);
        let sums_off = round_up(rows_off + 2 * w * cap * self.row_bytes, 256);
        let bytes = sums_off + 2 * w * cap * self.hidden_bytes;
        DirectArea {
            tokens_off,
            rows_off,
            sums_off,
            bytes,
        }
    }
}

/// The kernels' argument (`MoeArgs` in `cuda/kernels/moe.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MoeArgs {
    pub(crate) x: u64,
    pub(crate) topk_idx: u64,
    pub(crate) topk_w: u64,
    pub(crate) slot: u64,
    pub(crate) send_counts: u64,
    pub(crate) send_offsets: u64,
    pub(crate) send: u64,
    pub(crate) recv: u64,
    pub(crate) recv_counts: u64,
    pub(crate) pos: u64,
    pub(crate) expert_count: u64,
    pub(crate) out_x: u64,
    pub(crate) out_w: u64,
    pub(crate) out_scales: u64,
    pub(crate) y: u64,
    pub(crate) cback: u64,
    pub(crate) back: u64,
    pub(crate) out: u64,
    pub(crate) status: u64,
    pub(crate) tokens: u64,
    pub(crate) out_rows: u64,
    pub(crate) hidden: u32,
    pub(crate) k: u32,
    pub(crate) world: u32,
    pub(crate) rank: u32,
    pub(crate) local_experts: u32,
    pub(crate) experts: u32,
    pub(crate) align: u32,
    pub(crate) row_bytes: u32,
    pub(crate) ids_off: u32,
    pub(crate) w_off: u32,
    pub(crate) scales_off: u32,
    pub(crate) scales: u32,
    pub(crate) scale_block: u32,
    pub(crate) out_row_bytes: u32,
    pub(crate) direct: u32,
    pub(crate) pad0: u32,
    pub(crate) pad1: u32,
    pub(crate) pad2: u32,
    pub(crate) cap: u64,
    pub(crate) sym: u64,
    pub(crate) peers: u64,
    pub(crate) ctr: u64,
    pub(crate) err: u64,
    pub(crate) mirror: u64,
    pub(crate) timeout_ns: u64,
    pub(crate) tok_off: u64,
    pub(crate) recv_off: u64,
    pub(crate) back_off: u64,
}

// SAFETY: plain integers, laid out as the kernels' struct (checked against the C++ in the
// tests).
unsafe impl DeviceRepr for MoeArgs {}

impl MoeArgs {
    /// The arguments every kernel shares, from `plan` on rank `rank`.
    pub(crate) fn of(plan: &MoePlan, rank: usize) -> Self {
        let c = &plan.config;
        Self {
            hidden: c.hidden as u32,
            k: c.top_k as u32,
            world: plan.world as u32,
            rank: rank as u32,
            local_experts: plan.local_experts as u32,
            experts: c.experts as u32,
            align: c.align as u32,
            row_bytes: plan.row_bytes as u32,
            ids_off: plan.ids_off as u32,
            w_off: plan.w_off as u32,
            scales_off: plan.scales_off as u32,
            scales: plan.scales as u32,
            scale_block: plan.scale_block as u32,
            out_row_bytes: plan.out_row_bytes as u32,
            ..Self::default()
        }
    }
}

/// The kernels of one element type's module: those of a native dispatch and its combine in
/// launch order, then the FP8 wire's pack and unpacks ([`Wire::kernels`] picks a dispatch's).
pub const KERNELS: [&str; 10] = [
    "moe_layout",
    "moe_pack",
    "moe_positions",
    "moe_unpack",
    "moe_combine_pack",
    "moe_combine_pack_lean",
    "moe_combine_final",
    "moe_pack_fp8",
    "moe_unpack_dequant",
    "moe_unpack_fp8",
];

/// The most blocks a launch of a layer's kernels takes on a GPU of `sms` SMs: `budget`
/// (an SM budget, 1 to 8 a SM) or, with none, 8 a SM (`Moe::set_sm_budget`).
pub fn launch_cap(budget: Option<usize>, sms: usize) -> Result<u32> {
    let most = 8 * sms.max(1);
    match budget {
        None => Ok(most as u32),
        Some(b) if (1..=most).contains(&b) => Ok(b as u32),
        Some(b) => Err(Error::InvalidArgument {
            op: "moe",
            reason: format!("an SM budget of {b} blocks (1 to {most}, 8 a SM)"),
        }),
    }
}

/// The build of the combine's pack kernel for a launch of `blocks` blocks on a GPU of `sms`
/// SMs (`moe.cu`): the lean one (four blocks an SM, a little spilled) when the blocks fit the
/// GPU at once only so, else the unbounded one (two blocks an SM; larger launches stride).
pub fn combine_pack_kernel(blocks: usize, sms: usize) -> &'static str {
    if blocks > 2 * sms && blocks <= 4 * sms {
        "moe_combine_pack_lean"
    } else {
        "moe_combine_pack"
    }
}

/// The name expression of kernel `name` (one of [`KERNELS`]) for `dtype`.
pub fn kernel_expression(name: &str, dtype: DataType) -> String {
    match name {
        "moe_layout" | "moe_positions" => format!("devcomm::moe::{name}"),
        _ => format!("devcomm::moe::{name}<{}>", dtype.device_type()),
    }
}

/// The module of the MoE kernels for rows of `dtype` (`DEVCOMM_TRACE` does not apply: they
/// record no events).
pub fn module_spec(dtype: DataType) -> KernelSpec {
    let source = format!(
        "{KERNEL_SOURCE}\nstatic_assert(sizeof(devcomm::moe::MoeArgs) == {}, \"MoeArgs differs from \
         src/moe/mod.rs\");\n",
        std::mem::size_of::<MoeArgs>()
    );
    let mut spec = KernelSpec::new(format!("moe_{}", dtype.name()), source);
    for k in KERNELS {
        spec = spec.name_expression(kernel_expression(k, dtype));
    }
    spec
}

#[cfg(test)]
mod tests;
