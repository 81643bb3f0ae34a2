//! How a dispatch's token rows cross the wire ([`Wire`]) and what that decides: the bytes of a
//! row's values, its scales, the output's form and the pack and unpack kernels. Pure.

use crate::reduce::DataType;

/// What one `f32` scale covers when rows travel as FP8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Scales {
    /// One scale per row.
    PerRow,
    /// One scale per 128 consecutive elements (DeepEP's and DeepSeek-V3's blocks); `hidden`
    /// must be a multiple of 128.
    Per128,
}

/// What the expert-major output of an FP8 dispatch holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Output {
    /// Rows of the input type: each element `e4m3 x scale` in `f32`, rounded to it.
    Dequantised,
    /// The e4m3 codes as they came (`u8 [out_rows, hidden]`) and their scales
    /// (`f32 [out_rows, scales per row]`), for experts that take FP8 directly.
    Fp8,
}

/// How a dispatch's token rows cross the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wire {
    /// As they are (bf16, f16 or f32): the output rows equal the input rows bit for bit.
    #[default]
    Native,
    /// Quantised to FP8 (OCP e4m3fn) where each row is packed for sending, with `f32` scales
    /// (`amax / 448` per block; `moe::fp8` has the exact rule), and given back as `output`
    /// says.
    Fp8 {
        /// What a scale covers.
        scales: Fp8Scales,
        /// Dequantised rows, or FP8 and scales.
        output: Fp8Output,
    },
}

/// Elements a scale covers in a per-128-block row.
pub const FP8_BLOCK: usize = 128;

impl Wire {
    /// Elements per scale in a row of `hidden` elements: `None` for native rows.
    pub fn scale_block(self, hidden: usize) -> Option<usize> {
        match self {
            Wire::Native => None,
            Wire::Fp8 {
                scales: Fp8Scales::PerRow,
                ..
            } => Some(hidden),
            Wire::Fp8 {
                scales: Fp8Scales::Per128,
                ..
            } => Some(FP8_BLOCK),
        }
    }

    /// Scales per row (0 for native rows).
    pub fn scales_per_row(self, hidden: usize) -> usize {
        self.scale_block(hidden).map_or(0, |b| hidden / b)
    }

    /// Bytes of a row's values on the wire: `hidden` elements of `dtype`, or one byte each as
    /// FP8 (the scales come after them).
    pub fn value_bytes(self, hidden: usize, dtype: DataType) -> usize {
        match self {
            Wire::Native => hidden * dtype.size_bytes(),
            Wire::Fp8 { .. } => hidden,
        }
    }

    /// Bytes of one row of the expert-major output: the input type's, or one byte per element
    /// when it holds FP8.
    pub fn out_row_bytes(self, hidden: usize, dtype: DataType) -> usize {
        match self {
            Wire::Fp8 {
                output: Fp8Output::Fp8,
                ..
            } => hidden,
            _ => hidden * dtype.size_bytes(),
        }
    }

    /// Whether the output holds FP8 codes and scales (the dispatch then writes `out_scales`).
    pub fn outputs_fp8(self) -> bool {
        matches!(
            self,
            Wire::Fp8 {
                output: Fp8Output::Fp8,
                ..
            }
        )
    }

    /// Why rows of `hidden` elements of `dtype` cannot travel so, if they cannot: FP8 takes
    /// bf16, f16 or f32 rows whose e4m3 form is whole 16-byte units (`hidden` a multiple of
    /// 16), and per-128 scales whole blocks (a multiple of 128).
    pub fn refusal(self, hidden: usize, dtype: DataType) -> Option<String> {
        let Wire::Fp8 { scales, .. } = self else {
            return None;
        };
        if !matches!(dtype, DataType::BF16 | DataType::F16 | DataType::F32) {
            return Some(format!(
                "FP8 on the wire takes bf16, f16 or f32 rows, not {}",
                dtype.name()
            ));
        }
        match scales {
            Fp8Scales::Per128 if hidden % FP8_BLOCK != 0 => Some(format!(
                "FP8 with per-128 scales needs hidden a multiple of 128; hidden is {hidden}"
            )),
            _ if hidden % 16 != 0 => Some(format!(
                "FP8 on the wire needs hidden a multiple of 16 (whole 16-byte units of e4m3); \
                 hidden is {hidden}"
            )),
            _ => None,
        }
    }

