//! `devcomm tune`: sweeps every send/recv configuration candidate on the local GPUs, one way
//! and both ways, checks each result byte for byte, times NCCL in the same processes, and
//! writes a tuning table (`devcomm::p2p::TuneTable`) that a communicator loads through
//! `DEVCOMM_TUNE_FILE`. With `--op all_reduce,reduce_scatter,all_gather` it tunes the
//! reductions instead (`bench/reduce/tune.rs`), into a table for `DEVCOMM_REDUCE_TUNE_FILE`.
//!
//! A configuration must be a function of the message size alone (sender and receiver derive
//! it independently), so one entry serves both one-way and both-ways calls: per size the table
//! takes the candidate whose worse slowdown against the fastest candidate of either direction
//! is smallest. The staged `Bulk` protocol (push when the launch also receives from the peer,
//! pull otherwise) is scored from the measured push (both ways) and pull (one way) times of the
//! same shape.

use std::path::PathBuf;

use cudarc::driver::CudaSlice;
use devcomm::p2p::tune::{TunedLimits, OP_SENDRECV, TUNE_VERSION};
use devcomm::p2p::{sweep_configs, P2PConfig, Protocol, TuneEntry, TuneTable};

use devcomm::reduce::Buffers;

use crate::bench::nccl::NcclPair;
use crate::bench::reduce::{self, tune::Request, Coll};
use crate::bench::sendrecv::{describe, devcomm_call, nccl_call, verify_call, SIZES};
use crate::bench::{calls_per_sample, time_pair, today};
use crate::selftest::Ctx;

/// Arguments of `devcomm tune`.
#[derive(Debug, clap::Args)]
pub struct TuneArgs {
    /// What to tune: `sendrecv` (a send/recv table for DEVCOMM_TUNE_FILE), or one or more of
    /// all_reduce, reduce_scatter, all_gather, comma-separated (one reduction table for
    /// DEVCOMM_REDUCE_TUNE_FILE).
    #[arg(
        long = "op",
        visible_alias = "ops",
        value_delimiter = ',',
        default_value = "sendrecv"
    )]
    ops: Vec<String>,
    /// Where rank 0 writes the table (JSON). Load it with DEVCOMM_TUNE_FILE=FILE (send/recv)
    /// or DEVCOMM_REDUCE_TUNE_FILE=FILE (reductions) on every rank.
    #[arg(long)]
    out: PathBuf,
    /// Smallest message size to tune.
    #[arg(long, default_value_t = 0)]
    min_bytes: usize,
    /// Largest message size to tune (at most 1 GiB); larger messages keep the defaults.
    #[arg(long, default_value_t = 1 << 30)]
    max_bytes: usize,
    /// Warm-up samples per candidate.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed samples per candidate (the median is kept).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Reductions: where the buffers lie, comma-separated: ordinary, pool (devcomm's memory
    /// pool, where the zero-copy paths are candidates too).
    #[arg(long, value_delimiter = ',', default_value = "ordinary")]
    buffers: Vec<String>,
    /// Reductions: the same as `--buffers pool`.
    #[arg(long, conflicts_with = "buffers")]
    pool: bool,
    /// Reductions: the element type timed (the table serves every type by bytes).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Reductions: block counts tried for every algorithm, comma-separated, beside the default
    /// plan's (those above the SM cap are left out).
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128")]
    blocks: Vec<u32>,
    /// Reductions: the largest line one-shot payload, in KiB, that the run's window holds;
    /// default: twice the built-in limit of the world size (at most 4096).
    #[arg(long)]
    one_shot_kib: Option<u32>,
    /// Reductions: the largest two-shot on lines, in KiB, that the run's window holds;
    /// default: twice the built-in limit of the world size.
    #[arg(long)]
    line_two_shot_kib: Option<u32>,
    /// Reductions: keep the entries of the table already at --out (same GPU, world size,
    /// window and type) for the collectives and buffers this run does not tune, so that
    /// several shorter runs make one table.
    #[arg(long)]
    append: bool,
}

