use super::*;

fn deepseek() -> MoeConfig {
    MoeConfig {
        experts: 256,
        top_k: 8,
        hidden: 7168,
        dtype: DataType::BF16,
        max_tokens: 8192,
        align: 128,
        wire: Wire::Native,
    }
}

fn fp8(scales: Fp8Scales, output: Fp8Output) -> MoeConfig {
    MoeConfig {
        wire: Wire::Fp8 { scales, output },
        ..deepseek()
    }
}

#[test]
fn a_packed_row_holds_the_token_its_ids_and_weights_in_16_byte_units() {
    let p = MoePlan::new(deepseek(), 4).unwrap();
    assert_eq!(p.local_experts, 64);
    assert_eq!(p.hidden_bytes, 14336);
    assert_eq!(p.ids_off, 14336);
    assert_eq!(p.w_off, 14336 + 16);
    assert_eq!(p.row_bytes, 14336 + 16 + 32);
    assert_eq!(p.row_bytes % 16, 0);
    // A token goes at most once to each of min(world, k) ranks; each rank sends at most
    // max_tokens rows to any one rank.
    assert_eq!(p.send_rows, 8192 * 4);
    assert_eq!(p.recv_rows, 8192 * 4);
    // Three ids pad to 8 bytes before the weights.
    let odd = MoePlan::new(
        MoeConfig {
            top_k: 3,
            ..deepseek()
        },
        4,
    )
    .unwrap();
    assert_eq!((odd.w_off, odd.row_bytes), (14336 + 8, 14336 + 32));
    // Native rows carry no scales; the output rows are the input's.
    assert_eq!((p.wire_bytes, p.scales, p.scale_block), (14336, 0, 0));
    assert_eq!((p.scales_off, p.out_row_bytes), (14336, 14336));
}

#[test]
fn an_fp8_row_holds_e4m3_values_then_scales_ids_and_weights() {
    // Per 128: 7168 bytes of e4m3, 56 f32 scales, 8 u16 ids, 8 f32 weights: 7168 + 224 + 16
    // + 32 = 7440, a multiple of 16.
    let p = MoePlan::new(fp8(Fp8Scales::Per128, Fp8Output::Fp8), 4).unwrap();
    assert_eq!((p.wire_bytes, p.scale_block, p.scales), (7168, 128, 56));
    assert_eq!(p.scales_off, 7168);
    assert_eq!(p.ids_off, 7168 + 224);
    assert_eq!(p.w_off, 7168 + 224 + 16);
    assert_eq!(p.row_bytes, 7440);
    // The output holds FP8: a byte per element; the combine's rows stay bf16.
    assert_eq!((p.out_row_bytes, p.hidden_bytes), (7168, 14336));
    // Per row: one scale; 7168 + 4 + 16 + 32 = 7220, padded to 7232.
    let r = MoePlan::new(fp8(Fp8Scales::PerRow, Fp8Output::Dequantised), 4).unwrap();
    assert_eq!((r.scale_block, r.scales, r.ids_off), (7168, 1, 7172));
    assert_eq!((r.w_off, r.row_bytes), (7188, 7232));
    assert_eq!(r.out_row_bytes, 14336);
    // Half the bytes of the bf16 row (14384) cross, give or take the scales.
    let native = MoePlan::new(deepseek(), 4).unwrap();
    assert!(r.row_bytes * 2 < native.row_bytes + 128);
    // Three ids after one scale: 4 + 6 = 10 bytes, weights at 12.
    let odd = MoePlan::new(
        MoeConfig {
            top_k: 3,
            hidden: 16,
            ..fp8(Fp8Scales::PerRow, Fp8Output::Fp8)
        },
        4,
    )
    .unwrap();
    assert_eq!((odd.ids_off, odd.w_off, odd.row_bytes), (20, 28, 48));
    for p in [p, r, odd] {
        assert_eq!(p.row_bytes % 16, 0);
        assert_eq!(p.ids_off, p.scales_off + 4 * p.scales);
        assert!(p.w_off + 4 * p.config.top_k <= p.row_bytes);
    }
}

