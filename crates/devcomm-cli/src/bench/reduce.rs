//! `devcomm bench --op all_reduce|reduce_scatter|all_gather`: devcomm's reductions against
//! NCCL in the same processes, on the same buffers, and against NCCL on buffers registered as
//! symmetric windows (where NCCL has its fastest kernels), with nccl-tests' algorithm and bus
//! bandwidths. Per size: fresh data, one checked call of devcomm on a poisoned output, then
//! every candidate timed in turn (docs/benchmarks/README.md, "Method").
//!
//! The data are small integers (`data::Values`), exact in the element type and in every
//! partial sum, so every reduction order gives the same bits: devcomm's result is compared bit
//! for bit with NCCL's (or, with `--reference none`, with a host reference that reduces in
//! rank order). The one exception is an average of a float type on a world size that is not a
//! power of two, where NCCL multiplies by a rounded 1/n first: compared within a tolerance
//! below the values' spacing. Each record says which in `check`.

mod data;
mod epilogue;
mod nccl_coll;
pub(crate) mod tune;
mod types;

use cudarc::driver::{CudaSlice, DevicePtr};
use devcomm::{DataType, ReduceOp};

use self::data::{expected, first_mismatch, Check, Codec, Run, Values};
use self::epilogue::Epilogue;
use self::nccl_coll::{NcclColl, WindowBuffers};
use self::types::{busbw_gbps, nccl_dtype, nccl_op, parse_redop, sizes, Size};
pub(crate) use self::types::{parse_dtype, Coll, Reference};
use crate::bench::nccl::max_over_ranks;
use crate::bench::{calls_per_sample, min_free_bytes, time_ranks_each, BenchArgs, Record};
use crate::selftest::Ctx;

/// Device memory left free for what NCCL and devcomm allocate lazily.
const HEADROOM: usize = 2 << 30;

/// Largest host reference (elements of every rank's input it regenerates) a rank computes
/// without NCCL; above it a point is timed unchecked, and its record says so.
const HOST_CHECK_MAX_ELEMS: usize = 1 << 28;

/// What a run is: the collective, its types, its values and reference.
struct Setup {
    coll: Coll,
    dtype: DataType,
    op: ReduceOp,
    values: Values,
    reference: Reference,
    /// The buffers are slices of devcomm's memory pool (`--zero-copy`).
    pool: bool,
    /// devcomm's timed calls run the RMSNorm epilogue (`--epilogue-rows`).
    epilogue: Option<Epilogue>,
}

impl Setup {
    fn codec(&self) -> Codec {
        self.values.codec
    }

    /// "bf16 sum" (all-gather: the type alone), for messages.
    fn what(&self, size: &Size) -> String {
        let op = if self.coll.reduces() {
            self.op.name()
        } else {
            ""
        };
        format!(
            "{} {} B {} {op}",
            self.coll.name(),
            size.bytes,
            self.dtype.name()
        )
    }
}

/// The candidates timed at each size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Candidate {
    Devcomm,
    Nccl,
    NcclWindow,
}

/// The benchmark's buffers: devcomm's and NCCL's (one input, one output, the largest size's:
/// ordinary allocations, or with `--zero-copy` slices of devcomm's memory pool, which take the
/// zero-copy paths), and NCCL's window buffers where it has them.
struct Buffers<'a> {
    /// Kept alive for `ptrs`.
    _memory: Memory<'a>,
    ptrs: (u64, u64),
    window: Option<WindowBuffers<'a>>,
}

/// Where the benchmark's input and output live.
enum Memory<'a> {
    Plain(CudaSlice<u8>, CudaSlice<u8>),
    Pool(devcomm::PoolSlice<'a>, devcomm::PoolSlice<'a>),
}

impl<'a> Memory<'a> {
    /// Input and output of `in_bytes` and `out_bytes`: ordinary allocations, or (`pool`) slices
    /// of the memory pool, grown collectively to hold them (every rank allocates the same sizes
    /// in the same order: the slices are symmetric, as the zero-copy paths need).
    fn new(cx: &'a Ctx, pool: bool, in_bytes: usize, out_bytes: usize) -> Result<Self, String> {
        let e = |x: devcomm::Error| x.to_string();
        if pool {
            let need = (in_bytes + out_bytes + (1 << 20)) as u64;
            if cx.comm.pool_usage().largest_free < need {
                cx.comm.grow_pool(need as usize).map_err(e)?;
            }
            let i = cx.comm.alloc(in_bytes as u64).map_err(e)?;
            let o = cx.comm.alloc(out_bytes as u64).map_err(e)?;
            return Ok(Memory::Pool(i, o));
        }
        let d = |x: cudarc::driver::DriverError| x.to_string();
        Ok(Memory::Plain(
            cx.stream.alloc_zeros(in_bytes).map_err(d)?,
            cx.stream.alloc_zeros(out_bytes).map_err(d)?,
        ))
    }

