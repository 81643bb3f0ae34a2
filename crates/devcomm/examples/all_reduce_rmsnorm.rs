//! All-reduce + residual add + RMSNorm in one call: the epilogue hook (`hooks/rmsnorm.cu`)
//! runs on every row of `hidden` elements right after the row is reduced, on the rank that
//! reduces it, before the row is sent to every rank. Each rank reduces whole rows, so the hook
//! sees whole rows. Checked against a host reference (to 1e-5 relative: the hook's sum of
//! squares and `rsqrtf` are not the host's), and the outputs of all ranks bit for bit against
//! each other.
//!
//! On a machine with GPUs: `devcomm launch -n 4 -- target/release/examples/all_reduce_rmsnorm`

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};
use devcomm::{Comm, HookArgs, Hooks, ReduceOp};

/// The user's hook (CUDA C++).
pub const RMSNORM_HOOKS: &str = include_str!("hooks/rmsnorm.cu");

const EPS: f32 = 1e-6;

fn sample(seed: u64, who: u64, i: usize) -> f32 {
    let h = (seed ^ (who << 40) ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5 // [-0.5, 0.5)
}

/// `rows x hidden` f32 on every rank: all-reduce (sum), then per row h = x + residual,
/// residual = h, y = h / sqrt(mean(h^2) + eps) * weight. Returns a summary or what differs.
pub fn run_rmsnorm(
    comm: &Comm,
    stream: &Arc<CudaStream>,
    rows: usize,
    hidden: usize,
    seed: u64,
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
    let hooks = Hooks::<f32, f32>::new("RmsNorm", RMSNORM_HOOKS);
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
    let mut worst = 0f64;
    for row in 0..rows {
        let at = row * hidden;
        let h: Vec<f32> = (0..hidden)
            .map(|j| sum[at + j] + residual[at + j])
            .collect();
        let ms = h.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / hidden as f64;
        let scale = 1.0 / (ms + f64::from(EPS)).sqrt();
        for j in 0..hidden {
            let want = f64::from(h[j]) * scale * f64::from(weight[j]);
            let g = f64::from(got[at + j]);
            let rel = (g - want).abs() / want.abs().max(1e-3);
            worst = worst.max(rel);
            if rel > 1e-5 || !g.is_finite() {
                return Err(format!("row {row} col {j}: {g}, expected {want}"));
            }
        }
    }
    // Every rank holds the same bits.
    let hash = got
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3)
        })
        .to_le_bytes();
    let tag = format!("__devcomm_example/rmsnorm/{seed}/{rows}x{hidden}");
    let all = comm
        .store()
        .all_gather(&tag, &hash, comm.setup_timeout())
        .map_err(|x| x.to_string())?;
    if let Some(r) = all.iter().position(|h| h[..] != hash[..]) {
        return Err(format!("rank {r}'s output differs from rank {rank}'s"));
    }
    Ok(format!(
        "{rows} rows x {hidden}: all-reduce + residual + RMSNorm, worst relative error {worst:.1e}, \
         identical on {world} ranks"
    ))
}

#[allow(dead_code)]
fn main() -> Result<(), String> {
    let comm = Comm::from_env().map_err(|e| e.to_string())?;
    let stream = comm.context().new_stream().map_err(|e| e.to_string())?;
    let msg = run_rmsnorm(&comm, &stream, 257, 4096, 7)?;
    println!("rank {}: {msg}", comm.rank());
    Ok(())
}
