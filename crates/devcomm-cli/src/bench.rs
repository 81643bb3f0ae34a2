//! `devcomm bench`: times devcomm against NCCL (or the copy engine) in the same processes on
//! the same buffers: CUDA events, warm-up, median of many. Prints a table (rank 0) and writes
//! JSON records and an SVG plot.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, LaunchConfig, PushKernelArg};

use crate::selftest::Ctx;

mod agree_latency;
mod alltoall;
mod ce;
mod launch;
pub(crate) mod nccl;
mod plot;
mod sendrecv;
pub(crate) mod tune;

/// Arguments of `devcomm bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to time: `sendrecv` (against NCCL send/recv), `latency` (signal ping-pong between
    /// ranks 0 and 1), `launch` (host against GPU time per call of back-to-back small calls,
    /// devcomm's and NCCL's), `put` (one GPU pushing into a peer's window by 16-byte stores
    /// and by TMA bulk copies, and pulling by TMA, against the copy engine and NCCL
    /// send/recv), `ce` (a message moved by the copy engine in chunks, on one or several
    /// streams, with and without stream memory operations, against one whole copy),
    /// `all_to_all` (every rank, equal chunks, against NCCL grouped send/recv),
    /// `all_to_allv` (MoE token dispatch with counts on the GPU, against NCCL's count
    /// exchange, host sync and grouped send/recv), `agree_latency` (host-launched 8-byte
    /// sendrecv between ranks 0 and 1, also on one shared GPU: compare with a run under
    /// DEVCOMM_P2P_OPTIONS="-DDC_AGREE=0", the call agreement compiled out).
    #[arg(long, default_value = "sendrecv")]
    op: String,
    /// Timed repetitions per point (the median is reported).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed repetitions before timing.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Write the records as JSON here (rank 0).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Write an SVG plot here (rank 0).
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Device kind recorded with the results (e.g. nvidia-h200-x4).
    #[arg(long, default_value = "")]
    device_kind: String,
    /// Send/recv: both directions at once.
    #[arg(long)]
    both_directions: bool,
    /// Largest message size to time (per peer for `all_to_all`, which stops at 256 MiB).
    #[arg(long, default_value_t = 1 << 30)]
    max_bytes: usize,
    /// Smallest message size to time (send/recv and all-to-all).
    #[arg(long, default_value_t = 0)]
    min_bytes: usize,
    /// Send/recv: blocks (SMs) per direction for staged messages instead of the table's
    /// (bandwidth against SMs used).
    #[arg(long)]
    blocks: Option<u32>,
    /// Send/recv: time every candidate configuration per size (protocol, blocks, chunk) and
    /// report the fastest, with its configuration: the data behind the defaults table.
    #[arg(long)]
    sweep: bool,
    /// Send/recv: the destination is a registered buffer and devcomm writes straight into it
    /// (`Comm::send_registered` / `recv_registered`); all-to-all: the output is a registered
    /// buffer (`Comm::all_to_all_registered`). NCCL receives into the same buffer.
    #[arg(long)]
    zero_copy: bool,
    /// Send/recv: capture runs of back-to-back calls in CUDA graphs (devcomm's and NCCL's) and
    /// time their replays, for messages up to 64 KiB.
    #[arg(long)]
    graph: bool,
    /// All-to-all: also time these f32 hooks, each given as `FILE:STRUCT` (a CUDA C++ file and
    /// the hooks struct it defines), at 16 MiB per peer with rows of 2048 elements, against
    /// the plain all-to-all. Their output is not checked: this is for placing the cost of a
    /// hook's parts (variants that leave one part out). Repeatable.
    #[arg(long = "hooks", value_name = "FILE:STRUCT")]
    extra_hooks: Vec<String>,
    /// Keep cudarc's per-buffer event tracking on (its default). With several streams in a
    /// context, every call that takes a buffer through the safe API then records and waits on
    /// that buffer's events, a few host driver calls per call for devcomm and NCCL alike. The
    /// benchmark turns it off by default, so that it times the two libraries and not cudarc's
    /// bookkeeping (every buffer here is used on one stream); docs/benchmarks/README.md.
    #[arg(long)]
    event_tracking: bool,
}

