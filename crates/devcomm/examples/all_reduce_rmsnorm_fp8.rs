//! All-reduce + residual add + RMSNorm + FP8 (e4m3) quantisation in one call, the fusion an
//! inference engine runs after a tensor-parallel layer: the epilogue hook
//! (`hooks/rmsnorm_fp8.cu`) runs on every bf16 row of `cols` elements right after the row is
//! reduced and, per row, adds the residual (and writes the sum back as the new residual, as
//! vLLM's `fused_add_rms_norm` does), normalises with a weight vector, leaves the normalised
//! bf16 row in place (what every rank's output receives) and quantises it to e4m3 with a
//! per-row scale `amax / 448` (a row of zeros: scale 1) into an fp8 buffer and a scales array.
//!
//! Checked BIT FOR BIT against a host reference: the rank-order f32 sum of the ranks' bf16
//! inputs rounded once to bf16 (devcomm's fixed order), then the hook's steps in the hook's
//! order (`reference_row`): the hook uses only correctly rounded operations (`__fadd_rn`,
//! `__fmaf_rn`, `__fdiv_rn`, `__fsqrt_rn`, no `rsqrtf`) and a sum of squares of a fixed shape
//! (its `kRowThreads` lanes, then `row_sum`'s order), which the host replays
//! (`devcomm::reduce::rows`). The e4m3 encoder (`devcomm/fp8.cuh` on the device,
//! `devcomm::moe::fp8::e4m3_from_f32` on the host) rounds to nearest even and saturates at
//! +-448, like `cvt.rn.satfinite.e4m3x2.f32`.
//!
//! Where the side outputs land: the residual, fp8 and scales of a row are written on the rank
//! whose hook ran on the row. Hooked calls on ordinary buffers take the two-shot, so that is
//! the rank that reduced the row (a shard of rows per rank); the zero-copy one-shot on pool
//! buffers runs the hook on every rank. The other rows of these buffers keep what they held.
//! The check verifies each rank's rows (written ones against the reference, the others
//! untouched, nothing past the buffers' ends) and that every row was written on some rank.
//! An engine that needs the whole fp8 matrix (or the new residual) on every rank must gather
//! it from the rows' owners: the hook API has no way to publish side outputs to peers.
//!
//! On a machine with GPUs: `devcomm launch -n 4 -- target/release/examples/all_reduce_rmsnorm_fp8`

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use devcomm::reduce::rows::{lane_folds, row_max, row_sum};
use devcomm::{Comm, DataType, HookArgs, Hooks, ReduceOp};
use half::bf16;

/// The e4m3 encoder, bit for bit as the hook's (`devcomm/fp8.cuh`, the device header the hook
/// includes): the library's host model, tested there.
pub use devcomm::moe::fp8::{e4m3_from_f32, E4M3_MAX};

/// The user's hook (CUDA C++).
pub const RMSNORM_FP8_HOOKS: &str = include_str!("hooks/rmsnorm_fp8.cu");

/// The hook's row group (its `kRowThreads`).
pub const RMSNORM_FP8_ROW_THREADS: u32 = 128;

const EPS: f32 = 1e-6;
/// What the scales hold before the call: the hook never writes a negative scale, so a row
/// still holding it was not seen by this rank's hook.
const UNSET_SCALE: f32 = -1.0;
/// What the fp8 buffer holds before the call.
const FP8_FILL: u8 = 0xa5;
/// Guard elements past the end of the fp8 buffer and the scales (must stay untouched).
const GUARD: usize = 64;

/// One row as the hook leaves it.
#[derive(Debug, Clone, PartialEq)]
pub struct RowRef {
    /// The normalised row: what the all-reduce output receives.
    pub out: Vec<bf16>,
    /// The new residual.
    pub residual: Vec<bf16>,
    /// The e4m3 codes.
    pub fp8: Vec<u8>,
    /// amax / 448, or 1 for a row of zeros.
    pub scale: f32,
}