    /// The pack and unpack kernels of the dispatch (the rest are the same for every wire).
    pub fn kernels(self) -> (&'static str, &'static str) {
        match self {
            Wire::Native => ("moe_pack", "moe_unpack"),
            Wire::Fp8 {
                output: Fp8Output::Dequantised,
                ..
            } => ("moe_pack_fp8", "moe_unpack_dequant"),
            Wire::Fp8 {
                output: Fp8Output::Fp8,
                ..
            } => ("moe_pack_fp8", "moe_unpack_fp8"),
        }
    }

    /// A short name for logs and tables: `native`, `fp8-row`, `fp8-128`, with `-deq` when
    /// dequantised.
    pub fn name(self) -> String {
        match self {
            Wire::Native => "native".into(),
            Wire::Fp8 { scales, output } => format!(
                "fp8-{}{}",
                match scales {
                    Fp8Scales::PerRow => "row",
                    Fp8Scales::Per128 => "128",
                },
                match output {
                    Fp8Output::Dequantised => "-deq",
                    Fp8Output::Fp8 => "",
                }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: Wire = Wire::Fp8 {
        scales: Fp8Scales::PerRow,
        output: Fp8Output::Fp8,
    };
    const BLOCKS: Wire = Wire::Fp8 {
        scales: Fp8Scales::Per128,
        output: Fp8Output::Dequantised,
    };

    #[test]
    fn scales_cover_a_row_or_128_elements() {
        assert_eq!(Wire::Native.scale_block(7168), None);
        assert_eq!(Wire::Native.scales_per_row(7168), 0);
        assert_eq!(ROW.scale_block(7168), Some(7168));
        assert_eq!(ROW.scales_per_row(7168), 1);
        assert_eq!(BLOCKS.scale_block(7168), Some(128));
        assert_eq!(BLOCKS.scales_per_row(7168), 56);
    }

    #[test]
    fn fp8_values_take_a_byte_each_and_the_output_follows_its_form() {
        assert_eq!(Wire::Native.value_bytes(7168, DataType::BF16), 14336);
        assert_eq!(ROW.value_bytes(7168, DataType::F32), 7168);
        assert_eq!(BLOCKS.value_bytes(7168, DataType::BF16), 7168);
        assert_eq!(Wire::Native.out_row_bytes(64, DataType::F32), 256);
        assert_eq!(BLOCKS.out_row_bytes(64, DataType::F32), 256);
        assert_eq!(ROW.out_row_bytes(64, DataType::F32), 64);
        assert!(ROW.outputs_fp8() && !BLOCKS.outputs_fp8() && !Wire::Native.outputs_fp8());
    }

    #[test]
    fn fp8_refuses_hidden_sizes_and_types_it_cannot_carry() {
        assert_eq!(Wire::Native.refusal(8, DataType::BF16), None);
        assert_eq!(ROW.refusal(16, DataType::BF16), None);
        assert!(ROW
            .refusal(24, DataType::BF16)
            .unwrap()
            .contains("multiple of 16"));
        assert_eq!(BLOCKS.refusal(256, DataType::F16), None);
        let r = BLOCKS.refusal(200, DataType::BF16).unwrap();
        assert!(r.contains("multiple of 128") && r.contains("200"), "{r}");
        assert!(ROW.refusal(128, DataType::I32).unwrap().contains("i32"));
    }

    #[test]
    fn each_form_has_its_pack_and_unpack_kernels() {
        assert_eq!(Wire::Native.kernels(), ("moe_pack", "moe_unpack"));
        assert_eq!(BLOCKS.kernels(), ("moe_pack_fp8", "moe_unpack_dequant"));
        assert_eq!(ROW.kernels(), ("moe_pack_fp8", "moe_unpack_fp8"));
    }

    #[test]
    fn names_say_scales_and_form() {
        assert_eq!(Wire::Native.name(), "native");
        assert_eq!(ROW.name(), "fp8-row");
        assert_eq!(BLOCKS.name(), "fp8-128-deq");
    }
}