#[test]
fn fp8_rows_refuse_hidden_sizes_they_cannot_carry() {
    let err = |c: MoeConfig| MoePlan::new(c, 4).unwrap_err();
    let e = err(MoeConfig {
        hidden: 200,
        ..fp8(Fp8Scales::Per128, Fp8Output::Dequantised)
    });
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(e.to_string().contains("multiple of 128"), "{e}");
    // Per row, 200 is not whole 16-byte units of e4m3; 208 is.
    let e = err(MoeConfig {
        hidden: 200,
        ..fp8(Fp8Scales::PerRow, Fp8Output::Fp8)
    });
    assert!(e.to_string().contains("multiple of 16"), "{e}");
    let ok = MoeConfig {
        hidden: 208,
        ..fp8(Fp8Scales::PerRow, Fp8Output::Fp8)
    };
    assert_eq!(MoePlan::new(ok, 4).unwrap().scales, 1);
}

#[test]
fn output_rows_for_the_worst_case_and_for_near_uniform_routings() {
    let p = MoePlan::new(deepseek(), 4).unwrap();
    assert_eq!(p.worst_case_out_rows(), 8192 * 4 * 8 + 64 * 127);
    // 128 tokens x 4 ranks x 8 / 256 experts = 16 a expert, twice that padded to 128.
    assert_eq!(p.typical_out_rows(128, 2.0), 128 * 64);
    let two = MoePlan::new(
        MoeConfig {
            experts: 4,
            top_k: 8,
            align: 1,
            ..deepseek()
        },
        2,
    )
    .unwrap();
    // Each token at most once per local expert.
    assert_eq!(two.worst_case_out_rows(), 8192 * 2 * 2);
}

#[test]
fn bad_configurations_say_why() {
    let err = |c: MoeConfig, world: usize| MoePlan::new(c, world).unwrap_err().to_string();
    assert!(err(
        MoeConfig {
            experts: 6,
            ..deepseek()
        },
        4
    )
    .contains("do not divide"));
    assert!(err(
        MoeConfig {
            hidden: 7,
            ..deepseek()
        },
        4
    )
    .contains("multiple of 16"));
    assert!(err(
        MoeConfig {
            top_k: 33,
            ..deepseek()
        },
        4
    )
    .contains("top_k"));
    assert!(err(
        MoeConfig {
            align: 0,
            ..deepseek()
        },
        4
    )
    .contains("align"));
    assert!(err(
        MoeConfig {
            dtype: DataType::I32,
            ..deepseek()
        },
        4
    )
    .contains("not supported"));
    assert!(err(deepseek(), 65).contains("65 ranks"));
    assert!(err(
        MoeConfig {
            experts: 4096,
            ..deepseek()
        },
        2
    )
    .contains("per rank"));
}

#[test]
fn the_module_names_each_kernel_for_its_type() {
    let spec = module_spec(DataType::BF16);
    assert_eq!(spec.name, "moe_bf16");
    assert!(spec
        .name_expressions
        .contains(&"devcomm::moe::moe_pack<devcomm::red::BF16>".to_string()));
    assert!(spec
        .name_expressions
        .contains(&"devcomm::moe::moe_layout".to_string()));
    assert!(spec
        .name_expressions
        .contains(&"devcomm::moe::moe_unpack_dequant<devcomm::red::BF16>".to_string()));
    assert_eq!(spec.name_expressions.len(), KERNELS.len());
    assert!(spec.source.contains("sizeof(devcomm::moe::MoeArgs) == 320"));
}

#[test]
fn the_kernel_argument_matches_the_struct_in_moe_cu() {
    // 31 u64 and 18 u32 fields.
    assert_eq!(std::mem::size_of::<MoeArgs>(), 31 * 8 + 18 * 4);
    // The C++ struct lists the same fields in the same order (moe.cu).
    let fields: Vec<&str> = KERNEL_SOURCE
        .split("struct MoeArgs {")
        .nth(1)
        .unwrap()
        .split("};")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            l.starts_with("dc_u").then(|| {
                l.split(';')
                    .next()
                    .unwrap()
                    .split_whitespace()
                    .nth(1)
                    .unwrap()
            })
        })
        .collect();
    let rust = format!("{:?}", MoeArgs::default());
    let rust_fields: Vec<&str> = rust
        .trim_start_matches("MoeArgs { ")
        .split(", ")
        .map(|f| f.split(':').next().unwrap())
        .collect();
    assert_eq!(fields, rust_fields);
}