/// The hook's steps on one reduced row `x` with `lanes` threads a row, in the hook's order and
/// roundings.
pub fn reference_row(
    x: &[bf16],
    residual: &[bf16],
    weight: &[bf16],
    eps: f32,
    lanes: u32,
) -> RowRef {
    let cols = x.len();
    let h: Vec<bf16> = x
        .iter()
        .zip(residual)
        .map(|(a, b)| bf16::from_f32(a.to_f32() + b.to_f32()))
        .collect();
    // Lane l sums columns l, l + lanes, ... with fma; then row_sum's order: each warp's
    // butterfly, then the warps in order.
    let hf: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
    let lanes = lanes as usize;
    let mean = row_sum(&lane_folds(&hf, lanes, 0.0, |acc, f| f.mul_add(f, acc))) / cols as f32;
    let r = 1.0 / (mean + eps).sqrt();
    let out: Vec<bf16> = h
        .iter()
        .zip(weight)
        .map(|(v, w)| bf16::from_f32(v.to_f32() * r * w.to_f32()))
        .collect();
    let yf: Vec<f32> = out.iter().map(|v| v.to_f32().abs()).collect();
    let amax = row_max(&lane_folds(&yf, lanes, 0.0, f32::max));
    let (scale, inv) = if amax > 0.0 {
        (amax / E4M3_MAX, (E4M3_MAX / amax).min(f32::MAX))
    } else {
        (1.0, 1.0)
    };
    let fp8 = out
        .iter()
        .map(|v| e4m3_from_f32(v.to_f32() * inv))
        .collect();
    RowRef {
        out,
        residual: h,
        fp8,
        scale,
    }
}