/// One measured point. Every devcomm benchmark writes this shape.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Record {
    /// Operation, e.g. `put` or `sendrecv`.
    pub op: String,
    /// Ranks in the run.
    pub world_size: usize,
    /// Bytes per message (per peer for collectives).
    pub bytes: u64,
    /// Both directions at once.
    pub both_directions: bool,
    /// devcomm's median time, microseconds.
    pub devcomm_us: f64,
    /// The reference's median time, microseconds (NCCL unless `reference` says otherwise).
    pub nccl_us: f64,
    /// `nccl_us / devcomm_us`.
    pub ratio: f64,
    /// Thread blocks (SMs) devcomm used.
    pub sms: u32,
    /// GPU name and machine kind.
    pub device: String,
    /// Date of the run (UTC, YYYY-MM-DD).
    pub date: String,
    /// What `nccl_us` measured.
    pub reference: String,
    /// devcomm's bandwidth, GB/s (10^9 bytes per second, one direction).
    pub devcomm_gbps: f64,
    /// devcomm's launch configuration, when the benchmark has one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub config: String,
    /// The reference's bandwidth, GB/s.
    pub nccl_gbps: f64,
    /// Tokens per rank (all-to-all-v).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Whether cudarc's per-buffer event tracking was on (`--event-tracking`).
    pub event_tracking: bool,
}

