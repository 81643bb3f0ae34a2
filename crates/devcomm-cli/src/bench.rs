//! `devcomm bench`: times devcomm against NCCL (or the copy engine) in the same processes on
//! the same buffers: CUDA events, warm-up, median of many. Prints a table (rank 0) and writes
//! JSON records and an SVG plot.
//!
//! One file per benchmark; the shared parts are [`args`] (the command line), [`timing`] (the
//! harness: events, candidates in turn, medians) and [`record`] (the records and their output).

mod alltoall;
mod args;
mod ce;
mod latency;
mod launch;
mod moe;
pub(crate) mod nccl;
mod plot;
mod put;
mod record;
mod reduce;
mod sendrecv;
pub(crate) mod sendrecv_net;
mod timing;
pub(crate) mod tune;

pub use args::BenchArgs;
pub(crate) use record::today;
pub use record::Record;
pub(crate) use timing::{
    calls_per_sample, in_turn, min_free_bytes, slowest_medians, time_pair, time_ranks_each,
    time_us, time_wall_each, EventTimer,
};

use crate::selftest::Ctx;

/// Every `--op`, with what it times (`--op help` prints this).
const OPS: &[(&str, &str)] = &[
    (
        "moe",
        "MoE dispatch + combine (hidden 7168 bf16, top-8 of 256 experts, 128-8192 tokens per \
         rank) against NCCL's count exchange + grouped send/recv of a row per (token, expert)",
    ),
    (
        "sendrecv",
        "devcomm send/recv against NCCL send/recv between ranks 0 and 1 (--both-directions, \
         --sweep, --zero-copy, --graph, --blocks, --reference none); with a network peer \
         (links forced) it times the network route and labels every record as loopback",
    ),
    (
        "latency",
        "signal ping-pong between ranks 0 and 1 inside one kernel",
    ),
    (
        "launch",
        "host against GPU time per call of back-to-back small calls, devcomm's and NCCL's",
    ),
    (
        "put",
        "one GPU pushing into a peer's window by stores and TMA, against the copy engine and \
         NCCL",
    ),
    (
        "ce",
        "a message moved by the copy engine in chunks, on one or several streams, against one \
         whole copy",
    ),
    (
        "all_to_all",
        "every rank, equal chunks, against NCCL grouped send/recv (--zero-copy, --hooks, \
         --reference none); with network links (forced) every record says it times loopback",
    ),
    (
        "all_to_all_v",
        "MoE token dispatch with counts on the GPU, against NCCL's count exchange, host sync \
         and grouped send/recv",
    ),
    (
        "all_reduce",
        "devcomm all-reduce against NCCL, on the same buffers and on NCCL window buffers \
         (--dtype, --redop, --reference)",
    ),
    (
        "reduce_scatter",
        "devcomm reduce-scatter against NCCL, as all_reduce",
    ),
    (
        "all_gather",
        "devcomm all-gather against NCCL, as all_reduce",
    ),
];

/// The list `--op help` prints, and an unknown `--op` names.
fn ops_help() -> String {
    OPS.iter()
        .map(|(name, what)| format!("  {name:<15} {what}\n"))
        .collect()
}

/// Why benchmarks and the tuner refuse ranks that share a GPU.
fn shared_gpu_reason() -> String {
    format!(
        "{} is for functional tests (NCCL refuses ranks that share a GPU, and the timings \
         would say nothing of NVLink); only `devcomm bench --op \
         all_reduce|reduce_scatter|all_gather --reference none` runs there, as a smoke test",
        devcomm::topology::SHARE_GPU_ENV
    )
}

/// The tuner times devcomm against NCCL over NVLink: ranks that share a GPU
/// ([`devcomm::topology::SHARE_GPU_ENV`]) are refused before anything starts.
pub(crate) fn refuse_shared_gpu(what: &str) -> Result<(), String> {
    if sharing_gpu()? {
        return Err(format!(
            "{what} need one GPU per rank: {}",
            shared_gpu_reason()
        ));
    }
    Ok(())
}

/// Whether `bench --op op` may run with its `--reference` when the ranks share a GPU
/// (`shared`): `Ok(true)` where the timings mean something (a GPU per rank), `Ok(false)` for
/// the one smoke test allowed on a shared GPU (a reduction timed alone, `--reference none`),
/// and an error that says why otherwise.
pub(crate) fn shared_gpu_rule(shared: bool, op: &str, reference: &str) -> Result<bool, String> {
    if !shared {
        return Ok(true);
    }
    let env = devcomm::topology::SHARE_GPU_ENV;
    if op == "sendrecv" || op == "all_to_all" {
        // NCCL refuses the shared GPU; devcomm alone is a smoke test (of the network route,
        // say, with links forced), its timings marked meaningless.
        return match sendrecv_net::wants_nccl(reference)? {
            false => Ok(false),
            true => Err(format!(
                "bench --op {op} --reference {reference}: NCCL refuses ranks that share a \
                 GPU ({env}=1); `--reference none` times devcomm alone as a smoke test (its \
                 timings are marked meaningless)"
            )),
        };
    }
    if reduce::Coll::parse(op).is_some() {
        return match reduce::Reference::parse(reference)? {
            reduce::Reference::None => Ok(false),
            _ => Err(format!(
                "bench --op {op} --reference {reference}: NCCL refuses ranks that share a GPU \
                 ({env}=1); `--reference none` times devcomm alone as a smoke test (its \
                 timings are marked meaningless)"
            )),
        };
    }
    Err(format!(
        "bench --op {op} needs one GPU per rank: {}",
        shared_gpu_reason()
    ))
}

