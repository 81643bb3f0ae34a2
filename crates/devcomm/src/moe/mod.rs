//! Mixture-of-experts dispatch and combine (docs/MOE.md): the pure part. [`MoeConfig`] is what
//! a user chooses, [`MoePlan`] everything derived from it (the packed row's layout, the
//! buffers' rows), checked once; [`MoeArgs`] is the kernels' argument; [`module_spec`] their
//! module; [`reference`] the same computation on the host, in the same order, for the tests.
//! The calls themselves are [`crate::Moe`]'s (`comm/moe.rs`).

pub mod reference;

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
    /// Bytes of one token row.
    pub hidden_bytes: usize,
    /// Byte offset of the `u16` local expert ids in a packed row.
    pub ids_off: usize,
    /// Byte offset of the `f32` weights in a packed row.
    pub w_off: usize,
    /// Bytes of a packed row (token, ids, weights, padding to 16).
    pub row_bytes: usize,
    /// Rows a rank may send: each token at most once per rank.
    pub send_rows: usize,
    /// Rows a rank may receive: at most `max_tokens` from each rank.
    pub recv_rows: usize,
}

const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
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
        let ids_off = hidden_bytes;
        let w_off = round_up(ids_off + 2 * c.top_k, 4);
        let row_bytes = round_up(w_off + 4 * c.top_k, 16);
        if row_bytes > u32::MAX as usize {
            return Err(bad(format!("a row of {row_bytes} bytes")));
        }
        Ok(Self {
            config,
            world,
            local_experts,
            hidden_bytes,
            ids_off,
            w_off,
            row_bytes,
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
            ..Self::default()
        }
    }
}

/// The kernels of one element type, in launch order.
pub const KERNELS: [&str; 6] = [
    "moe_layout",
    "moe_pack",
    "moe_positions",
    "moe_unpack",
    "moe_combine_pack",
    "moe_combine_final",
];

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
