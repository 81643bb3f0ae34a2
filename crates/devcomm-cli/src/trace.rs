//! `devcomm trace`: runs one operation a few times with tracing on, on every local GPU (the
//! command launches itself like `devcomm bench`), gathers every rank's events at rank 0,
//! writes one Chrome / Perfetto trace and prints the per-operation summary (docs/TRACING.md).

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use devcomm::{Comm, Config, ReduceOp};
use devcomm_bootstrap::RankInfo;

/// Arguments of `devcomm trace`.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// The operation: all_reduce, sendrecv (a ring: to rank + 1, from rank - 1) or all_to_all.
    #[arg(long, default_value = "all_reduce")]
    pub op: String,
    /// Bytes per rank (all-reduce: the f32 input; send/recv: the message; all-to-all: the
    /// whole send buffer, rounded down to equal chunks).
    #[arg(long, default_value_t = 1 << 20)]
    pub bytes: u64,
    /// Traced calls.
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Untraced calls before them (compiles and warms the kernels; their events are dropped).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// The trace file rank 0 writes.
    #[arg(long, default_value = "devcomm-trace.json")]
    pub out: PathBuf,
    /// Events per rank's ring (DEVCOMM_TRACE_EVENTS).
    #[arg(long)]
    pub events: Option<u32>,
    /// The link's bandwidth in GB/s, to print the achieved share of it.
    #[arg(long)]
    pub link_gbps: Option<f64>,
}

/// The operations `devcomm trace` runs.
pub(crate) const OPS: &[&str] = &["all_reduce", "sendrecv", "all_to_all"];

/// `devcomm trace`: checks the arguments, then runs on every rank.
pub fn command(args: &TraceArgs) -> Result<i32, String> {
    if !OPS.contains(&args.op.as_str()) {
        return Err(format!("unknown --op {:?}; one of {OPS:?}", args.op));
    }
    if args.iters == 0 || args.bytes == 0 {
        return Err(format!(
            "--iters {} and --bytes {} must both be at least 1",
            args.iters, args.bytes
        ));
    }
    crate::autolaunch::or_run("trace", || run(args))
}

fn run(args: &TraceArgs) -> Result<i32, String> {
    let err = |e: devcomm::Error| e.to_string();
    let mut config = Config::from_env().map_err(err)?;
    config.trace = true;
    if let Some(n) = args.events {
        config.trace_events = n;
    }
    let info = RankInfo::from_env().map_err(|e| e.to_string())?;
    let comm = Comm::builder(info)
        .and_then(|b| b.config(config).build())
        .map_err(err)?;
    let stream = comm.context().new_stream().map_err(|e| e.to_string())?;
    let world = comm.world_size();
    if world < 2 && args.op != "all_reduce" {
        return Err(format!(
            "--op {} needs at least 2 ranks, not {world}",
            args.op
        ));
    }
    run_calls(&comm, &stream, &args.op, args.bytes, args.warmup)?;
    // The warm-up's events (and its compile) stay out of the trace.
    comm.trace_events().map_err(err)?;
    comm.store()
        .barrier("__devcomm_cli/trace/start", comm.setup_timeout())
        .map_err(|e| e.to_string())?;
    run_calls(&comm, &stream, &args.op, args.bytes, args.iters)?;
    let summary = comm.write_trace(&args.out, args.link_gbps).map_err(err)?;
    if let Some(text) = summary {
        println!(
            "devcomm trace: {} x {} of {} bytes on {world} ranks -> {}",
            args.iters,
            args.op,
            args.bytes,
            args.out.display()
        );
        print!("{text}");
    }
    Ok(0)
}

/// Runs `iters` calls of `op` with `bytes` per rank on `stream` (see [`TraceArgs`]) and
/// synchronises.
pub(crate) fn run_calls(
    comm: &Comm,
    stream: &Arc<CudaStream>,
    op: &str,
    bytes: u64,
    iters: usize,
) -> Result<(), String> {
    let c = |e: cudarc::driver::DriverError| e.to_string();
    let d = |e: devcomm::Error| format!("{op}: {e}");
    let (rank, world) = (comm.rank(), comm.world_size());
    match op {
        "all_reduce" => {
            let n = (bytes as usize / 4).max(1);
            let input = stream.clone_htod(&vec![1.0f32; n]).map_err(c)?;
            let mut output = stream.alloc_zeros::<f32>(n).map_err(c)?;
            for _ in 0..iters {
                comm.all_reduce(&input, &mut output, ReduceOp::Sum, stream)
                    .map_err(d)?;
            }
        }
        "sendrecv" => {
            let n = bytes as usize;
            let send = stream.clone_htod(&vec![rank as u8; n]).map_err(c)?;
            let mut recv = stream.alloc_zeros::<u8>(n).map_err(c)?;
            for _ in 0..iters {
                comm.sendrecv(
                    &send,
                    (rank + 1) % world,
                    &mut recv,
                    (rank + world - 1) % world,
                    stream,
                )
                .map_err(d)?;
            }
        }
        "all_to_all" => {
            let chunk = (bytes as usize / world).max(1);
            let send = stream
                .clone_htod(&vec![rank as u8; chunk * world])
                .map_err(c)?;
            let mut recv = stream.alloc_zeros::<u8>(chunk * world).map_err(c)?;
            for _ in 0..iters {
                comm.all_to_all(&send, &mut recv, stream).map_err(d)?;
            }
        }
        other => return Err(format!("unknown operation {other:?}; one of {OPS:?}")),
    }
    comm.synchronize(stream).map_err(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(op: &str, bytes: u64, iters: usize) -> TraceArgs {
        TraceArgs {
            op: op.into(),
            bytes,
            iters,
            warmup: 0,
            out: "unused.json".into(),
            events: None,
            link_gbps: None,
        }
    }

    /// Bad arguments fail before any rank starts (no GPU, no launcher needed).
    #[test]
    fn bad_arguments_are_refused_by_name() {
        let e = command(&args("all_gather", 1, 1)).unwrap_err();
        assert!(
            e.contains("\"all_gather\"") && e.contains("sendrecv"),
            "{e}"
        );
        let e = command(&args("sendrecv", 0, 1)).unwrap_err();
        assert!(e.contains("--bytes 0"), "{e}");
        let e = command(&args("all_to_all", 8, 0)).unwrap_err();
        assert!(e.contains("--iters 0"), "{e}");
    }
}