fn sample(seed: u64, who: u64, i: usize) -> bf16 {
    let h = (seed ^ (who << 40) ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    bf16::from_f32((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) // [-0.5, 0.5)
}

/// The reduction as devcomm does it: f32 in rank order 0..n-1, rounded once to bf16.
fn rank_order_sum(inputs: &[Vec<bf16>]) -> Vec<bf16> {
    (0..inputs[0].len())
        .map(|i| {
            let mut acc = inputs[0][i].to_f32();
            for x in &inputs[1..] {
                acc += x[i].to_f32();
            }
            bf16::from_f32(acc)
        })
        .collect()
}

fn bits(v: &[bf16]) -> impl Iterator<Item = u16> + '_ {
    v.iter().map(|x| x.to_bits())
}

/// The first index where `got` and `want` differ, with both values.
fn first_diff<T: PartialEq + Copy>(got: &[T], want: &[T]) -> Option<(usize, T, T)> {
    got.iter()
        .zip(want)
        .position(|(g, w)| g != w)
        .map(|i| (i, got[i], want[i]))
}

/// `rows x cols` bf16 on every rank: all-reduce (sum) with the fused epilogue of `source`,
/// whose rows run on `row_threads` lanes (`RMSNORM_FP8_HOOKS`, `RMSNORM_FP8_ROW_THREADS`: the
/// example's), the input and output in the communicator's memory pool when `pooled`
/// (zero-copy paths), ordinary device buffers otherwise. Returns a summary or what differs.
pub fn run_rmsnorm_fp8(
    comm: &Comm,
    stream: &Arc<CudaStream>,
    (rows, cols): (usize, usize),
    seed: u64,
    pooled: bool,
    (source, row_threads): (&str, u32),
) -> Result<String, String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let e = |x: devcomm::Error| x.to_string();
    let c = |x: cudarc::driver::DriverError| x.to_string();
    let n = rows * cols;
    let inputs: Vec<Vec<bf16>> = (0..world)
        .map(|r| (0..n).map(|i| sample(seed, r as u64, i)).collect())
        .collect();
    let residual: Vec<bf16> = (0..n).map(|i| sample(seed, 1000, i)).collect();
    let weight: Vec<bf16> = (0..cols)
        .map(|i| bf16::from_f32(1.0 + sample(seed, 1001, i).to_f32()))
        .collect();
    let input = stream.clone_htod(&inputs[rank]).map_err(c)?;
    let mut output = stream.clone_htod(&vec![bf16::NAN; n]).map_err(c)?;
    let res_dev = stream.clone_htod(&residual).map_err(c)?;
    let w_dev = stream.clone_htod(&weight).map_err(c)?;
    let fp8_dev = stream.clone_htod(&vec![FP8_FILL; n + GUARD]).map_err(c)?;
    let scales_dev = stream
        .clone_htod(&vec![UNSET_SCALE; rows + GUARD])
        .map_err(c)?;
    // struct RmsNormFp8Args { BF16* residual; const BF16* weight; unsigned char* fp8;
    //                         float* scales; float eps; }
    let args = {
        let (r, _a) = res_dev.device_ptr(stream);
        let (w, _b) = w_dev.device_ptr(stream);
        let (q, _c) = fp8_dev.device_ptr(stream);
        let (s, _d) = scales_dev.device_ptr(stream);
        stream
            .clone_htod(&[r, w, q, s, u64::from(EPS.to_bits())])
            .map_err(c)?
    };
    let hooks = Hooks::<bf16, bf16>::new("RmsNormFp8", source);
    let hook_args = HookArgs::rows(cols).with_user(args.device_ptr(stream).0);
    if pooled {
        all_reduce_in_pool(comm, stream, &hooks, &hook_args, &input, &mut output)?;
    } else {
        comm.all_reduce_hooked(
            &hooks,
            &input,
            &mut output,
            ReduceOp::Sum,
            &hook_args,
            stream,
        )
        .map_err(e)?;
    }
    comm.synchronize(stream).map_err(e)?;
    let got = stream.clone_dtoh(&output).map_err(c)?;
    let got_res = stream.clone_dtoh(&res_dev).map_err(c)?;
    let got_fp8 = stream.clone_dtoh(&fp8_dev).map_err(c)?;
    let got_scales = stream.clone_dtoh(&scales_dev).map_err(c)?;

    let sum = rank_order_sum(&inputs);
    let mut seen = vec![0u8; rows];
    let mut worst_code = 0u8;
    for row in 0..rows {
        let at = row * cols;
        let span = at..at + cols;
        let want = reference_row(
            &sum[span.clone()],
            &residual[span.clone()],
            &weight,
            EPS,
            row_threads,
        );
        let g: Vec<u16> = bits(&got[span.clone()]).collect();
        if let Some((j, g, w)) = first_diff(&g, &bits(&want.out).collect::<Vec<_>>()) {
            return Err(format!(
                "rank {rank}: output row {row} col {j}: bf16 {g:#06x}, expected {w:#06x}"
            ));
        }
        let scale = got_scales[row];
        let (res_want, fp8_want): (&[bf16], Vec<u8>) = if scale.to_bits() == UNSET_SCALE.to_bits() {
            (&residual[span.clone()], vec![FP8_FILL; cols]) // not this rank's row: untouched
        } else {
            seen[row] = 1;
            if scale.to_bits() != want.scale.to_bits() {
                return Err(format!(
                    "rank {rank}: row {row}: scale {scale:e}, expected {:e}",
                    want.scale
                ));
            }
            (&want.residual, want.fp8.clone())
        };
        let gr: Vec<u16> = bits(&got_res[span.clone()]).collect();
        if let Some((j, g, w)) = first_diff(&gr, &bits(res_want).collect::<Vec<_>>()) {
            return Err(format!(
                "rank {rank}: residual row {row} col {j}: bf16 {g:#06x}, expected {w:#06x} \
                 (hook ran here: {})",
                seen[row] == 1
            ));
        }
        if let Some((j, g, w)) = first_diff(&got_fp8[span], &fp8_want) {
            return Err(format!(
                "rank {rank}: fp8 row {row} col {j}: {g:#04x}, expected {w:#04x} (hook ran \
                 here: {})",
                seen[row] == 1
            ));
        }
        worst_code = worst_code.max(want.fp8.iter().fold(0, |m, q| m.max(q & 0x7f)));
    }
    if got_fp8[n..].iter().any(|&b| b != FP8_FILL)
        || got_scales[rows..]
            .iter()
            .any(|s| s.to_bits() != UNSET_SCALE.to_bits())
    {
        return Err(format!(
            "rank {rank}: the hook wrote past the end of the fp8 buffer or the scales"
        ));
    }
    // Every rank holds the same output, and every row was seen by some rank's hook.
    let hash = bits(&got).fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ u64::from(v)).wrapping_mul(0x100_0000_01b3)
    });
    let mut mine = hash.to_le_bytes().to_vec();
    mine.extend_from_slice(&seen);
    let place = if pooled { "pool" } else { "ordinary" };
    let tag = format!("__devcomm_example/rmsnorm_fp8/{seed}/{rows}x{cols}/{place}/{row_threads}");
    let all = comm
        .store()
        .all_gather(&tag, &mine, comm.setup_timeout())
        .map_err(|x| x.to_string())?;
    if let Some(r) = all.iter().position(|h| h.get(..8) != Some(&mine[..8])) {
        return Err(format!("rank {r}'s output differs from rank {rank}'s"));
    }
    if let Some(row) = (0..rows).find(|&i| all.iter().all(|h| h.get(8 + i) != Some(&1))) {
        return Err(format!("row {row}: no rank's hook wrote its fp8 and scale"));
    }
    let mine_rows = seen.iter().filter(|&&s| s == 1).count();
    Ok(format!(
        "{rows} rows x {cols} bf16 ({place} buffers, {row_threads} lanes a row): all-reduce + \
         residual + RMSNorm + e4m3, bit for bit (largest code {worst_code:#04x}); this rank's \
         hook wrote {mine_rows} rows, every row on some rank; identical outputs on {world} ranks"
    ))
}