    fn ptrs(&self, cx: &Ctx) -> (u64, u64) {
        match self {
            Memory::Plain(i, o) => (i.device_ptr(&cx.stream).0, o.device_ptr(&cx.stream).0),
            Memory::Pool(i, o) => (i.ptr(), o.ptr()),
        }
    }
}

/// Checks the reduction options (`--dtype`, `--redop`, `--reference`,
/// `--epilogue-row-threads`) without a GPU.
pub(crate) fn check_args(args: &BenchArgs) -> Result<(), String> {
    Codec::of(parse_dtype(&args.dtype)?)?;
    parse_redop(&args.redop)?;
    epilogue::hook_source(args.epilogue_row_threads)?;
    Reference::parse(&args.reference).map(|_| ())
}

pub(crate) fn run(cx: &Ctx, args: &BenchArgs, coll: Coll) -> Result<Vec<Record>, String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let dtype = parse_dtype(&args.dtype)?;
    let op = parse_redop(&args.redop)?;
    let reference = Reference::parse(&args.reference)?;
    let codec = Codec::of(dtype)?;
    let values = Values::new(codec, coll.reduces().then_some(op), world)?;
    let elem = codec.bytes();
    let epilogue = match args.epilogue_rows {
        None => None,
        Some(_) if coll != Coll::AllReduce || op != ReduceOp::Sum => {
            return Err("--epilogue-rows times all_reduce with --redop sum".into())
        }
        Some(_) if args.zero_copy => {
            return Err("--epilogue-rows times ordinary buffers (leave out --zero-copy)".into())
        }
        Some(row) => Some(Epilogue::new(
            cx,
            dtype,
            row,
            args.epilogue_row_threads,
            args.max_bytes / elem,
        )?),
    };
    let s = Setup {
        coll,
        dtype,
        op,
        values,
        reference,
        pool: args.zero_copy,
        epilogue,
    };
    let footprint = |z: &Size| {
        let (i, o) = coll.in_out(z.count, world);
        (i + o) * elem * (1 + usize::from(reference.window()))
    };
    // Ranks that share a GPU (the smoke test) share its free memory too.
    let sharing = if cx.comm.config().share_gpu { world } else { 1 };
    let free = min_free_bytes(cx, HEADROOM)? / sharing;
    let (points, largest) = fitting_sizes(
        (coll, elem, world, rank),
        (args.min_bytes, args.max_bytes),
        free,
        |z| footprint(z) <= free && s.epilogue.as_ref().is_none_or(|e| e.fits(z.count)),
    )?;
    let (n_in, n_out) = coll.in_out(largest.count, world);
    let memory = Memory::new(cx, args.zero_copy, n_in * elem, n_out * elem)?;
    let ptrs = memory.ptrs(cx);
    let nccl = match reference {
        Reference::None => None,
        _ => Some(NcclColl::new(cx)?),
    };
    let mut out = Vec::new();
    let window = match &nccl {
        Some(n) if reference.window() => {
            match WindowBuffers::new(cx, n, [n_in * elem, n_out * elem])? {
                Ok(w) => Some(w),
                Err(reason) => {
                    if rank == 0 {
                        eprintln!("NCCL window buffers not available: {reason}");
                    }
                    out.push(Record {
                        reference: format!("NCCL, window buffers: not available ({reason})"),
                        ..base_record(cx, args, &s, 0)
                    });
                    None
                }
            }
        }
        _ => None,
    };
    if reference == Reference::NcclWindow && window.is_none() && nccl.is_some() {
        // Nothing to time against: the record above says why.
        return Ok(if rank == 0 { out } else { Vec::new() });
    }
    let bufs = Buffers {
        _memory: memory,
        ptrs,
        window,
    };
    cx.sync()?;
    for z in &points {
        out.extend(point(cx, args, &s, nccl.as_ref(), &bufs, z)?);
        cx.host_barrier()?;
    }
    cx.sync()?;
    drop(bufs);
    drop(nccl);
    Ok(if rank == 0 { out } else { Vec::new() })
}