/// The reduction tuning `args` ask for, checked; `None` for send/recv (whose run rejects the
/// reductions' options).
fn reduce_request(args: &TuneArgs) -> Result<Option<Request>, String> {
    let reductions: Vec<Coll> = args.ops.iter().filter_map(|o| Coll::parse(o)).collect();
    if args.ops.iter().any(|o| o == "sendrecv") && args.ops.len() == 1 {
        let reduction_only = [
            (
                args.pool || args.buffers != ["ordinary"],
                "--buffers/--pool",
            ),
            (args.dtype != "bf16", "--dtype"),
            (args.blocks != [8, 16, 32, 64, 128], "--blocks"),
            (args.one_shot_kib.is_some(), "--one-shot-kib"),
            (args.line_two_shot_kib.is_some(), "--line-two-shot-kib"),
            (args.append, "--append"),
        ];
        if let Some((_, flag)) = reduction_only.iter().find(|(set, _)| *set) {
            return Err(format!(
                "{flag} tunes the reductions: add --op all_reduce,reduce_scatter,all_gather"
            ));
        }
        return Ok(None);
    }
    if let Some(other) = args.ops.iter().find(|o| Coll::parse(o).is_none()) {
        return Err(format!(
            "--op {other:?}: tune either sendrecv alone or reductions (all_reduce, \
             reduce_scatter, all_gather, comma-separated), which write different tables"
        ));
    }
    let mut colls = Vec::new();
    for c in reductions {
        if colls.contains(&c) {
            return Err(format!("--op names {} twice", c.name()));
        }
        colls.push(c);
    }
    let mut buffers = Vec::new();
    let names: &[String] = if args.pool { &[] } else { &args.buffers };
    if args.pool {
        buffers.push(Buffers::Pool);
    }
    for b in names {
        let kind = match b.as_str() {
            "ordinary" => Buffers::Ordinary,
            "pool" => Buffers::Pool,
            other => {
                return Err(format!("--buffers {other:?}: ordinary or pool"));
            }
        };
        if buffers.contains(&kind) {
            return Err(format!("--buffers names {b} twice"));
        }
        buffers.push(kind);
    }
    if args.blocks.is_empty() || args.blocks.iter().any(|&b| !(1..=128).contains(&b)) {
        return Err(format!("--blocks {:?}: each 1 to 128", args.blocks));
    }
    if args.one_shot_kib.is_some_and(|k| k > 4096) {
        return Err("--one-shot-kib: at most 4096 (the line one-shot's setting)".into());
    }
    if args.line_two_shot_kib.is_some_and(|k| k > 1 << 20) {
        return Err("--line-two-shot-kib: at most 1048576".into());
    }
    if args.max_bytes < args.min_bytes {
        return Err("--max-bytes is below --min-bytes".into());
    }
    let dtype = reduce::parse_dtype(&args.dtype)?;
    let mut blocks = args.blocks.clone();
    blocks.sort_unstable();
    blocks.dedup();
    Ok(Some(Request {
        colls,
        buffers,
        dtype,
        blocks,
        one_shot_kib: args.one_shot_kib,
        line_two_shot_kib: args.line_two_shot_kib,
        min_bytes: args.min_bytes,
        max_bytes: args.max_bytes,
        warmup: args.warmup,
        iters: args.iters,
        out: args.out.clone(),
        append: args.append,
    }))
}

/// Checks the arguments without a GPU (before ranks are launched).
pub fn check_args(args: &TuneArgs) -> Result<(), String> {
    reduce_request(args).map(|_| ())
}

/// `devcomm tune`: the send/recv sweep, or the reductions' (`--op all_reduce,...`).
pub fn run(args: &TuneArgs) -> Result<i32, String> {
    match reduce_request(args)? {
        Some(req) => reduce::tune::run(&req),
        None => run_sendrecv(args),
    }
}

/// Every candidate is checked byte for byte up to this size; above it only the chosen one (a
/// poisoned 1 GiB check per candidate would dominate the run).
const VERIFY_EVERY_CANDIDATE_MAX: usize = 64 << 20;

/// One checked call of `config` (see `verify_call`).
#[allow(clippy::too_many_arguments)]
fn verify(
    cx: &Ctx,
    src: &CudaSlice<u8>,
    dst: &mut CudaSlice<u8>,
    expect: &[u8],
    bytes: usize,
    peer: usize,
    both: bool,
    config: P2PConfig,
) -> Result<(), String> {
    let what = describe(&config, bytes, both, cx.comm.tuning().p2p_switches().pull);
    verify_call(cx, dst, expect, bytes, both, &what, &mut |dst| {
        devcomm_call(cx, src, dst, bytes, peer, both, Some(config))
    })
}