/// The hooked all-reduce with input and output copied into slices of the memory pool (so the
/// call may take a zero-copy path), the result copied back into `output`.
fn all_reduce_in_pool(
    comm: &Comm,
    stream: &Arc<CudaStream>,
    hooks: &Hooks<bf16, bf16>,
    args: &HookArgs,
    input: &CudaSlice<bf16>,
    output: &mut CudaSlice<bf16>,
) -> Result<(), String> {
    let e = |x: devcomm::Error| x.to_string();
    let n = input.len();
    let bytes = n * 2;
    // Collective: every rank's pool is in the same state, so all grow it alike.
    if (comm.pool_usage().largest_free as usize) < 2 * bytes + 512 {
        comm.grow_pool((2 * bytes + 512).max(64 << 20)).map_err(e)?;
    }
    let pin = comm.alloc(bytes as u64).map_err(e)?;
    let pout = comm.alloc(bytes as u64).map_err(e)?;
    {
        let (src, _g) = input.device_ptr(stream);
        let (init, _h) = output.device_ptr(stream);
        // SAFETY: both pool slices and both cudarc buffers hold `bytes`, live until the
        // synchronisation below; the copies and the call are ordered on `stream`.
        unsafe {
            devcomm::testing::memcpy_dtod_async(pin.ptr(), src, bytes, stream).map_err(e)?;
            devcomm::testing::memcpy_dtod_async(pout.ptr(), init, bytes, stream).map_err(e)?;
            comm.all_reduce_hooked_raw(
                hooks.raw(),
                pin.ptr(),
                pout.ptr(),
                n,
                DataType::BF16,
                ReduceOp::Sum,
                args,
                stream,
            )
            .map_err(e)?;
        }
    }
    {
        let (dst, _g) = output.device_ptr_mut(stream);
        // SAFETY: as above; the slices drop only after the synchronisation.
        unsafe { devcomm::testing::memcpy_dtod_async(dst, pout.ptr(), bytes, stream) }
            .map_err(e)?;
    }
    comm.synchronize(stream).map_err(e)
}

