//! All-reduce + residual add + RMSNorm in one call: the epilogue hook (`hooks/rmsnorm.cu`)
//! runs on every row of `hidden` elements right after the row is reduced, on the rank that
//! reduces it, before the row is sent to every rank. Each rank reduces whole rows, so the hook
//! sees whole rows. Checked BIT FOR BIT against a host reference (`reference_row`: the hook
//! uses only correctly rounded operations and a sum of squares of a fixed shape, its
//! `kRowThreads` lanes and `row_sum`'s order, which the host replays), and the outputs of all
//! ranks against each other.
//!
//! On a machine with GPUs: `devcomm launch -n 4 -- target/release/examples/all_reduce_rmsnorm`

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};
use devcomm::reduce::rows::{lane_folds, row_sum};
use devcomm::{Comm, HookArgs, Hooks, ReduceOp};

/// The user's hook (CUDA C++).
pub const RMSNORM_HOOKS: &str = include_str!("hooks/rmsnorm.cu");

/// The hook's row group (its `kRowThreads`).
pub const RMSNORM_ROW_THREADS: u32 = 128;

const EPS: f32 = 1e-6;

/// The hook's steps on one reduced row `x` with `lanes` threads a row, in the hook's order and
/// roundings: h = x + residual; the sum of squares as lane l (columns l, l + lanes, ..., with
/// fma) and `row_sum` make it; scale = 1 / sqrt(ss / cols + eps); y = (h x scale) x weight.
pub fn reference_row(
    x: &[f32],
    residual: &[f32],
    weight: &[f32],
    eps: f32,
    lanes: u32,
) -> Vec<f32> {
    let h: Vec<f32> = x.iter().zip(residual).map(|(a, b)| a + b).collect();
    let ss = row_sum(&lane_folds(&h, lanes as usize, 0.0, |acc, v| {
        v.mul_add(v, acc)
    }));
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    h.iter().zip(weight).map(|(v, w)| v * scale * w).collect()
}

fn sample(seed: u64, who: u64, i: usize) -> f32 {
    let h = (seed ^ (who << 40) ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5 // [-0.5, 0.5)
}

/// `rows x hidden` f32 on every rank: all-reduce (sum), then per row h = x + residual,
/// y = h / sqrt(mean(h^2) + eps) * weight, with the hook `source` whose rows run on
/// `row_threads` lanes (`RMSNORM_HOOKS`, `RMSNORM_ROW_THREADS`: the example's). Returns a
/// summary or what differs.
pub fn run_rmsnorm(
    comm: &Comm,
    stream: &Arc<CudaStream>,
    (rows, hidden): (usize, usize),
    seed: u64,
    (source, row_threads): (&str, u32),
) -> Result<String, String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let e = |x: devcomm::Error| x.to_string();
    let c = |x: cudarc::driver::DriverError| x.to_string();
    let n = rows * hidden;
    let input_of = |r: usize| -> Vec<f32> { (0..n).map(|i| sample(seed, r as u64, i)).collect() };
    let residual: Vec<f32> = (0..n).map(|i| sample(seed, 1000, i)).collect();
    let weight: Vec<f32> = (0..hidden).map(|i| 1.0 + sample(seed, 1001, i)).collect();
    let input = stream.clone_htod(&input_of(rank)).map_err(c)?;
    let mut output = stream.clone_htod(&vec![f32::NAN; n]).map_err(c)?;
    let res_dev = stream.clone_htod(&residual).map_err(c)?;
    let w_dev = stream.clone_htod(&weight).map_err(c)?;
    // struct RmsNormArgs { const float* residual; const float* weight; float eps; }
    let args = {
        let (r, _a) = res_dev.device_ptr(stream);
        let (w, _b) = w_dev.device_ptr(stream);
        stream
            .clone_htod(&[r, w, u64::from(EPS.to_bits())])
            .map_err(c)?
    };
    let hooks = Hooks::<f32, f32>::new("RmsNorm", source);
    let hook_args = HookArgs::rows(hidden).with_user(args.device_ptr(stream).0);
    comm.all_reduce_hooked(
        &hooks,
        &input,
        &mut output,
        ReduceOp::Sum,
        &hook_args,
        stream,
    )
    .map_err(e)?;
    comm.synchronize(stream).map_err(e)?;
    let got = stream.clone_dtoh(&output).map_err(c)?;
    // Host reference: the sum in rank order, then the row's epilogue.
    let mut sum = input_of(0);
    for r in 1..world {
        for (s, x) in sum.iter_mut().zip(input_of(r)) {
            *s += x;
        }
    }
    for row in 0..rows {
        let span = row * hidden..(row + 1) * hidden;
        let want = reference_row(
            &sum[span.clone()],
            &residual[span.clone()],
            &weight,
            EPS,
            row_threads,
        );
        if let Some(j) = (0..hidden).find(|&j| got[span.start + j].to_bits() != want[j].to_bits()) {
            return Err(format!(
                "rank {rank}: row {row} col {j}: {:e}, expected {:e} ({row_threads} lanes a row)",
                got[span.start + j],
                want[j]
            ));
        }
    }
    // Every rank holds the same bits.
    let hash = got
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3)
        })
        .to_le_bytes();
    let tag = format!("__devcomm_example/rmsnorm/{seed}/{rows}x{hidden}/{row_threads}");
    let all = comm
        .store()
        .all_gather(&tag, &hash, comm.setup_timeout())
        .map_err(|x| x.to_string())?;
    if let Some(r) = all.iter().position(|h| h[..] != hash[..]) {
        return Err(format!("rank {r}'s output differs from rank {rank}'s"));
    }
    Ok(format!(
        "{rows} rows x {hidden}: all-reduce + residual + RMSNorm on {row_threads} lanes a row, bit \
         for bit, identical on {world} ranks"
    ))
}

#[allow(dead_code)]
fn main() -> Result<(), String> {
    let comm = Comm::from_env().map_err(|e| e.to_string())?;
    let stream = comm.context().new_stream().map_err(|e| e.to_string())?;
    let hook = (RMSNORM_HOOKS, RMSNORM_ROW_THREADS);
    let msg = run_rmsnorm(&comm, &stream, (257, 4096), 7, hook)?;
    println!("rank {}: {msg}", comm.rank());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference against f64 arithmetic (1e-5 relative), at every width; with 32 lanes the
    /// one warp's sum of squares.
    #[test]
    fn the_reference_row_normalises() {
        let x: Vec<f32> = (0..1000).map(|i| sample(3, 0, i)).collect();
        let res: Vec<f32> = (0..1000).map(|i| sample(3, 1, i)).collect();
        let w: Vec<f32> = (0..1000).map(|i| 1.0 + sample(3, 2, i)).collect();
        let h: Vec<f64> = x.iter().zip(&res).map(|(a, b)| f64::from(a + b)).collect();
        let ms = h.iter().map(|v| v * v).sum::<f64>() / 1000.0;
        let scale = 1.0 / (ms + f64::from(EPS)).sqrt();
        for lanes in devcomm::reduce::rows::ROW_THREADS {
            let y = reference_row(&x, &res, &w, EPS, lanes);
            for j in 0..1000 {
                let want = h[j] * scale * f64::from(w[j]);
                let rel = (f64::from(y[j]) - want).abs() / want.abs().max(1e-3);
                assert!(
                    rel <= 1e-5,
                    "{lanes} lanes, col {j}: {} against {want}",
                    y[j]
                );
            }
        }
    }
}
