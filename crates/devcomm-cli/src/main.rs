//! `devcomm`: launch ranks, inspect the GPUs, run the GPU self-test, benchmark against NCCL.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod autolaunch;
mod bench;
mod examples;
mod foundation_kernels;
mod info;
mod kill;
mod precompile;
mod selftest;
mod trace;

/// Device-initiated GPU communication: launcher, self-test and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "devcomm", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start N ranks of a command on this host (sets RANK, WORLD_SIZE, LOCAL_RANK,
    /// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); stops all when one fails.
    Launch {
        /// Number of ranks.
        #[arg(short = 'n', long = "nprocs")]
        nprocs: usize,
        /// Store address.
        #[arg(long, default_value = "127.0.0.1")]
        master_addr: String,
        /// Store port (default: a free port).
        #[arg(long)]
        master_port: Option<u16>,
        /// Seconds between SIGTERM and SIGKILL when stopping ranks.
        #[arg(long, default_value_t = 5)]
        kill_grace: u64,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
    /// Per rank: the GPU, its PCI id and the link kind to every peer. Without the launcher's
    /// variables, launches itself on every local GPU.
    Info(info::InfoArgs),
    /// Checks every device operation and collective on the GPUs; prints a table of pass, fail
    /// and skip.
    #[command(after_help = selftest::checks_help())]
    Selftest(selftest::SelftestArgs),
    /// Times devcomm against NCCL in the same processes on the same buffers.
    Bench(bench::BenchArgs),
    /// Sweeps send/recv configurations (or with --op all_reduce,... the reductions' algorithms
    /// and blocks) on the local GPUs, checked byte for byte, NCCL timed alongside, and writes a
    /// tuning table for DEVCOMM_TUNE_FILE (DEVCOMM_REDUCE_TUNE_FILE).
    Tune(bench::tune::TuneArgs),
    /// A rank dies in a loop of collectives: the others must fail within the device timeout
    /// plus 2 s and exit within 10 s (run under the launcher; prints PASS or FAIL per rank).
    KillTest(kill::KillArgs),
    /// Compiles the kernels for a GPU architecture into the kernel cache, without a GPU (for
    /// machines or images that should start warm).
    Precompile(precompile::PrecompileArgs),
    /// Runs one operation with tracing on, on every local GPU; writes one Chrome / Perfetto
    /// trace of every rank's host calls and GPU blocks and prints a summary per operation.
    Trace(trace::TraceArgs),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result: Result<i32, String> = match cli.command {
        Command::Launch {
            nprocs,
            master_addr,
            master_port,
            kill_grace,
            command,
        } => {
            let opts = devcomm_bootstrap::launcher::LaunchOptions {
                nprocs,
                master_addr,
                master_port,
                command,
                env: Vec::new(),
                kill_grace: Duration::from_secs(kill_grace),
            };
            devcomm_bootstrap::launcher::launch(opts).map_err(|e| e.to_string())
        }
        Command::Info(args) => autolaunch::or_run("info", || info::run(&args)),
        Command::Selftest(args) => selftest::check_args(&args)
            .and_then(|()| autolaunch::or_run("selftest", || selftest::run(&args))),
        Command::Bench(args) => bench::command(&args),
        Command::Tune(args) => bench::tune::check_args(&args)
            .and_then(|()| autolaunch::or_run("tune", || bench::tune::run(&args))),
        Command::Precompile(args) => precompile::run(&args),
        Command::Trace(args) => trace::command(&args),
        Command::KillTest(args) => autolaunch::or_run("kill-test", || kill::run(&args)),
    };
    match result {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("devcomm: {e}");
            ExitCode::FAILURE
        }
    }
}