#[allow(dead_code)]
fn main() -> Result<(), String> {
    let comm = Comm::from_env().map_err(|e| e.to_string())?;
    let stream = comm.context().new_stream().map_err(|e| e.to_string())?;
    let hook = (RMSNORM_FP8_HOOKS, RMSNORM_FP8_ROW_THREADS);
    for (rows, cols, pooled) in [(257, 4096, false), (257, 4096, true)] {
        let msg = run_rmsnorm_fp8(&comm, &stream, (rows, cols), 7, pooled, hook)?;
        println!("rank {}: {msg}", comm.rank());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use devcomm::moe::fp8::e4m3_to_f32;

    #[test]
    fn the_reference_row_normalises_and_quantises() {
        let x: Vec<bf16> = (0..1000).map(|i| sample(3, 0, i)).collect();
        let res: Vec<bf16> = (0..1000).map(|i| sample(3, 1, i)).collect();
        let w: Vec<bf16> = (0..1000)
            .map(|i| bf16::from_f32(1.0 + sample(3, 2, i).to_f32()))
            .collect();
        let r = reference_row(&x, &res, &w, EPS, RMSNORM_FP8_ROW_THREADS);
        // The normalised row has mean square ~ mean(w^2) and the fp8 codes dequantise near it.
        let amax = r.out.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
        assert_eq!(r.scale, amax / 448.0);
        assert!(r.fp8.iter().any(|&q| q & 0x7f == 0x7e), "amax maps to 448");
        for (q, y) in r.fp8.iter().zip(&r.out) {
            let back = e4m3_to_f32(*q) * r.scale;
            assert!((back - y.to_f32()).abs() <= amax / 16.0, "{back} vs {y}");
        }
        for j in 0..1000 {
            assert_eq!(
                r.residual[j],
                bf16::from_f32(x[j].to_f32() + res[j].to_f32())
            );
        }
        // A row of zeros: scale 1, codes 0.
        let zeros = vec![bf16::ZERO; 40];
        let z = reference_row(&zeros, &zeros, &w[..40], EPS, 512);
        assert_eq!((z.scale, z.fp8.iter().all(|&q| q == 0)), (1.0, true));
    }

    /// The reference as it was when a warp ran every row (32 lanes, warp_sum's butterfly and
    /// amax folded in column order), written out.
    fn one_warp_reference(x: &[bf16], residual: &[bf16], weight: &[bf16], eps: f32) -> RowRef {
        let cols = x.len();
        let h: Vec<bf16> = x
            .iter()
            .zip(residual)
            .map(|(a, b)| bf16::from_f32(a.to_f32() + b.to_f32()))
            .collect();
        let mut lanes = [0f32; 32];
        for (j, v) in h.iter().enumerate() {
            let f = v.to_f32();
            lanes[j % 32] = f.mul_add(f, lanes[j % 32]);
        }
        for o in [16, 8, 4, 2, 1] {
            let before = lanes;
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = before[l] + before[l ^ o];
            }
        }
        let r = 1.0 / (lanes[0] / cols as f32 + eps).sqrt();
        let out: Vec<bf16> = h
            .iter()
            .zip(weight)
            .map(|(v, w)| bf16::from_f32(v.to_f32() * r * w.to_f32()))
            .collect();
        let amax = out.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
        let (scale, inv) = if amax > 0.0 {
            (amax / E4M3_MAX, (E4M3_MAX / amax).min(f32::MAX))
        } else {
            (1.0, 1.0)
        };
        let fp8 = out
            .iter()
            .map(|v| e4m3_from_f32(v.to_f32() * inv))
            .collect();
        RowRef {
            out,
            residual: h,
            fp8,
            scale,
        }
    }

    #[test]
    fn thirty_two_lanes_reproduce_the_one_warp_reference() {
        for (seed, cols) in [(1u64, 7usize), (2, 1000), (3, 4096), (4, 7168)] {
            let x: Vec<bf16> = (0..cols).map(|i| sample(seed, 0, i)).collect();
            let res: Vec<bf16> = (0..cols).map(|i| sample(seed, 1, i)).collect();
            let w: Vec<bf16> = (0..cols)
                .map(|i| bf16::from_f32(1.0 + sample(seed, 2, i).to_f32()))
                .collect();
            let old = one_warp_reference(&x, &res, &w, EPS);
            assert_eq!(reference_row(&x, &res, &w, EPS, 32), old, "{cols} columns");
            for lanes in [64, 128, 256, 512] {
                // Only the sum of squares' order changes (its bits: `devcomm::reduce::rows`'
                // tests): the residual is the same, the outputs the same or a bf16 step apart.
                let r = reference_row(&x, &res, &w, EPS, lanes);
                assert_eq!(r.residual, old.residual);
                for (a, b) in r.out.iter().zip(&old.out) {
                    assert!(
                        a.to_bits().abs_diff(b.to_bits()) <= 1,
                        "{lanes}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
