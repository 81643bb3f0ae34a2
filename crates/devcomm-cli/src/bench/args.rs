//! The arguments of `devcomm bench`.

/// Arguments of `devcomm bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to time (`--op help` lists them): `sendrecv`, `latency`, `launch`, `put`, `ce`,
    /// `all_to_all`, `all_to_all_v`, `moe`, and the reductions `all_reduce`, `reduce_scatter`,
    /// `all_gather` (against NCCL on ordinary buffers and on registered window buffers).
    #[arg(long, default_value = "sendrecv")]
    pub(crate) op: String,
    /// Timed repetitions per point (the median is reported).
    #[arg(long, default_value_t = 20)]
    pub(crate) iters: usize,
    /// Untimed repetitions before timing.
    #[arg(long, default_value_t = 3)]
    pub(crate) warmup: usize,
    /// Write the records as JSON here (rank 0).
    #[arg(long)]
    pub(crate) json: Option<std::path::PathBuf>,
    /// Write an SVG plot here (rank 0).
    #[arg(long)]
    pub(crate) plot: Option<std::path::PathBuf>,
    /// Device kind recorded with the results (e.g. nvidia-h200-x4).
    #[arg(long, default_value = "")]
    pub(crate) device_kind: String,
    /// Send/recv: both directions at once.
    #[arg(long)]
    pub(crate) both_directions: bool,
    /// Largest message size to time (per peer for `all_to_all`, which stops at 256 MiB; the
    /// reductions' size as nccl-tests counts it, 8 B to 1 GiB in powers of two).
    #[arg(long, default_value_t = 1 << 30)]
    pub(crate) max_bytes: usize,
    /// Smallest message size to time (send/recv, all-to-all and the reductions).
    #[arg(long, default_value_t = 0)]
    pub(crate) min_bytes: usize,
    /// Send/recv: blocks (SMs) per direction for staged messages instead of the table's
    /// (bandwidth against SMs used).
    #[arg(long)]
    pub(crate) blocks: Option<u32>,
    /// Send/recv: time every candidate configuration per size (protocol, blocks, chunk) and
    /// report the fastest, with its configuration: the data behind the defaults table.
    #[arg(long)]
    pub(crate) sweep: bool,
    /// Send/recv: the destination is a registered buffer and devcomm writes straight into it
    /// (`Comm::send_registered` / `recv_registered`); all-to-all: the output is a registered
    /// buffer (`Comm::all_to_all_registered`). NCCL receives into the same buffer.
    /// Reductions: input and output are slices of devcomm's memory pool (its zero-copy
    /// paths); NCCL runs on the same buffers.
    #[arg(long)]
    pub(crate) zero_copy: bool,
    /// Send/recv: capture runs of back-to-back calls in CUDA graphs (devcomm's and NCCL's) and
    /// time their replays, for messages up to 64 KiB.
    #[arg(long)]
    pub(crate) graph: bool,
    /// All-to-all: also time these f32 hooks, each given as `FILE:STRUCT` (a CUDA C++ file and
    /// the hooks struct it defines), at 16 MiB per peer with rows of 2048 elements, against
    /// the plain all-to-all. Their output is not checked: this is for placing the cost of a
    /// hook's parts (variants that leave one part out). Repeatable.
    #[arg(long = "hooks", value_name = "FILE:STRUCT")]
    pub(crate) extra_hooks: Vec<String>,
    /// All-reduce (f32 sum): devcomm's timed calls run the fused residual add + RMSNorm
    /// epilogue (examples/hooks/rmsnorm.cu) on rows of this many elements, against NCCL's
    /// plain all-reduce; only sizes of whole rows are timed.
    #[arg(long, value_name = "ELEMENTS")]
    pub(crate) epilogue_rows: Option<usize>,
    /// With `--epilogue-rows`: compile the RMSNorm hook with `kRowThreads = THREADS` (32, 64,
    /// 128, 256 or 512 threads a row; default the hook's own, 128), so that one run compares
    /// row group widths. The checked call is checked against the hook's host reference at
    /// that width.
    #[arg(long, value_name = "THREADS", requires = "epilogue_rows")]
    pub(crate) epilogue_row_threads: Option<u32>,
    /// Keep cudarc's per-buffer event tracking on (its default). With several streams in a
    /// context, every call that takes a buffer through the safe API then records and waits on
    /// that buffer's events, a few host driver calls per call for devcomm and NCCL alike. The
    /// benchmark turns it off by default, so that it times the two libraries and not cudarc's
    /// bookkeeping (every buffer here is used on one stream); docs/benchmarks/README.md.
    #[arg(long)]
    pub(crate) event_tracking: bool,
    /// Reductions: the element type (bf16, f16, f32, f64, i32, i64, u8).
    #[arg(long, default_value = "bf16")]
    pub(crate) dtype: String,
    /// Reductions: the reduction operator (sum, avg, max, min; all_gather has none).
    #[arg(long, default_value = "sum")]
    pub(crate) redop: String,
    /// Reductions: what devcomm is timed against: `all` (NCCL on the same buffers, and NCCL on
    /// buffers registered as symmetric windows where this NCCL has them), `nccl`,
    /// `nccl-window`, or `none` (devcomm alone; the only choice with DEVCOMM_SHARE_GPU=1, where
    /// it is a smoke test whose timings mean nothing). Send/recv: `all` or `nccl` (NCCL
    /// send/recv), or `none` (devcomm alone, as with DEVCOMM_SHARE_GPU=1).
    #[arg(long, default_value = "all")]
    pub(crate) reference: String,
}