#[test]
fn the_direct_area_holds_two_calls_of_rows_and_sums_per_rank() {
    let p = MoePlan::new(deepseek(), 4).unwrap();
    let a = p.direct_area();
    // Signal words (2 x world) and tokens words (2 x world) first, each part 256-aligned.
    assert_eq!(a.tokens_off, 256);
    assert_eq!(a.rows_off, 512);
    assert_eq!(a.sums_off, 512 + 2 * 4 * 8192 * p.row_bytes);
    assert_eq!(a.bytes, a.sums_off + 2 * 4 * 8192 * 14336);
    assert!([a.tokens_off, a.rows_off, a.sums_off]
        .iter()
        .all(|o| o % 256 == 0));
    // As much as the all-to-all-v path's four buffers (send, receive, sums out and back).
    let staged =
        (p.send_rows + p.recv_rows) * p.row_bytes + (p.recv_rows + p.send_rows) * p.hidden_bytes;
    assert!(a.bytes <= staged + 1024, "{} against {staged}", a.bytes);
    // A row of 14,336 bytes is 7 parts of 2 KiB (a warp each).
    assert_eq!(p.row_parts(), 7);
    let tiny = MoePlan::new(
        MoeConfig {
            hidden: 8,
            max_tokens: 1,
            ..deepseek()
        },
        1,
    )
    .unwrap();
    assert_eq!(tiny.row_parts(), 1);
}

#[test]
fn an_sm_budget_caps_the_launches_or_is_refused() {
    assert_eq!(launch_cap(None, 132).unwrap(), 1056);
    assert_eq!(launch_cap(Some(24), 132).unwrap(), 24);
    assert_eq!(launch_cap(Some(1056), 132).unwrap(), 1056);
    for b in [0, 1057] {
        let e = launch_cap(Some(b), 132).unwrap_err().to_string();
        assert!(
            e.contains(&format!("an SM budget of {b} blocks (1 to 1056")),
            "{e}"
        );
    }
}

#[test]
fn the_lean_combine_pack_serves_launches_that_then_fit_at_once() {
    // 132 SMs: up to 264 blocks fit at two an SM, 528 at four.
    assert_eq!(combine_pack_kernel(224, 132), "moe_combine_pack");
    assert_eq!(combine_pack_kernel(448, 132), "moe_combine_pack_lean");
    assert_eq!(combine_pack_kernel(528, 132), "moe_combine_pack_lean");
    assert_eq!(combine_pack_kernel(1056, 132), "moe_combine_pack");
}

#[test]
fn grids_follow_the_parts_and_the_tokens() {
    let p = MoePlan::new(deepseek(), 4).unwrap();
    // bf16 rows of 7168: 7 parts of 2 KiB; FP8 per 128: 7 parts of 1,024 elements; the codes
    // of a row: 4 parts of 2 KiB (the last partial); the per-row scale's pack: a row whole.
    assert_eq!(p.kernel_parts("moe_pack"), 7);
    assert_eq!(p.kernel_parts("moe_combine_final"), 7);
    assert_eq!(p.kernel_parts("moe_unpack_dequant"), 7);
    assert_eq!(p.kernel_parts("moe_unpack_fp8"), 4);
    assert_eq!(p.kernel_parts("moe_positions"), 1);
    let per128 = MoePlan::new(fp8(Fp8Scales::Per128, Fp8Output::Fp8), 4).unwrap();
    assert_eq!(per128.kernel_parts("moe_pack_fp8"), 7);
    let per_row = MoePlan::new(fp8(Fp8Scales::PerRow, Fp8Output::Dequantised), 4).unwrap();
    assert_eq!(per_row.kernel_parts("moe_pack_fp8"), 1);
    // Rows expected: as many tokens from every rank, at least 1, at most the buffers' rows.
    assert_eq!(p.expected_rows(128), 512);
    assert_eq!(p.expected_rows(0), 1);
    assert_eq!(p.expected_rows(8192), p.recv_rows);
}