/// The record fields every record of a run shares.
fn base_record(cx: &Ctx, args: &BenchArgs, s: &Setup, bytes: usize) -> Record {
    Record {
        dtype: Some(s.dtype.name().into()),
        redop: s.coll.reduces().then(|| s.op.name().into()),
        ..Record::new(cx, args, s.coll.name(), bytes as u64)
    }
}

/// One size: fresh data, the checked call, every candidate timed in turn; the records (on
/// every rank; the caller keeps rank 0's).
fn point(
    cx: &Ctx,
    args: &BenchArgs,
    s: &Setup,
    nccl: Option<&NcclColl>,
    bufs: &Buffers<'_>,
    z: &Size,
) -> Result<Vec<Record>, String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let elem = s.codec().bytes();
    let (n_in, _) = s.coll.in_out(z.count, world);
    let run = Run {
        values: s.values,
        seed: cx.seed,
        tag: ((z.bytes as u64) << 2) | s.coll as u64,
        world,
    };
    let host = s.values.input(run.seed, run.tag, rank, n_in);
    upload(cx, bufs.ptrs.0, &host)?;
    drop(host);
    if let Some(w) = &bufs.window {
        // SAFETY: the NCCL window's input and `bufs`' input both hold the `n_in` elements of
        // the largest point and live until after the `cx.sync()` below.
        unsafe {
            devcomm::testing::memcpy_dtod_async(w.ptrs().0, bufs.ptrs.0, n_in * elem, &cx.stream)
        }
        .map_err(|e| e.to_string())?;
    }
    cx.sync()?;
    let check = check_point(cx, s, nccl, bufs.ptrs, &run, z)?;
    let mut candidates = vec![Candidate::Devcomm];
    if nccl.is_some() && s.reference.plain() {
        candidates.push(Candidate::Nccl);
    }
    if bufs.window.is_some() {
        candidates.push(Candidate::NcclWindow);
    }
    let names: Vec<String> = candidates
        .iter()
        .map(|c| format!("{}-{c:?}", s.coll.name()))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let types = (nccl_dtype(s.dtype)?, nccl_op(s.op));
    let calls = calls_per_sample(z.bytes);
    let us = time_ranks_each(
        cx,
        world,
        args.warmup,
        args.iters,
        calls,
        &names,
        &mut |i| {
            match (candidates[i], nccl, &bufs.window) {
                (Candidate::Devcomm, _, _) => match &s.epilogue {
                    Some(e) => epilogue_call(cx, s.dtype, e, bufs.ptrs, z.count),
                    None => devcomm_call(cx, s, bufs.ptrs, z.count),
                },
                // SAFETY: the buffers hold the largest size's input and output, alive until the
                // run's end (after a synchronisation).
                (Candidate::Nccl, Some(n), _) => unsafe {
                    n.call(s.coll, bufs.ptrs, z.count, types, &cx.stream)
                },
                // SAFETY: as above, the window buffers were sized alike.
                (Candidate::NcclWindow, Some(n), Some(w)) => unsafe {
                    n.call(s.coll, w.ptrs(), z.count, types, &cx.stream)
                },
                (c, _, _) => Err(format!("{c:?} has no NCCL to run on")),
            }
        },
    )?;
    let d_us = us[0];
    let busbw = |t: f64| Some(busbw_gbps(s.coll, world, z.bytes, t));
    let plan = match &s.epilogue {
        // The hooked call's plan (ordinary buffers; the network path plans its own).
        Some(e) if !cx.comm.tuning().has_network_links() => {
            let shape = devcomm::reduce::plan::Shape {
                collective: s.coll.devcomm(),
                count: z.count as u64,
                elem_bytes: elem as u64,
                world,
                row_len: Some(e.row as u64),
            };
            devcomm::reduce::plan::plan(&shape, &cx.comm.tuning().reduction_limits()).ok()
        }
        _ => cx
            .comm
            .tuning()
            .reduction_plan_at(
                s.coll.devcomm(),
                s.dtype,
                (bufs.ptrs.0, bufs.ptrs.1, z.count as u64),
            )
            .map_err(|e| e.to_string())?,
    };
    let base = Record {
        check,
        devcomm_busbw_gbps: busbw(d_us),
        sms: plan.map_or(0, |p| p.blocks),
        ..base_record(cx, args, s, z.bytes)
    };
    // devcomm's algorithm, before what the reference's record adds.
    let mut algorithm = plan.map_or_else(String::new, |p| match p.rounds {
        1 => p.algorithm.name().to_string(),
        r => format!("{} {r} rounds", p.algorithm.name()),
    });
    if let Some(e) = &s.epilogue {
        algorithm += &format!(
            "; devcomm with the residual + RMSNorm epilogue on rows of {}, {} threads a row, \
             NCCL all-reduce alone",
            e.row, e.lanes
        );
    }
    let plain_us = candidates
        .iter()
        .position(|&c| c == Candidate::Nccl)
        .map(|i| us[i]);
    if candidates.len() == 1 {
        // With network links (forced on one machine) the record says that it times loopback.
        let reference = match cx.comm.tuning().has_network_peers() {
            true => crate::bench::sendrecv_net::net_reference(false),
            false => "none (devcomm alone)".into(),
        };
        return Ok(vec![Record {
            reference,
            config: algorithm,
            ..base.timed(d_us, f64::NAN, z.bytes as f64)
        }]);
    }
    Ok(candidates
        .iter()
        .zip(&us)
        .skip(1)
        .map(|(&c, &n_us)| Record {
            reference: match c {
                Candidate::NcclWindow => "NCCL, window buffers (ncclMemAlloc, \
                    ncclCommWindowRegister symmetric; same data)"
                    .into(),
                _ if s.pool => "NCCL (same buffers: devcomm's memory pool)".into(),
                _ => "NCCL (same buffers)".into(),
            },
            config: match (c, plain_us) {
                (Candidate::NcclWindow, Some(p)) => format!(
                    "{algorithm}; window NCCL {:.2}x NCCL on the same buffers",
                    p / n_us
                ),
                _ => algorithm.clone(),
            },
            nccl_busbw_gbps: busbw(n_us),
            ..base.clone().timed(d_us, n_us, z.bytes as f64)
        })
        .collect())
}