/// Every candidate of one size, with its measured times (one way, both ways).
struct Scored {
    config: P2PConfig,
    one_way_us: f64,
    both_ways_us: f64,
}

/// The candidate whose worse relative slowdown (against the fastest one way, and against the
/// fastest both ways) is smallest; the first one on a tie.
fn choose(scored: &[Scored]) -> Option<&Scored> {
    let best = |f: fn(&Scored) -> f64| scored.iter().map(f).fold(f64::INFINITY, f64::min);
    let (one, both) = (best(|s| s.one_way_us), best(|s| s.both_ways_us));
    let score = |s: &Scored| (s.one_way_us / one).max(s.both_ways_us / both);
    scored
        .iter()
        .filter(|s| s.one_way_us.is_finite() && s.both_ways_us.is_finite())
        .fold(None, |acc: Option<&Scored>, s| match acc {
            Some(a) if score(a) <= score(s) => Some(a),
            _ => Some(s),
        })
}

/// Adds a `Bulk` candidate for every staged shape measured as both push and pull: one way it
/// pulls, both ways it pushes (`devcomm::p2p::pull_by_default`).
fn with_bulk(mut scored: Vec<Scored>) -> Vec<Scored> {
    let shape = |c: &P2PConfig| (c.blocks, c.threads, c.chunk_bytes);
    let mut bulk = Vec::new();
    for pull in scored
        .iter()
        .filter(|s| s.config.protocol == Protocol::Pull)
    {
        if let Some(push) = scored.iter().find(|s| {
            s.config.protocol == Protocol::Push && shape(&s.config) == shape(&pull.config)
        }) {
            bulk.push(Scored {
                config: P2PConfig {
                    protocol: Protocol::Bulk,
                    ..pull.config
                },
                one_way_us: pull.one_way_us,
                both_ways_us: push.both_ways_us,
            });
        }
    }
    scored.extend(bulk);
    scored
}