/// `devcomm bench`: `--op help` lists the benchmarks; anything else runs on every rank (the
/// command launches itself on the local GPUs when started without the launcher).
pub fn command(args: &BenchArgs) -> Result<i32, String> {
    if args.op == "help" {
        print!("devcomm bench --op OP, one of:\n{}", ops_help());
        return Ok(0);
    }
    crate::autolaunch::or_run("bench", || run(args))
}

/// Whether the settings let ranks share a GPU (`DEVCOMM_SHARE_GPU`, functional tests only).
pub(crate) fn sharing_gpu() -> Result<bool, String> {
    Ok(devcomm::Config::from_env()
        .map_err(|e| e.to_string())?
        .share_gpu)
}

/// Runs the chosen benchmark on every rank; rank 0 prints and writes the results.
fn run(args: &BenchArgs) -> Result<i32, String> {
    let meaningful = shared_gpu_rule(sharing_gpu()?, &args.op, &args.reference)?;
    if reduce::Coll::parse(&args.op).is_some() {
        // A misspelt type or operator fails here, before any rank starts.
        reduce::check_args(args)?;
    }
    let cx = Ctx::new()?;
    if cx.comm.world_size() < 2 {
        return Err("benchmarks need at least 2 ranks".into());
    }
    if !args.event_tracking {
        // SAFETY: every buffer the benchmark makes from here on is allocated, used and freed
        // on `cx.stream` alone (devcomm's own streams join back into it within each call),
        // so stream order is all the synchronisation they need.
        unsafe { cx.comm.context().disable_event_tracking() };
    }
    let mut records = match args.op.as_str() {
        "latency" => latency::run(&cx, args)?,
        "launch" => launch::run(&cx, args)?,
        "put" => put::run(&cx, args)?,
        "ce" => ce::run(&cx, args)?,
        "sendrecv" if args.graph => sendrecv::run_graph(&cx, args)?,
        "sendrecv" => sendrecv::run(&cx, args, args.both_directions)?,
        "all_to_all" => alltoall::run(&cx, args)?,
        "all_to_all_v" => alltoall::run_v(&cx, args)?,
        "moe" => moe::run(&cx, args)?,
        op => match reduce::Coll::parse(op) {
            Some(coll) => reduce::run(&cx, args, coll)?,
            None => return Err(format!("unknown --op {op:?}; one of:\n{}", ops_help())),
        },
    };
    for r in &mut records {
        r.meaningful &= meaningful;
    }
    if cx.comm.rank() == 0 {
        record::emit(&records, args)?;
    }
    cx.host_barrier()?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_is_listed_once() {
        let help = ops_help();
        for (name, _) in OPS {
            assert_eq!(help.matches(&format!("  {name} ")).count(), 1, "{name}");
        }
        for op in ["all_reduce", "reduce_scatter", "all_gather", "sendrecv"] {
            assert!(OPS.iter().any(|(n, _)| *n == op), "{op}");
        }
    }

    #[test]
    fn a_gpu_per_rank_runs_everything() {
        for op in ["sendrecv", "all_to_all", "all_reduce"] {
            for reference in ["all", "nccl", "none"] {
                assert_eq!(shared_gpu_rule(false, op, reference), Ok(true));
            }
        }
    }

    #[test]
    fn a_shared_gpu_runs_only_reductions_sendrecv_and_all_to_all_alone_and_marks_them() {
        for op in ["all_reduce", "reduce_scatter", "all_gather"] {
            assert_eq!(shared_gpu_rule(true, op, "none"), Ok(false));
            for reference in ["all", "nccl", "nccl-window"] {
                let e = shared_gpu_rule(true, op, reference).unwrap_err();
                assert!(e.contains("--reference none"), "{e}");
                assert!(e.contains(devcomm::topology::SHARE_GPU_ENV), "{e}");
            }
            // A misspelt reference is an error of its own, not a run.
            assert!(shared_gpu_rule(true, op, "nvidia").is_err());
        }
        // Send/recv and all-to-all alone are the other smoke tests (the network route with
        // forced links).
        for op in ["sendrecv", "all_to_all"] {
            assert_eq!(shared_gpu_rule(true, op, "none"), Ok(false));
            let e = shared_gpu_rule(true, op, "nccl").unwrap_err();
            assert!(e.contains("--reference none") && e.contains(op), "{e}");
        }
        for op in ["all_to_all_v", "launch"] {
            let e = shared_gpu_rule(true, op, "none").unwrap_err();
            assert!(e.contains("needs one GPU per rank"), "{e}");
            assert!(e.contains("--reference none"), "{e}");
        }
    }
}