/// devcomm's all-reduce with the epilogue on raw addresses.
fn epilogue_call(
    cx: &Ctx,
    dtype: DataType,
    e: &Epilogue,
    (i, o): (u64, u64),
    count: usize,
) -> Result<(), String> {
    // SAFETY: as `devcomm_call`'s; the hook's arguments (residual, weight) hold the largest
    // size's rows and live as long as `e`.
    unsafe {
        cx.comm.all_reduce_hooked_raw(
            e.hooks.raw(),
            i,
            o,
            count,
            dtype,
            ReduceOp::Sum,
            e.hook_args(),
            &cx.stream,
        )
    }
    .map_err(|e| e.to_string())
}

/// One devcomm call of the run's collective on raw addresses.
fn devcomm_call(cx: &Ctx, s: &Setup, (i, o): (u64, u64), count: usize) -> Result<(), String> {
    let c = &cx.comm;
    // SAFETY: `i` and `o` are this rank's device allocations holding the call's input and
    // output (`Coll::in_out` of `count`; the buffers are the largest size's), alive until the
    // stream is synchronised at the run's end; nothing else writes them meanwhile.
    let r = unsafe {
        match s.coll {
            Coll::AllReduce => c.all_reduce_raw(i, o, count, s.dtype, s.op, &cx.stream),
            Coll::ReduceScatter => c.reduce_scatter_raw(i, o, count, s.dtype, s.op, &cx.stream),
            Coll::AllGather => c.all_gather_raw(i, o, count, s.dtype, &cx.stream),
        }
    };
    r.map_err(|e| e.to_string())
}