pub(crate) fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Two timing events (cudarc's default disables timing) that time what one closure enqueues.
pub(crate) struct EventTimer {
    start: cudarc::driver::CudaEvent,
    end: cudarc::driver::CudaEvent,
}

impl EventTimer {
    pub(crate) fn new(stream: &CudaStream) -> Result<Self, String> {
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = || {
            stream
                .context()
                .new_event(timing)
                .map_err(|e| e.to_string())
        };
        Ok(Self {
            start: event()?,
            end: event()?,
        })
    }

    /// Microseconds between the events around what `f` enqueues on `stream`, after waiting for
    /// it.
    pub(crate) fn time(
        &self,
        stream: &CudaStream,
        f: impl FnOnce() -> Result<(), String>,
    ) -> Result<f64, String> {
        let e = |x: cudarc::driver::DriverError| x.to_string();
        self.start.record(stream).map_err(e)?;
        f()?;
        self.end.record(stream).map_err(e)?;
        self.end.synchronize().map_err(e)?;
        Ok(f64::from(self.start.elapsed_ms(&self.end).map_err(e)?) * 1e3)
    }
}

/// Median of event-timed runs of `f` on `stream`, in microseconds. Each run is preceded by
/// `before` (untimed; e.g. a host barrier so that ranks start together).
pub(crate) fn time_us(
    stream: &Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    mut before: impl FnMut() -> Result<(), String>,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let timer = EventTimer::new(stream)?;
    let mut samples = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        before()?;
        let us = timer.time(stream, &mut f)?;
        if i >= warmup {
            samples.push(us);
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Median host wall-clock times of several candidates, timed in turn as in
/// [`time_ranks_each`]: `f(i)` runs candidate `i` (named `names[i]`), then the stream is
/// synchronised; each sample starts on an idle stream after a host barrier. Every rank returns
/// the slowest rank's median per candidate. For calls that wait on the GPU from the host
/// inside, where only this times them the way a user sees them.
pub(crate) fn time_wall_each(
    cx: &Ctx,
    warmup: usize,
    iters: usize,
    names: &[&str],
    f: &mut dyn FnMut(usize) -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let sync = || cx.stream.synchronize().map_err(|e| e.to_string());
    let samples = in_turn(cx, true, warmup, iters, names.len(), &mut |i| {
        sync()?;
        let t0 = std::time::Instant::now();
        f(i)?;
        sync()?;
        Ok(t0.elapsed().as_secs_f64() * 1e6)
    })?;
    slowest_medians(cx, names, samples)
}

/// Runs `sample(i)` for every candidate `i < n` in each of `warmup + iters` rounds, after a
/// host barrier each time, forward in even rounds and backward in odd ones: drift during the
/// run (clocks, neighbours on the machine) then falls on every candidate alike, and none
/// always follows the same other. Ranks that do not `time` only meet the barriers. Returns
/// the timed rounds' samples per candidate (empty where not timed).
fn in_turn(
    cx: &Ctx,
    time: bool,
    warmup: usize,
    iters: usize,
    n: usize,
    sample: &mut dyn FnMut(usize) -> Result<f64, String>,
) -> Result<Vec<Vec<f64>>, String> {
    let mut samples = vec![Vec::with_capacity(iters); n];
    for round in 0..warmup + iters {
        for k in 0..n {
            let i = if round % 2 == 0 { k } else { n - 1 - k };
            cx.host_barrier()?;
            if time {
                let s = sample(i)?;
                if round >= warmup {
                    samples[i].push(s);
                }
            }
        }
    }
    Ok(samples)
}

/// Each candidate's median (0 where this rank has no samples), then the slowest rank's.
fn slowest_medians(
    cx: &Ctx,
    names: &[&str],
    mut samples: Vec<Vec<f64>>,
) -> Result<Vec<f64>, String> {
    cx.sync()?;
    let mut out = Vec::with_capacity(names.len());
    for (name, s) in names.iter().zip(&mut samples) {
        s.sort_by(f64::total_cmp);
        let us = s.get(s.len() / 2).copied().unwrap_or(0.0);
        out.push(nccl::max_over_ranks(cx, name, us)?);
    }
    Ok(out)
}

/// Per-call median time of `calls` back-to-back calls of `f` on ranks 0 and 1 (each sample
/// starts after a host barrier); the other ranks only meet the barriers. Every rank returns
/// the slower of ranks 0 and 1.
pub(crate) fn time_pair(
    cx: &Ctx,
    warmup: usize,
    iters: usize,
    calls: usize,
    what: &str,
    f: &mut dyn FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    time_ranks(cx, 2, warmup, iters, calls, what, f)
}

/// [`time_pair`] on ranks `0..ranks` (every rank for collectives): the slowest rank's median.
pub(crate) fn time_ranks(
    cx: &Ctx,
    ranks: usize,
    warmup: usize,
    iters: usize,
    calls: usize,
    what: &str,
    f: &mut dyn FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    Ok(time_ranks_each(cx, ranks, warmup, iters, calls, &[what], &mut |_| f())?[0])
}

/// Per-call median times of several candidates on ranks `0..ranks`, timed in turn (see
/// `in_turn`): `f(i)` makes one call of candidate `i` (named `names[i]`); a sample is
/// `calls` back-to-back calls between two CUDA events. Every rank returns the slowest rank's
/// median per candidate.
pub(crate) fn time_ranks_each(
    cx: &Ctx,
    ranks: usize,
    warmup: usize,
    iters: usize,
    calls: usize,
    names: &[&str],
    f: &mut dyn FnMut(usize) -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let timer = EventTimer::new(&cx.stream)?;
    let active = cx.comm.rank() < ranks;
    let samples = in_turn(cx, active, warmup, iters, names.len(), &mut |i| {
        let us = timer.time(&cx.stream, || {
            for _ in 0..calls {
                f(i)?;
            }
            Ok(())
        })?;
        Ok(us / calls as f64)
    })?;
    slowest_medians(cx, names, samples)
}

/// Benchmarks and the tuner time devcomm against NCCL over NVLink: ranks that share a GPU
/// ([`devcomm::topology::SHARE_GPU_ENV`]) are refused before anything starts.
pub(crate) fn refuse_shared_gpu(what: &str) -> Result<(), String> {
    if devcomm::topology::share_gpu() {
        return Err(format!(
            "{what} need one GPU per rank: {} is for functional tests (NCCL refuses ranks that \
             share a GPU, and the timings would say nothing of NVLink)",
            devcomm::topology::SHARE_GPU_ENV
        ));
    }
    Ok(())
}

/// Runs the chosen benchmark on every rank; rank 0 prints and writes the results.
pub fn run(args: &BenchArgs) -> Result<i32, String> {
    if args.op != "agree_latency" {
        refuse_shared_gpu("benchmarks")?; // agree_latency compares two runs on one machine
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
    let records = match args.op.as_str() {
        "latency" => bench_latency(&cx, args)?,
        "agree_latency" => agree_latency::run(&cx, args)?,
        "launch" => launch::run(&cx, args)?,
        "put" => bench_put(&cx, args)?,
        "ce" => ce::run(&cx, args)?,
        "sendrecv" if args.graph => sendrecv::run_graph(&cx, args)?,
        "sendrecv" => sendrecv::run(&cx, args, args.both_directions)?,
        "all_to_all" => alltoall::run(&cx, args)?,
        "all_to_allv" => alltoall::run_v(&cx, args)?,
        other => {
            return Err(format!(
            "unknown --op {other:?} (latency, agree_latency, launch, put, ce, sendrecv, all_to_all, \
             all_to_allv)"
        ))
        }
    };
    if cx.comm.rank() == 0 {
        print_table(&records);
        if let Some(path) = &args.json {
            let text = serde_json::to_string_pretty(&records).map_err(|e| e.to_string())?;
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        if let Some(path) = &args.plot {
            plot::write_svg(path, &records).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    cx.host_barrier()?;
    Ok(0)
}

pub(crate) fn device_label(cx: &Ctx, args: &BenchArgs) -> String {
    let name = &cx.comm.device_info().name;
    if args.device_kind.is_empty() {
        name.clone()
    } else {
        format!("{name} ({})", args.device_kind)
    }
}

fn print_table(records: &[Record]) {
    // A tokens column only when some record has tokens (all-to-all-v).
    let with_tokens = records.iter().any(|r| r.tokens.is_some());
    let tokens = |t: String| {
        if with_tokens {
            format!("{t:>6} ")
        } else {
            String::new()
        }
    };
    println!(
        "{:<10} {}{:>12} {:>5} {:>12} {:>12} {:>10} {:>10} {:>7} {:>4}  reference",
        "op",
        tokens("tokens".into()),
        "bytes",
        "both",
        "devcomm_us",
        "ref_us",
        "devcomm",
        "ref",
        "ratio",
        "sms"
    );
    for r in records {
        println!(
            "{:<10} {}{:>12} {:>5} {:>12.2} {:>12.2} {:>8.1}GB {:>8.1}GB {:>7.3} {:>4}  {} {}",
            r.op,
            tokens(r.tokens.map_or_else(|| "-".into(), |t| t.to_string())),
            r.bytes,
            r.both_directions,
            r.devcomm_us,
            r.nccl_us,
            r.devcomm_gbps,
            r.nccl_gbps,
            r.ratio,
            r.sms,
            r.reference,
            r.config
        );
    }
}

/// One-way signal latency from a ping-pong inside one kernel between ranks 0 and 1.
fn bench_latency(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let comm = &cx.comm;
    let module = cx.foundation()?;
    let f = module.function("pingpong").map_err(|e| e.to_string())?;
    let win = comm.window::<u64>(8, 1).map_err(|e| e.to_string())?;
    let elapsed = cx.stream.alloc_zeros::<u64>(1).map_err(|e| e.to_string())?;
    let iters = 10_000u64;
    let mut base = 0u64;
    let mut samples = Vec::new();
    for rep in 0..(args.warmup + args.iters) {
        cx.host_barrier()?;
        if comm.rank() < 2 {
            let peer = (1 - comm.rank()) as i32;
            let handle = win.device_handle();
            let mut l = cx.stream.launch_builder(&f);
            l.arg(&handle)
                .arg(&peer)
                .arg(&iters)
                .arg(&base)
                .arg(&elapsed);
            // SAFETY: pingpong(DeviceWindow, int, u64, u64, u64*); elapsed has one element.
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(|e| e.to_string())?;
            cx.sync()?;
            let ns = cx.stream.clone_dtoh(&elapsed).map_err(|e| e.to_string())?[0];
            if rep >= args.warmup && comm.rank() == 0 {
                samples.push(ns as f64 / (2 * iters) as f64 / 1e3);
            }
        }
        base += iters;
    }
    if comm.rank() != 0 {
        return Ok(Vec::new());
    }
    samples.sort_by(f64::total_cmp);
    let us = samples[samples.len() / 2];
    Ok(vec![Record {
        op: "signal_latency".into(),
        world_size: comm.world_size(),
        bytes: 8,
        both_directions: false,
        devcomm_us: us,
        nccl_us: f64::NAN,
        ratio: f64::NAN,
        sms: 1,
        device: device_label(cx, args),
        date: today(),
        reference: "none (one-way time = ping-pong round trip / 2)".into(),
        devcomm_gbps: 0.0,
        nccl_gbps: 0.0,
        config: String::new(),
        tokens: None,
        event_tracking: args.event_tracking,
    }])
}

/// One `put` record: `bytes` moved on `blocks` in `t` us against a reference's `ref_us`.
fn put_record(
    cx: &Ctx,
    args: &BenchArgs,
    (bytes, blocks): (usize, u32),
    (t, ref_us, reference): (f64, f64, &str),
    config: String,
) -> Record {
    Record {
        op: "put".into(),
        world_size: cx.comm.world_size(),
        bytes: bytes as u64,
        both_directions: false,
        devcomm_us: t,
        nccl_us: ref_us,
        ratio: ref_us / t,
        sms: blocks,
        device: device_label(cx, args),
        date: today(),
        reference: reference.into(),
        devcomm_gbps: bytes as f64 / t / 1e3,
        nccl_gbps: bytes as f64 / ref_us / 1e3,
        config,
        tokens: None,
        event_tracking: args.event_tracking,
    }
}

/// TMA copy shapes the `put` benchmark times: (blocks, warps per block, stages per warp, chunk
/// bytes). Shared memory per block stays under 200 KiB.
const TMA_CONFIGS: [(u32, u32, u32, u32); 8] = [
    (8, 1, 4, 32768),
    (16, 1, 4, 32768),
    (32, 1, 4, 32768),
    (132, 1, 4, 32768),
    (16, 4, 2, 16384),
    (32, 4, 2, 16384),
    (132, 4, 2, 16384),
    (132, 2, 4, 16384),
];

/// `put` bandwidth from rank 0 into rank 1's window at several sizes and block counts, next to
/// the copy engine (cuMemcpyAsync into the same peer mapping) and NCCL send/recv.
fn bench_put(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let comm = &cx.comm;
    let rank = comm.rank();
    let max = 1usize << 30;
    // SAFETY: everything below runs on one stream, synchronised before any buffer is dropped;
    // nothing needs cudarc's cross-stream events, which a graph capture cannot contain.
    unsafe { comm.context().disable_event_tracking() };
    let module = cx.foundation()?;
    let f = module
        .function("put_bandwidth")
        .map_err(|e| e.to_string())?;
    let tma = module
        .function("copy_bandwidth_tma")
        .map_err(|e| e.to_string())?;
    let win = comm.window::<u8>(max, 1).map_err(|e| e.to_string())?;
    let src_host = cx.data_of(rank, 9, 1 << 20);
    let mut src = cx
        .stream
        .alloc_zeros::<u8>(max)
        .map_err(|e| e.to_string())?;
    for chunk in 0..(max >> 20) {
        let mut view = src.slice_mut(chunk << 20..(chunk + 1) << 20);
        cx.stream
            .memcpy_htod(&src_host, &mut view)
            .map_err(|e| e.to_string())?;
    }
    let nccl = nccl::NcclPair::new(cx)?;
    let mut recv = cx
        .stream
        .alloc_zeros::<u8>(max)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    let handle = win.device_handle();
    let peer_ptr = win.get_nvlink_address(1).unwrap_or(0);
    let mut out = Vec::new();
    for bytes in [1usize << 20, 64 << 20, 1 << 30] {
        // Back-to-back launches per timed sample, as the baselines were timed: at 1 MiB a
        // single launch would mostly time the launch.
        let calls = ((64usize << 20) / bytes).clamp(1, 20);
        // NCCL send/recv between ranks 0 and 1 on the same buffers, and the copy engine.
        let nccl_us = nccl.time_send_recv(cx, &src, &mut recv, bytes, args.warmup, args.iters)?;
        let ce_us = if rank == 0 {
            let (sp, _g) = src.device_ptr(&cx.stream);
            time_us(
                &cx.stream,
                args.warmup,
                args.iters,
                || Ok(()),
                || {
                    for _ in 0..calls {
                        devcomm::cuda::memcpy_dtod_async(peer_ptr, sp, bytes, &cx.stream)
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                },
            )? / calls as f64
        } else {
            f64::NAN
        };
        cx.host_barrier()?;
        for blocks in [4u32, 8, 16, 32, 132] {
            let (sp, _g) = src.device_ptr(&cx.stream);
            let peer = 1i32;
            let b = bytes as u64;
            let launches = || -> Result<(), String> {
                for _ in 0..calls {
                    let mut l = cx.stream.launch_builder(&f);
                    l.arg(&handle).arg(&peer).arg(&sp).arg(&b);
                    // SAFETY: put_bandwidth(DeviceWindow, int, const void*, u64); the window
                    // and src hold at least `bytes`.
                    unsafe {
                        l.launch(LaunchConfig {
                            grid_dim: (blocks, 1, 1),
                            block_dim: (512, 1, 1),
                            shared_mem_bytes: 0,
                        })
                    }
                    .map_err(|e| e.to_string())?;
                }
                Ok(())
            };
            let (us, graph_us) = if rank == 0 {
                let us = time_us(&cx.stream, args.warmup, args.iters, || Ok(()), launches)?
                    / calls as f64;
                // The same launches captured once and replayed: METHOD.md's remedy for launch
                // gaps between short kernels (at 1 MiB a put takes about 6 us).
                let graph = cx.capture(launches)?;
                let g_us = time_us(
                    &cx.stream,
                    args.warmup,
                    args.iters,
                    || Ok(()),
                    || graph.launch().map_err(|e| e.to_string()),
                )? / calls as f64;
                (us, g_us)
            } else {
                (f64::NAN, f64::NAN)
            };
            cx.host_barrier()?;
            if rank == 0 {
                for (launch, t) in [("stream", us), ("graph", graph_us)] {
                    for (reference, ref_us) in [
                        ("copy engine cuMemcpyAsync", ce_us),
                        ("NCCL send/recv", nccl_us),
                    ] {
                        out.push(put_record(
                            cx,
                            args,
                            (bytes, blocks),
                            (t, ref_us, reference),
                            format!("{calls} launches per sample, {launch}"),
                        ));
                    }
                }
            }
        }
        // Bulk copies by the Tensor Memory Accelerator (PERFORMANCE.md v11): pushed into the
        // peer's window, and pulled from it into a local buffer; on rank 0 only.
        if rank == 0 {
            for (blocks, warps, stages, chunk) in TMA_CONFIGS {
                for (dir, dst, srcp) in [
                    ("push", peer_ptr, src.device_ptr(&cx.stream).0),
                    ("pull", recv.device_ptr(&cx.stream).0, peer_ptr),
                ] {
                    let smem = warps * stages * (chunk + 8);
                    tma.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .map_err(|e| e.to_string())?;
                    let b = bytes as u64;
                    let launches = || -> Result<(), String> {
                        for _ in 0..calls {
                            let mut l = cx.stream.launch_builder(&tma);
                            l.arg(&dst).arg(&srcp).arg(&b).arg(&chunk).arg(&stages);
                            // SAFETY: copy_bandwidth_tma(void*, const void*, u64, u32, u32):
                            // both ranges hold `bytes`, a multiple of 16 as is `chunk`, and
                            // the shared memory is the kernel's layout.
                            unsafe {
                                l.launch(LaunchConfig {
                                    grid_dim: (blocks, 1, 1),
                                    block_dim: (32 * warps, 1, 1),
                                    shared_mem_bytes: smem,
                                })
                            }
                            .map_err(|e| e.to_string())?;
                        }
                        Ok(())
                    };
                    let t = time_us(&cx.stream, args.warmup, args.iters, || Ok(()), launches)?
                        / calls as f64;
                    out.push(put_record(
                        cx,
                        args,
                        (bytes, blocks),
                        (t, ce_us, "copy engine cuMemcpyAsync"),
                        format!(
                            "tma {dir} warps={warps} stages={stages} chunk={chunk}, {calls} launches per sample"
                        ),
                    ));
                }
            }
        }
        cx.host_barrier()?;
    }
    cx.sync()?;
    Ok(out)
}
