//! What a typed dispatch's buffers must hold ([`MoePlan::dispatch_rows`]): its token count and
//! output rows from their sizes, or why they do not fit the layer. Pure.

use super::MoePlan;
use crate::error::{Error, Result};

/// The bytes of a dispatch's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchBytes {
    /// Bytes of one element of `x` (the caller's element type).
    pub x_elem: usize,
    /// `x`.
    pub x: usize,
    /// `topk_idx`.
    pub topk_idx: usize,
    /// `topk_weights`.
    pub topk_weights: usize,
    /// Bytes of one element of `out_x` (the input type's, or 1 for FP8).
    pub out_elem: usize,
    /// `out_x`.
    pub out_x: usize,
    /// `out_weights`.
    pub out_weights: usize,
    /// `out_scales`, where the call has them (an FP8 output).
    pub out_scales: Option<usize>,
    /// `expert_counts`.
    pub expert_counts: usize,
}

impl MoePlan {
    /// `(tokens, out_rows)` of a dispatch with buffers of `b` bytes: `x` whole rows of the
    /// layer's type, `out_x` whole output rows of the layer's form (the input type, or e4m3
    /// bytes when its wire returns FP8, with scales then and only then), the rest at least as
    /// large as those counts need.
    pub fn dispatch_rows(&self, b: DispatchBytes) -> Result<(usize, usize)> {
        let bad = |reason: String| Error::InvalidArgument { op: "moe", reason };
        let c = &self.config;
        let (es, fp8) = (c.dtype.size_bytes(), c.wire.outputs_fp8());
        let out_elem = if fp8 { 1 } else { es };
        if b.out_scales.is_some() != fp8 {
            return Err(bad(if fp8 {
                "this layer's wire returns FP8 and scales: dispatch_fp8".into()
            } else {
                "this layer does not return FP8: dispatch, without scales".into()
            }));
        }
        if b.x_elem != es || b.out_elem != out_elem {
            return Err(bad(format!(
                "x has elements of {} bytes and out_x of {}; this layer takes {} and gives {} ({})",
                b.x_elem,
                b.out_elem,
                c.dtype.name(),
                if fp8 { "e4m3" } else { c.dtype.name() },
                if fp8 { "dispatch_fp8" } else { "dispatch" }
            )));
        }
        let (row, out_row) = (self.hidden_bytes, self.out_row_bytes);
        if b.x % row != 0 || b.out_x % out_row != 0 {
            return Err(bad(format!(
                "x ({} bytes) and out_x ({} bytes) must be whole rows of {} x {} and {} x {} bytes",
                b.x, b.out_x, c.hidden, es, c.hidden, out_elem
            )));
        }
        let (tokens, out_rows) = (b.x / row, b.out_x / out_row);
        let want = [
            ("topk_idx", b.topk_idx, tokens * c.top_k * 8),
            ("topk_weights", b.topk_weights, tokens * c.top_k * 4),
            ("out_weights", b.out_weights, out_rows * 4),
            (
                "out_scales",
                b.out_scales.unwrap_or(0),
                if fp8 { out_rows * self.scales * 4 } else { 0 },
            ),
            ("expert_counts", b.expert_counts, self.local_experts * 8),
        ];
        if let Some((name, got, need)) = want.into_iter().find(|(_, g, n)| g < n) {
            return Err(bad(format!("{name} holds {got} bytes; {need} are needed")));
        }
        Ok((tokens, out_rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::{Fp8Output, Fp8Scales, MoeConfig, Wire};
    use crate::reduce::DataType;

    fn plan(wire: Wire) -> MoePlan {
        let config = MoeConfig {
            experts: 8,
            top_k: 2,
            hidden: 256,
            dtype: DataType::BF16,
            max_tokens: 64,
            align: 4,
            wire,
        };
        MoePlan::new(config, 2).unwrap()
    }

    /// Buffers for 10 tokens and 40 output rows of `plan`.
    fn fitting(p: &MoePlan) -> DispatchBytes {
        let fp8 = p.config.wire.outputs_fp8();
        DispatchBytes {
            x_elem: 2,
            x: 10 * 512,
            topk_idx: 10 * 2 * 8,
            topk_weights: 10 * 2 * 4,
            out_elem: if fp8 { 1 } else { 2 },
            out_x: 40 * p.out_row_bytes,
            out_weights: 40 * 4,
            out_scales: fp8.then_some(40 * p.scales * 4),
            expert_counts: 4 * 8,
        }
    }

    const FP8_BLOCKS: Wire = Wire::Fp8 {
        scales: Fp8Scales::Per128,
        output: Fp8Output::Fp8,
    };

    #[test]
    fn tokens_and_output_rows_come_from_the_sizes() {
        for wire in [
            Wire::Native,
            FP8_BLOCKS,
            Wire::Fp8 {
                scales: Fp8Scales::PerRow,
                output: Fp8Output::Dequantised,
            },
        ] {
            let p = plan(wire);
            assert_eq!(p.dispatch_rows(fitting(&p)).unwrap(), (10, 40), "{wire:?}");
        }
        // FP8 output rows are a byte per element.
        let p = plan(FP8_BLOCKS);
        assert_eq!(fitting(&p).out_x, 40 * 256);
        assert_eq!(fitting(&p).out_scales, Some(40 * 2 * 4));
    }

    #[test]
    fn each_form_takes_its_own_output_and_says_which_call_fits() {
        let native = plan(Wire::Native);
        let e = native
            .dispatch_rows(DispatchBytes {
                out_scales: Some(0),
                ..fitting(&native)
            })
            .unwrap_err();
        assert!(e.to_string().contains("does not return FP8"), "{e}");
        let p = plan(FP8_BLOCKS);
        let e = p
            .dispatch_rows(DispatchBytes {
                out_elem: 2,
                out_scales: None,
                ..fitting(&p)
            })
            .unwrap_err();
        assert!(e.to_string().contains("dispatch_fp8"), "{e}");
        let e = p
            .dispatch_rows(DispatchBytes {
                out_scales: None,
                ..fitting(&p)
            })
            .unwrap_err();
        assert!(e.to_string().contains("dispatch_fp8"), "{e}");
    }

    #[test]
    fn short_buffers_are_named() {
        let p = plan(FP8_BLOCKS);
        let short = |b: DispatchBytes| p.dispatch_rows(b).unwrap_err().to_string();
        let f = fitting(&p);
        assert!(short(DispatchBytes {
            out_scales: Some(40 * 2 * 4 - 4),
            ..f
        })
        .contains("out_scales holds 316 bytes; 320"));
        assert!(short(DispatchBytes {
            x: 10 * 512 + 2,
            ..f
        })
        .contains("whole rows"));
        assert!(short(DispatchBytes { topk_idx: 8, ..f }).contains("topk_idx"));
        assert!(short(DispatchBytes {
            expert_counts: 8,
            ..f
        })
        .contains("expert_counts"));
    }
}