/// Poisons the output, runs devcomm once and compares its output with NCCL's of the same input
/// (itself on an output poisoned differently), or without NCCL with the host reference; with
/// the epilogue, devcomm's call is the hooked one and the expected output is the hook's host
/// reference on that result. Every rank learns whether any rank's check failed. Returns how
/// the point was checked.
fn check_point(
    cx: &Ctx,
    s: &Setup,
    nccl: Option<&NcclColl>,
    ptrs: (u64, u64),
    run: &Run,
    z: &Size,
) -> Result<String, String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let codec = s.codec();
    let (n_in, n_out) = s.coll.in_out(z.count, world);
    let out_bytes = n_out * codec.bytes();
    let (want, check, how) = match nccl {
        Some(n) => {
            poison(cx, ptrs.1, out_bytes, codec.poison() ^ 1)?;
            cx.host_barrier()?;
            let types = (nccl_dtype(s.dtype)?, nccl_op(s.op));
            // SAFETY: the buffers hold this size's input and output; synchronised below.
            unsafe { n.call(s.coll, ptrs, z.count, types, &cx.stream)? };
            let want = download(cx, ptrs.1, out_bytes)?;
            let how = match s.values.check {
                Check::Bitwise => "bitwise against NCCL (values exact in any order)".into(),
                Check::Within(t) => format!(
                    "within {t:.3} of NCCL (its avg on {world} ranks pre-multiplies by a \
                     rounded 1/{world})"
                ),
            };
            (want, s.values.check, how)
        }
        None if world * n_in <= HOST_CHECK_MAX_ELEMS => (
            expected(run, s.coll, s.op, rank, z.count),
            Check::Bitwise,
            "bitwise against a host reference in rank order".to_string(),
        ),
        None => {
            return Ok(format!(
                "not checked: the host reference would regenerate more than \
                 {HOST_CHECK_MAX_ELEMS} elements"
            ))
        }
    };
    let (want, how) = match &s.epilogue {
        Some(e) => (
            e.reference(&want),
            format!(
                "{how}, then the RMSNorm hook's host reference on {} threads a row",
                e.lanes
            ),
        ),
        None => (want, how),
    };
    poison(cx, ptrs.1, out_bytes, codec.poison())?;
    cx.host_barrier()?;
    match &s.epilogue {
        Some(e) => epilogue_call(cx, s.dtype, e, ptrs, z.count)?,
        None => devcomm_call(cx, s, ptrs, z.count)?,
    }
    let got = download(cx, ptrs.1, out_bytes)?;
    let wrong = first_mismatch(codec, check, &got, &want);
    let any = max_over_ranks(cx, "reduce-check", f64::from(u8::from(wrong.is_some())))?;
    match wrong {
        Some((i, g, w)) => Err(format!(
            "{}: rank {rank}: element {i} of {n_out} is {g}, expected {w} ({how})",
            s.what(z)
        )),
        None if any > 0.0 => Err(format!(
            "{}: devcomm's result was wrong on another rank",
            s.what(z)
        )),
        None => Ok(how),
    }
}

/// Fills `bytes` at `ptr` with `byte` and waits.
fn poison(cx: &Ctx, ptr: u64, bytes: usize, byte: u8) -> Result<(), String> {
    // SAFETY: `ptr` is a device allocation of this context holding at least `bytes`.
    unsafe { cudarc::driver::result::memset_d8_async(ptr, byte, bytes, cx.stream.cu_stream()) }
        .map_err(|e| e.to_string())?;
    cx.sync()
}

/// Copies `host` to `ptr` and waits.
fn upload(cx: &Ctx, ptr: u64, host: &[u8]) -> Result<(), String> {
    // SAFETY: `ptr` holds at least `host.len()` bytes; `host` outlives the copy (waited for).
    unsafe { cudarc::driver::result::memcpy_htod_async(ptr, host, cx.stream.cu_stream()) }
        .map_err(|e| e.to_string())?;
    cx.sync()
}

/// Waits for the stream, then copies `bytes` at `ptr` to the host.
fn download(cx: &Ctx, ptr: u64, bytes: usize) -> Result<Vec<u8>, String> {
    let mut host = vec![0u8; bytes];
    // SAFETY: `ptr` holds at least `bytes`; `host` outlives the copy (waited for).
    unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut host, ptr, cx.stream.cu_stream()) }
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    Ok(host)
}

/// The sizes from `min_bytes` to `max_bytes` of `coll` (elements of `elem` bytes, `world`
/// ranks) that `keep` takes (their buffers fit the `free` bytes of device memory, and what else
/// the caller asks), with the largest of them; an error when none does. Rank 0 says which sizes
/// were left out.
pub(crate) fn fitting_sizes(
    (coll, elem, world, rank): (Coll, usize, usize, usize),
    (min_bytes, max_bytes): (usize, usize),
    free: usize,
    keep: impl Fn(&Size) -> bool,
) -> Result<(Vec<Size>, Size), String> {
    let all = sizes(coll, elem, world, min_bytes, max_bytes);
    let points: Vec<Size> = all.iter().copied().filter(|z| keep(z)).collect();
    let Some(largest) = points.last().copied() else {
        return Err(format!(
            "{}: no size between {min_bytes} and {max_bytes} B fits in {free} B of free device \
             memory",
            coll.name()
        ));
    };
    if points.len() < all.len() && rank == 0 {
        eprintln!(
            "{}: sizes above {} B do not fit in device memory",
            coll.name(),
            largest.bytes
        );
    }
    Ok((points, largest))
}
