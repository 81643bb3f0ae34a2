//! An all-to-all that quantises f32 to fp8 (e4m3) in `produce` and dequantises in `consume`
//! (`hooks/fp8.cu`): a quarter of the bytes cross NVLink. Each rank picks a scale per
//! destination chunk (its largest magnitude over 448); a plain all-to-all of the scales tells
//! every receiver the scale of what it gets; both reach the hooks through the user arguments.
//! The result is checked bit for bit against a host model of the e4m3 rounding.
//!
//! On a machine with GPUs: `devcomm launch -n 4 -- target/release/examples/fp8_all_to_all`

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};
use devcomm::{Comm, HookArgs, Hooks};

/// The user's hooks (CUDA C++).
pub const FP8_HOOKS: &str = include_str!("hooks/fp8.cu");

fn sample(seed: u64, src: usize, dst: usize, i: usize) -> f32 {
    let h = (seed ^ ((src as u64) << 40) ^ ((dst as u64) << 32) ^ i as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let unit = (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5; // [-0.5, 0.5)
    unit * (1 + dst + 3 * src) as f32
}

/// Host model of the hooks: x / s rounded to e4m3 (nearest, ties to even, saturating at
/// 448), widened and multiplied back by s: the same f32 operations as the device.
pub fn fp8_round_trip(x: f32, scale: f32) -> f32 {
    let v = x * (1.0f32 / scale);
    let a = v.abs().min(448.0);
    let quantum = if a < 2f32.powi(-6) {
        2f32.powi(-9)
    } else {
        2f32.powi(a.log2().floor() as i32 - 3)
    };
    let q = (a / quantum).round_ties_even() * quantum;
    let q = q.min(448.0).copysign(v);
    q * scale
}

/// One fp8 all-to-all of `n` f32 per peer, checked on the host.
pub fn run_fp8(
    comm: &Comm,
    stream: &Arc<CudaStream>,
    n: usize,
    seed: u64,
) -> Result<String, String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let e = |x: devcomm::Error| x.to_string();
    let c = |x: cudarc::driver::DriverError| x.to_string();
    let data: Vec<f32> = (0..world * n)
        .map(|k| sample(seed, rank, k / n, k % n))
        .collect();
    let scales: Vec<f32> = (0..world)
        .map(|p| {
            data[p * n..(p + 1) * n]
                .iter()
                .fold(0f32, |m, x| m.max(x.abs()))
                .max(1e-30)
                / 448.0
        })
        .collect();
    let send = stream.clone_htod(&data).map_err(c)?;
    let mut recv = stream.clone_htod(&vec![f32::NAN; world * n]).map_err(c)?;
    let send_scale = stream.clone_htod(&scales).map_err(c)?;
    let mut recv_scale = stream.alloc_zeros::<f32>(world).map_err(c)?;
    // Every receiver learns the scale its senders used.
    comm.all_to_all(&send_scale, &mut recv_scale, stream)
        .map_err(e)?;
    let args = {
        let (s, _a) = send_scale.device_ptr(stream);
        let (r, _b) = recv_scale.device_ptr(stream);
        stream.clone_htod(&[s, r]).map_err(c)?
    };
    let user = args.device_ptr(stream).0;
    let hooks = Hooks::<f32, f32>::new("Fp8", FP8_HOOKS);
    comm.all_to_all_hooked(
        &hooks,
        &send,
        &mut recv,
        HookArgs::default().with_user(user),
        stream,
    )
    .map_err(e)?;
    comm.synchronize(stream).map_err(e)?;
    let got = stream.clone_dtoh(&recv).map_err(c)?;
    // Worst error relative to the chunk's largest magnitude (e4m3 keeps 3 mantissa bits).
    let mut worst = 0f32;
    for src in 0..world {
        let chunk: Vec<f32> = (0..world * n)
            .map(|k| sample(seed, src, k / n, k % n))
            .collect();
        let mine = &chunk[rank * n..(rank + 1) * n];
        let s = mine.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30) / 448.0;
        for (i, &x) in mine.iter().enumerate() {
            let (g, want) = (got[src * n + i], fp8_round_trip(x, s));
            if g.to_bits() != want.to_bits() {
                return Err(format!(
                    "from rank {src}: element {i} ({x}) is {g}, expected {want}"
                ));
            }
            worst = worst.max((g - x).abs() / (s * 448.0));
        }
    }
    Ok(format!(
        "{n} f32 per peer as e4m3 on the wire, matches the host model; worst error {worst:.4} of the chunk's largest magnitude"
    ))
}

#[allow(dead_code)]
fn main() -> Result<(), String> {
    let comm = Comm::from_env().map_err(|e| e.to_string())?;
    let stream = comm.context().new_stream().map_err(|e| e.to_string())?;
    let msg = run_fp8(&comm, &stream, 100_003, 11)?;
    println!("rank {}: {msg}", comm.rank());
    Ok(())
}
