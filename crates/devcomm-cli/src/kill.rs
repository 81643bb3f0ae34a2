//! `devcomm kill-test`: a rank dies in the middle of a loop of collectives (all-to-alls, or
//! all-reduces with `--op all_reduce`); every other rank
//! must get an error within the device timeout plus 2 s and be able to exit within 10 s (its
//! communicator's tear-down skips the barriers with the dead peer). Run it under the launcher,
//! e.g. `scripts/shared-gpu.sh 4 dist/devcomm kill-test`. The victim ends its process at once
//! (`--how exit`: `_exit(0)`-like, so the launcher lets the others finish; `--how abort`: a
//! crash, which the launcher reports as a failed rank and answers by stopping the others
//! after its grace period). Each survivor prints one line `kill-test: rank R: PASS ...` or
//! `... FAIL ...` and exits 0 or 1.
//!
//! With network peers (`DEVCOMM_TOPOLOGY_OVERRIDE='0-*=net,1-*=net'` on 2 ranks) the
//! all-to-alls' network roles go through the proxy (docs/NETWORK.md), and a survivor passes
//! only if its error names the victim: the network proxy learns of the dead peer from UCX (its
//! endpoints to the victim fail) and aborts the communicator with an error naming it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use devcomm::{Comm, DataType, ReduceOp};

/// Arguments of `devcomm kill-test`.
#[derive(Debug, clap::Args)]
pub struct KillArgs {
    /// The rank that dies (default: the last).
    #[arg(long)]
    victim: Option<usize>,
    /// Correct calls before the victim dies.
    #[arg(long, default_value_t = 200)]
    calls: usize,
    /// How the victim ends: `exit` (no tear-down, exit status 0) or `abort` (a crash).
    #[arg(long, default_value = "exit")]
    how: String,
    /// Device timeout of the communicator, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    timeout_ms: u64,
    /// The collective of the loop: `all_to_all` or `all_reduce` (f32 sum of the same bytes).
    #[arg(long, default_value = "all_to_all")]
    op: String,
}

/// Bytes per peer of the loop's all-to-alls.
const BYTES_PER_PEER: usize = 64 << 10;
/// Slack on top of the device timeout for the error, and the bound of the exit.
const SLACK: Duration = Duration::from_secs(2);
const EXIT_BOUND: Duration = Duration::from_secs(10);

pub fn run(args: &KillArgs) -> Result<i32, String> {
    if args.how != "exit" && args.how != "abort" {
        return Err(format!("--how {:?}: expected `exit` or `abort`", args.how));
    }
    let reduce = match args.op.as_str() {
        "all_to_all" => false,
        "all_reduce" => true,
        other => {
            return Err(format!(
                "--op {other:?}: expected `all_to_all` or `all_reduce`"
            ))
        }
    };
    let timeout = Duration::from_millis(args.timeout_ms);
    let info = devcomm_bootstrap::RankInfo::from_env().map_err(|e| e.to_string())?;
    let comm = Comm::builder(info)
        .and_then(|b| b.device_timeout(timeout).build())
        .map_err(|e| e.to_string())?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let victim = args.victim.unwrap_or(world - 1);
    if world < 2 || victim >= world {
        return Err(format!("needs 2 or more ranks and a victim below {world}"));
    }
    let stream = comm.context().new_stream().map_err(|e| e.to_string())?;
    let elems = BYTES_PER_PEER / 8 * world;
    let src: CudaSlice<u64> = stream
        .clone_htod(&vec![rank as u64; elems])
        .map_err(|e| e.to_string())?;
    let mut dst = stream
        .alloc_zeros::<u64>(elems)
        .map_err(|e| e.to_string())?;
    let network = comm.tuning().has_network_peers();
    let step = |dst: &mut CudaSlice<u64>| collective(&comm, &stream, &src, dst, reduce);
    for call in 0..args.calls {
        step(&mut dst).map_err(|e| format!("call {call}: {e}"))?;
    }
    if rank == victim {
        eprintln!(
            "kill-test: rank {rank}: dying after {} calls ({})",
            args.calls, args.how
        );
        if args.how == "abort" {
            std::process::abort();
        }
        std::process::exit(0);
    }
    let t = Instant::now();
    let mut failed_at = None;
    let mut error = String::new();
    for call in 0..1_000 {
        if let Err(e) = step(&mut dst) {
            failed_at = Some((call, t.elapsed()));
            error = e;
            break;
        }
    }
    let dropping = Instant::now();
    drop(dst);
    drop(src);
    drop(comm);
    let dropped = dropping.elapsed();
    let verdict = match failed_at {
        None => Err("no error in 1,000 calls after the victim died".to_owned()),
        Some((_, waited)) if waited > timeout + SLACK => Err(format!(
            "the error came after {:.2} s (device timeout {:.2} s + 2 s)",
            waited.as_secs_f64(),
            timeout.as_secs_f64()
        )),
        Some(_) if network && !error.contains(&format!("peer {victim}")) => Err(format!(
            "the error does not name the dead peer {victim} (network route)"
        )),
        Some(_) if dropped > EXIT_BOUND => Err(format!(
            "dropping the communicator took {:.2} s",
            dropped.as_secs_f64()
        )),
        Some((call, waited)) => Ok(format!(
            "error at call {call}, {:.2} s after the victim's death, naming: {error}; \
             communicator dropped in {:.2} s",
            waited.as_secs_f64(),
            dropped.as_secs_f64()
        )),
    };
    match verdict {
        Ok(msg) => {
            println!("kill-test: rank {rank}: PASS {msg}");
            Ok(0)
        }
        Err(msg) => {
            println!("kill-test: rank {rank}: FAIL {msg} (error: {error})");
            Ok(1)
        }
    }
}

/// One call of the loop and its synchronisation: an all-to-all of `src` into `dst`, or an f32
/// sum all-reduce of their bytes.
fn collective(
    comm: &Comm,
    stream: &Arc<CudaStream>,
    src: &CudaSlice<u64>,
    dst: &mut CudaSlice<u64>,
    reduce: bool,
) -> Result<(), String> {
    let call = if reduce {
        let n = src.len() * 2;
        let (i, _s) = src.device_ptr(stream);
        let (o, _d) = dst.device_ptr_mut(stream);
        // SAFETY: both slices hold `n` f32 (2 per u64) on `stream`, alive until the
        // synchronise below; they do not overlap.
        unsafe { comm.all_reduce_raw(i, o, n, DataType::F32, ReduceOp::Sum, stream) }
    } else {
        comm.all_to_all(src, dst, stream)
    };
    call.and_then(|()| comm.synchronize(stream))
        .map_err(|e| e.to_string())
}
