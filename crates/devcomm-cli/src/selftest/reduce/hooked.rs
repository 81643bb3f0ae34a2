//! The reduce-scatter with an accumulate epilogue (`examples/hooks/accumulate.cu`):
//! `out += reduce_scatter(in)`, out of place and in place, one round and several, bit for bit
//! against the host (the reduction in rank order, then one f32 addition); and the all-reduce +
//! residual + RMSNorm + FP8 example (`examples/all_reduce_rmsnorm_fp8.rs`) on ordinary and pool
//! buffers, at its own row group and at 512 and 32 lanes a row, bit for bit against its host
//! reference.

use cudarc::driver::DevicePtr;
use devcomm::{DataType, HookArgs, Hooks, ReduceOp};

use super::reference::{data, first_diff, reduce};
use crate::selftest::harness::Ctx;

#[allow(dead_code)]
#[path = "../../../../devcomm/examples/all_reduce_rmsnorm_fp8.rs"]
mod rmsnorm_fp8_example;

type Check = Result<String, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// One accumulate reduce-scatter of `rows x row_len` output elements per rank.
fn accumulate_once(
    cx: &Ctx,
    hooks: &Hooks<f32>,
    (rows, row_len): (usize, usize),
    op: ReduceOp,
    in_place: bool,
    tag: u64,
) -> Result<(), String> {
    let (rank, w) = (cx.comm.rank(), cx.comm.world_size());
    let n = rows * row_len;
    let inputs: Vec<Vec<f32>> = (0..w).map(|p| data::<f32>(cx.seed, tag, p, w * n)).collect();
    let reduced = reduce(&inputs, op, rank * n, n);
    let s = &cx.stream;
    let args = HookArgs::rows(row_len);
    let what = format!("accumulate {op} of {rows} x {row_len}{}", if in_place { " in place" } else { "" });
    let (got, want) = if in_place {
        let buf = s.clone_htod(&inputs[rank]).map_err(err)?;
        let p = buf.device_ptr(s).0;
        // SAFETY: `buf` holds w x n f32 on this stream and lives until after the sync below.
        unsafe {
            cx.comm
                .reduce_scatter_hooked_raw(hooks.raw(), p, p, n, DataType::F32, op, &args, s)
        }
        .map_err(|e| format!("{what}: {e}"))?;
        cx.sync()?;
        let mut want = inputs[rank].clone();
        for (i, r) in reduced.iter().enumerate() {
            want[rank * n + i] += r;
        }
        (s.clone_dtoh(&buf).map_err(err)?, want)
    } else {
        let before = data::<f32>(cx.seed, tag + 1, rank, n);
        let input = s.clone_htod(&inputs[rank]).map_err(err)?;
        let mut out = s.clone_htod(&before).map_err(err)?;
        cx.comm
            .reduce_scatter_hooked(hooks, &input, &mut out, op, &args, s)
            .map_err(|e| format!("{what}: {e}"))?;
        cx.sync()?;
        let want: Vec<f32> = before.iter().zip(&reduced).map(|(b, r)| r + b).collect();
        (s.clone_dtoh(&out).map_err(err)?, want)
    };
    match first_diff(&got, &want) {
        Some((i, g, x)) => Err(format!("{what}: element {i} is {g}, expected {x}")),
        None => Ok(()),
    }
}

pub(super) fn check_accumulate(cx: &Ctx) -> Check {
    let hooks = Hooks::<f32, f32>::new(
        "Accumulate",
        include_str!("../../../../devcomm/examples/hooks/accumulate.cu"),
    );
    let mut tag = 60_000;
    for shape in [(37usize, 1000usize), (1, 7), (1000, 4096)] {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            for in_place in [false, true] {
                tag += 2;
                accumulate_once(cx, &hooks, shape, op, in_place, tag)?;
            }
        }
    }
    Ok("reduce-scatter + accumulate hook: 37 x 1000, 1 x 7, 1000 x 4096 (several rounds), sum \
        and max, in and out of place, bit for bit"
        .into())
}

/// The all-reduce + residual + RMSNorm + FP8 example against its host reference: fewer rows
/// than ranks (some ranks' hooks see no row), columns that are no multiple of the warp or
/// fewer than a warp, 4096 columns; then with the input and output in the memory pool. At the
/// example's row group (128 lanes); then the hook with its `kRowThreads` set to 512 (the whole
/// block on a row: fewer columns than lanes, the two-shot, the zero-copy paths) and to 32 (one
/// warp, `row_sum` as `warp_sum`).
pub(super) fn check_rmsnorm_fp8(cx: &Ctx) -> Check {
    use rmsnorm_fp8_example::{RMSNORM_FP8_HOOKS, RMSNORM_FP8_ROW_THREADS};
    let w = cx.comm.world_size();
    let wide = crate::selftest::harness::with_row_threads(RMSNORM_FP8_HOOKS, 512)?;
    let warp = crate::selftest::harness::with_row_threads(RMSNORM_FP8_HOOKS, 32)?;
    let own = (RMSNORM_FP8_HOOKS, RMSNORM_FP8_ROW_THREADS);
    let mut done = Vec::new();
    for (k, (rows, cols, pooled, hook)) in [
        (w.max(2) - 1, 1000, false, own),
        (5, 7, false, own),
        (257, 4096, false, own),
        (37, 1000, true, own),
        (512, 4096, true, own),
        (5, 7, false, (wide.as_str(), 512)),
        (16, 7168, false, (wide.as_str(), 512)),
        (257, 4096, false, (wide.as_str(), 512)),
        (37, 1000, true, (wide.as_str(), 512)),
        (257, 4096, false, (warp.as_str(), 32)),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = cx.seed ^ (k as u64 + 1);
        let msg = rmsnorm_fp8_example::run_rmsnorm_fp8(
            &cx.comm,
            &cx.stream,
            (rows, cols),
            seed,
            pooled,
            hook,
        )?;
        done.push(msg);
    }
    Ok(done.join("; "))
}