/// Runs the send/recv sweep on every rank (ranks 0 and 1 move data, the others keep step);
/// rank 0 writes the table.
fn run_sendrecv(args: &TuneArgs) -> Result<i32, String> {
    super::refuse_shared_gpu("tuning runs")?;
    let cx = Ctx::new()?;
    let comm = &cx.comm;
    if comm.world_size() < 2 {
        return Err("tuning needs at least 2 ranks".into());
    }
    let rank = comm.rank();
    let active = rank < 2;
    let peer = 1 - rank.min(1);
    let sizes: Vec<usize> = SIZES
        .iter()
        .copied()
        .filter(|&s| s >= args.min_bytes && s <= args.max_bytes.min(1 << 30))
        .collect();
    let Some(&max) = sizes.last() else {
        return Err(format!(
            "no benchmark size between {} and {} bytes",
            args.min_bytes, args.max_bytes
        ));
    };
    let limits = *comm.tuning().p2p_limits();
    let nccl = NcclPair::new(&cx)?;
    let src: CudaSlice<u8> = cx
        .stream
        .clone_htod(&cx.data_of(rank, 5150, max))
        .map_err(|e| e.to_string())?;
    let mut dst: CudaSlice<u8> = cx.stream.alloc_zeros(max).map_err(|e| e.to_string())?;
    let expect = if active {
        cx.data_of(peer, 5150, max)
    } else {
        Vec::new()
    };
    cx.sync()?;
    let mut entries = Vec::new();
    for (i, &bytes) in sizes.iter().enumerate() {
        let calls = calls_per_sample(bytes);
        let candidates = sweep_configs(bytes as u64, &limits);
        let mut scored: Vec<Scored> = Vec::with_capacity(candidates.len());
        for &config in &candidates {
            let mut us = [0.0f64; 2];
            for (d, both) in [false, true].into_iter().enumerate() {
                if bytes <= VERIFY_EVERY_CANDIDATE_MAX {
                    verify(&cx, &src, &mut dst, &expect, bytes, peer, both, config)?;
                }
                cx.host_barrier()?;
                us[d] = time_pair(&cx, args.warmup, args.iters, calls, "tune", &mut || {
                    devcomm_call(&cx, &src, &mut dst, bytes, peer, both, Some(config))
                })?;
            }
            scored.push(Scored {
                config,
                one_way_us: us[0],
                both_ways_us: us[1],
            });
        }
        let scored = with_bulk(scored);
        let Some(pick) = choose(&scored) else {
            return Err(format!("no candidate measured at {bytes} bytes"));
        };
        // The chosen configuration itself, both ways (a Bulk pick was timed as its parts).
        for both in [false, true] {
            verify(&cx, &src, &mut dst, &expect, bytes, peer, both, pick.config)?;
            cx.host_barrier()?;
        }
        let mut nccl_us = [0.0f64; 2];
        for (d, both) in [false, true].into_iter().enumerate() {
            nccl_us[d] = time_pair(&cx, args.warmup, args.iters, calls, "nccl", &mut || {
                nccl_call(&nccl, &src, &mut dst, bytes, peer, both, rank)
            })?;
        }
        if rank == 0 {
            eprintln!(
                "[{}/{}] {bytes} B: {} of {} candidates; one way {:.2} us ({:.2}x NCCL), both \
                 ways {:.2} us ({:.2}x NCCL)",
                i + 1,
                sizes.len(),
                describe(
                    &pick.config,
                    bytes,
                    false,
                    cx.comm.tuning().p2p_switches().pull
                ),
                scored.len(),
                pick.one_way_us,
                nccl_us[0] / pick.one_way_us,
                pick.both_ways_us,
                nccl_us[1] / pick.both_ways_us,
            );
        }
        entries.push(TuneEntry {
            op: OP_SENDRECV.into(),
            max_bytes: bytes as u64,
            config: pick.config,
            one_way_us: pick.one_way_us,
            both_ways_us: pick.both_ways_us,
            nccl_one_way_us: nccl_us[0],
            nccl_both_ways_us: nccl_us[1],
        });
        cx.host_barrier()?;
    }
    let table = TuneTable {
        version: TUNE_VERSION,
        device: comm.device_info().name.clone(),
        world_size: comm.world_size(),
        date: today(),
        limits: TunedLimits::from(&limits),
        entries,
    };
    // What the table will be checked against when it is loaded.
    table
        .validate(&limits, &comm.device_info().name)
        .map_err(|e| e.to_string())?;
    if rank == 0 {
        std::fs::write(&args.out, table.to_json())
            .map_err(|e| format!("{}: {e}", args.out.display()))?;
        println!(
            "wrote {} ({} sizes); use it with DEVCOMM_TUNE_FILE={} on every rank",
            args.out.display(),
            table.entries.len(),
            args.out.display()
        );
    }
    cx.host_barrier()?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: TuneArgs,
    }

    /// `devcomm tune` with `line` (and `--out t.json`): the reduction request, or why not.
    fn request(line: &str) -> Result<Option<Request>, String> {
        let words = ["tune", "--out", "t.json"]
            .into_iter()
            .chain(line.split_whitespace());
        let cli = Cli::try_parse_from(words).map_err(|e| e.to_string())?;
        reduce_request(&cli.args)
    }

    #[test]
    fn sendrecv_is_the_default_and_takes_no_reduction_options() {
        assert_eq!(request(""), Ok(None));
        assert_eq!(request("--op sendrecv --iters 5"), Ok(None));
        for line in [
            "--pool",
            "--buffers pool",
            "--dtype f32",
            "--blocks 8",
            "--one-shot-kib 1024",
            "--line-two-shot-kib 0",
            "--append",
        ] {
            let e = request(line).unwrap_err();
            assert!(e.contains("--op all_reduce"), "{line}: {e}");
        }
        // Send/recv and reductions write different tables.
        let e = request("--op sendrecv,all_reduce").unwrap_err();
        assert!(e.contains("different tables"), "{e}");
        assert!(request("--op all_to_all").is_err());
    }

    #[test]
    fn reductions_parse_into_one_request() {
        let r = request("--op all_reduce,reduce_scatter,all_gather")
            .unwrap()
            .unwrap();
        assert_eq!(
            r.colls,
            vec![Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather]
        );
        assert_eq!(r.buffers, vec![Buffers::Ordinary]);
        assert_eq!(r.dtype, devcomm::DataType::BF16);
        assert_eq!(r.blocks, vec![8, 16, 32, 64, 128]);
        assert_eq!((r.one_shot_kib, r.line_two_shot_kib), (None, None));
        assert_eq!(
            (r.min_bytes, r.max_bytes, r.warmup, r.iters),
            (0, 1 << 30, 3, 20)
        );
        assert_eq!(r.out, PathBuf::from("t.json"));
        // --ops spells it too; --pool is --buffers pool; both kinds in one run.
        let r = request("--ops all_gather --pool").unwrap().unwrap();
        assert_eq!(
            (r.colls, r.buffers),
            (vec![Coll::AllGather], vec![Buffers::Pool])
        );
        let r = request("--op all_reduce --buffers ordinary,pool --dtype f32 --blocks 64,4,4")
            .unwrap()
            .unwrap();
        assert_eq!(r.buffers, vec![Buffers::Ordinary, Buffers::Pool]);
        assert_eq!(r.dtype, devcomm::DataType::F32);
        assert_eq!(r.blocks, vec![4, 64]);
        let r = request(
            "--op all_reduce --one-shot-kib 2048 --line-two-shot-kib 8192 --min-bytes 1024 \
             --max-bytes 1048576 --warmup 1 --iters 5",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.one_shot_kib, r.line_two_shot_kib),
            (Some(2048), Some(8192))
        );
        assert_eq!(
            (r.min_bytes, r.max_bytes, r.warmup, r.iters),
            (1024, 1 << 20, 1, 5)
        );
    }

    #[test]
    fn bad_reduction_options_are_refused_before_anything_runs() {
        for (line, says) in [
            ("--op all_reduce,all_reduce", "twice"),
            ("--op all_reduce --buffers registered", "ordinary or pool"),
            ("--op all_reduce --buffers pool,pool", "twice"),
            (
                "--op all_reduce --pool --buffers ordinary",
                "cannot be used",
            ),
            ("--op all_reduce --blocks 0", "1 to 128"),
            ("--op all_reduce --blocks 129", "1 to 128"),
            ("--op all_reduce --dtype f8", "bf16"),
            ("--op all_reduce --one-shot-kib 8192", "4096"),
            ("--op all_reduce --line-two-shot-kib 2000000", "1048576"),
            ("--op all_reduce --min-bytes 100 --max-bytes 10", "below"),
        ] {
            let e = request(line).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
        }
    }

    fn s(protocol: Protocol, blocks: u32, one: f64, both: f64) -> Scored {
        Scored {
            config: P2PConfig {
                protocol,
                blocks,
                threads: 512,
                chunk_bytes: if protocol == Protocol::LowLatency128 {
                    0
                } else {
                    16384
                },
            },
            one_way_us: one,
            both_ways_us: both,
        }
    }

    #[test]
    fn the_choice_minimises_the_worse_slowdown_of_the_two_directions() {
        // A is fastest one way but 50% slower both ways; B is 10% slower one way, fastest both.
        let all = vec![
            s(Protocol::Pull, 32, 10.0, 30.0),
            s(Protocol::LowLatency128, 32, 11.0, 20.0),
        ];
        assert_eq!(
            choose(&all).unwrap().config.protocol,
            Protocol::LowLatency128
        );
        assert!(choose(&[]).is_none());
    }

    #[test]
    fn bulk_is_scored_from_pull_one_way_and_push_both_ways_of_the_same_shape() {
        let all = with_bulk(vec![
            s(Protocol::Pull, 32, 10.0, 40.0),
            s(Protocol::Push, 32, 12.0, 20.0),
            s(Protocol::Push, 16, 11.0, 19.0), // no pull of this shape: no bulk candidate
        ]);
        assert_eq!(all.len(), 4);
        let bulk = &all[3];
        assert_eq!(bulk.config.protocol, Protocol::Bulk);
        assert_eq!(bulk.config.blocks, 32);
        assert_eq!((bulk.one_way_us, bulk.both_ways_us), (10.0, 20.0));
        // It beats both of its parts: fastest one way, within 6% both ways.
        assert_eq!(choose(&all).unwrap().config.protocol, Protocol::Bulk);
    }
}
