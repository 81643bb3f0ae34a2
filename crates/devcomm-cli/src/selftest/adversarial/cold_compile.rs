//! Cold compiles: a communicator on which some ranks compile every kernel at its first use (a
//! kernel cache of their own, empty) while the others read it from the warm cache, under a
//! short device timeout (`--timeout-ms`, 2 s by default) and the normal setup timeout. A
//! compile takes seconds, longer than the device timeout: the warm ranks must wait for it at
//! the kernels' load gates (their peers mark themselves as loading) instead of giving up after
//! the device timeout or launching kernels that time out on the device. The first call of
//! every kind of kernel runs on it, each result compared with a host reference: send/recv,
//! the barrier, all-to-all, all-to-all-v, a hooked all-to-all, all-reduce (f32 and bf16, the
//! one-shot and two-shot sizes), reduce-scatter, all-gather, a hooked all-reduce and zero-copy
//! send/recv into a registered buffer (towards NVLink peers). In a job with network links
//! (`DEVCOMM_TOPOLOGY_OVERRIDE`) the same calls take their network variants.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use devcomm::reduce::{Algorithm, Collective};
use devcomm::{
    AllToAllVCounts, Comm, Config, DataType, HookArgs, Hooks, KernelKind, LinkKind, ReduceOp,
};
use half::bf16;

use crate::selftest::harness::{
    compare, doubling_epilogue, doubling_hooks, fresh_comm_with, Ctx, Params,
};

type Detail = Result<String, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Row length of the hooked all-reduce.
const ROW: usize = 256;

/// The hooks of the round: the collective's and the reduction epilogue's.
struct RoundHooks {
    double: Hooks<f32>,
    twice: Hooks<f32>,
    copy: Hooks<f32>,
}

impl RoundHooks {
    fn new() -> Self {
        Self {
            double: doubling_hooks(),
            twice: doubling_epilogue(),
            copy: Hooks::<f32>::copy(),
        }
    }

    /// Every module the round's calls load, in a job with or without network links.
    fn kinds(&self, net: bool) -> Vec<KernelKind<'_>> {
        let mut kinds = vec![
            KernelKind::SendRecv,
            KernelKind::barrier(net),
            KernelKind::Collective {
                hooks: self.copy.raw(),
            },
            KernelKind::Collective {
                hooks: self.double.raw(),
            },
        ];
        for dtype in [DataType::F32, DataType::BF16] {
            kinds.extend(KernelKind::reduction(dtype, None, net));
        }
        let hooked = Some((ReduceOp::Sum, self.twice.raw()));
        kinds.extend(KernelKind::reduction(DataType::F32, hooked, net));
        kinds
    }
}

/// Small integers: every sum over up to 32 ranks is exact in f32 and bf16, so the
/// references are bitwise.
fn val(rank: usize, i: usize, tag: usize) -> f32 {
    ((rank * 5 + i * 3 + tag * 7) % 11) as f32 - 5.0
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One round: the ranks `cold` picks compile on a fresh communicator whose kernel cache is an
/// empty directory of their own; the others use the configured (warm) cache.
pub(super) fn cold_round(cx: &Ctx, params: &Params, name: &str, cold: fn(usize) -> bool) -> Detail {
    let rank = cx.comm.rank();
    let hooks = RoundHooks::new();
    // The warm ranks' cache must hold every module: load them all through the check's own
    // communicator first (the same settings and network flag as the fresh one).
    let t0 = std::time::Instant::now();
    cx.comm
        .prewarm(&hooks.kinds(cx.comm.tuning().has_network_links()))
        .map_err(|e| format!("prewarming the warm cache: {e}"))?;
    let warm_s = t0.elapsed().as_secs_f64();
    cx.host_barrier()?;
    let is_cold = cold(rank);
    let dir = std::env::temp_dir().join(format!(
        "devcomm-cold-{name}-{}-{rank}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = Config::from_env().map_err(err)?;
    if is_cold {
        config.cache_dir = Some(dir.clone());
    }
    let timeout = params.timeout;
    let mut n = 0;
    let fresh = fresh_comm_with(cx, name, &mut n, |b| {
        b.config(config).device_timeout(timeout)
    })?;
    let t1 = std::time::Instant::now();
    let calls = first_calls(&fresh.comm, &fresh.stream, &hooks, cx);
    let calls_s = t1.elapsed().as_secs_f64();
    drop(fresh);
    let compiled = count_cubins(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let done = calls?;
    if is_cold && compiled == 0 {
        return Err(format!(
            "rank {rank} was to compile cold but wrote nothing into {}",
            dir.display()
        ));
    }
    let cold_ranks: Vec<usize> = (0..cx.comm.world_size()).filter(|&r| cold(r)).collect();
    Ok(format!(
        "cold ranks {cold_ranks:?}, device timeout {timeout:?}; this rank {}: {done} \
         ({calls_s:.1} s; warm-cache prewarm {warm_s:.1} s)",
        if is_cold {
            format!("compiled {compiled} modules")
        } else {
            "warm".into()
        }
    ))
}

/// Modules in a cache directory (0 when it does not exist).
fn count_cubins(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".cubin"))
            .count()
    })
}

/// The first call of every kind of kernel on `comm`, each checked.
fn first_calls(comm: &Comm, stream: &Arc<CudaStream>, hooks: &RoundHooks, cx: &Ctx) -> Detail {
    let mut done = Vec::new();
    let mut step = |what: &str, r: Result<(), String>| {
        r.map_err(|e| format!("{what}: {e}"))?;
        comm.synchronize(stream)
            .map_err(|e| format!("{what}: {e}"))?;
        done.push(what.to_owned());
        Ok::<(), String>(())
    };
    step("sendrecv", sendrecv(comm, stream, cx))?;
    step("barrier", comm.barrier(stream).map_err(err))?;
    step("all_to_all", all_to_all(comm, stream, None))?;
    step("all_to_all_v", all_to_all_v(comm, stream))?;
    step("hooked all_to_all", all_to_all(comm, stream, Some(&hooks.double)))?;
    for count in [1024usize, 1 << 20] {
        let f32_what = format!("all_reduce f32 x{count} ({})", algorithm(comm, DataType::F32, count));
        step(&f32_what, all_reduce::<f32>(comm, stream, count, |x| x, |x| x))?;
        let what = format!("all_reduce bf16 x{count} ({})", algorithm(comm, DataType::BF16, count));
        step(&what, all_reduce::<bf16>(comm, stream, count, bf16::from_f32, bf16::to_f32))?;
    }
    step("reduce_scatter f32", reduce_scatter(comm, stream))?;
    step("all_gather f32", all_gather(comm, stream))?;
    step("hooked all_reduce f32", hooked_all_reduce(comm, stream, &hooks.twice))?;
    match zero_copy(comm, stream, cx) {
        Ok(true) => done.push("zero-copy sendrecv".into()),
        Ok(false) => done.push("zero-copy skipped (a ring peer is not on NVLink)".into()),
        Err(e) => return Err(format!("zero-copy sendrecv: {e}")),
    }
    Ok(format!("{} calls passed: {}", done.len(), done.join(", ")))
}

fn algorithm(comm: &Comm, dtype: DataType, count: usize) -> String {
    match comm.tuning().reduction_plan(Collective::AllReduce, dtype, count as u64) {
        Ok(Some(p)) => match p.algorithm {
            Algorithm::OneShot => "one-shot".into(),
            Algorithm::TwoShot => "two-shot".into(),
            other => format!("{other:?}"),
        },
        Ok(None) => "empty".into(),
        Err(e) => format!("no plan: {e}"),
    }
}

fn ring(comm: &Comm) -> (usize, usize) {
    let (rank, world) = (comm.rank(), comm.world_size());
    ((rank + 1) % world, (rank + world - 1) % world)
}

fn sendrecv(comm: &Comm, stream: &Arc<CudaStream>, cx: &Ctx) -> Result<(), String> {
    let (next, prev) = ring(comm);
    let bytes = 65_536 + 3;
    let send = stream
        .clone_htod(&cx.data_of(comm.rank(), 9_100, bytes))
        .map_err(err)?;
    let mut recv = stream.alloc_zeros::<u8>(bytes).map_err(err)?;
    comm.sendrecv(&send, next, &mut recv, prev, stream)
        .map_err(err)?;
    comm.synchronize(stream).map_err(err)?;
    let got = stream.clone_dtoh(&recv).map_err(err)?;
    compare(&got, &cx.data_of(prev, 9_100, bytes), "from the previous rank")
}

/// All-to-all of f32 rows (`hooks`: the doubling pair, else the plain call).
fn all_to_all(comm: &Comm, stream: &Arc<CudaStream>, hooks: Option<&Hooks<f32>>) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let m = 4096 + 4;
    let mine: Vec<f32> = (0..m * world).map(|i| val(rank, i, 1)).collect();
    let send = stream.clone_htod(&mine).map_err(err)?;
    let mut recv = stream.clone_htod(&vec![f32::NAN; m * world]).map_err(err)?;
    let factor = match hooks {
        Some(h) => {
            comm.all_to_all_hooked(h, &send, &mut recv, HookArgs::default(), stream)
                .map_err(err)?;
            2.0
        }
        None => {
            comm.all_to_all(&send, &mut recv, stream).map_err(err)?;
            1.0
        }
    };
    let expect: Vec<f32> = (0..world)
        .flat_map(|p| (0..m).map(move |j| factor * val(p, rank * m + j, 1)))
        .collect();
    let got = stream.clone_dtoh(&recv).map_err(err)?;
    compare(&f32_bytes(&got), &f32_bytes(&expect), "all-to-all")
}

/// All-to-all-v of rows of 8 f32: rank `r` sends `(r + p) % 3 + 1` rows to peer `p`.
fn all_to_all_v(comm: &Comm, stream: &Arc<CudaStream>) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let row = 8;
    let rows = |from: usize, to: usize| ((from + to) % 3 + 1) as u64;
    let sent: Vec<u64> = (0..world).map(|p| rows(rank, p)).collect();
    let total_out: u64 = sent.iter().sum();
    let mine: Vec<f32> = (0..total_out as usize * row).map(|i| val(rank, i, 2)).collect();
    let send = stream.clone_htod(&mine).map_err(err)?;
    let total_in: u64 = (0..world).map(|p| rows(p, rank)).sum();
    let mut recv = stream
        .clone_htod(&vec![f32::NAN; total_in as usize * row])
        .map_err(err)?;
    let mut counts = AllToAllVCounts::new(stream, world).map_err(err)?;
    stream
        .memcpy_htod(&sent, &mut counts.send_counts)
        .map_err(err)?;
    comm.all_to_all_v(&send, &mut recv, &mut counts, row, stream)
        .map_err(err)?;
    // From peer p: its rows for this rank, which start after its rows for ranks before.
    let mut expect = Vec::new();
    for p in 0..world {
        let first: u64 = (0..rank).map(|q| rows(p, q)).sum();
        let n = rows(p, rank);
        let start = first as usize * row;
        expect.extend((start..start + n as usize * row).map(|i| val(p, i, 2)));
    }
    let got = stream.clone_dtoh(&recv).map_err(err)?;
    compare(&f32_bytes(&got), &f32_bytes(&expect), "all-to-all-v")?;
    let recv_counts = stream.clone_dtoh(&counts.recv_counts).map_err(err)?;
    let want: Vec<u64> = (0..world).map(|p| rows(p, rank)).collect();
    match recv_counts == want {
        true => Ok(()),
        false => Err(format!("received counts {recv_counts:?}, expected {want:?}")),
    }
}

/// All-reduce (sum) of `count` elements of `T`, values made by `from` and read by `to`.
fn all_reduce<T: devcomm::Reducible + DeviceRepr + Copy>(
    comm: &Comm,
    stream: &Arc<CudaStream>,
    count: usize,
    from: fn(f32) -> T,
    to: fn(T) -> f32,
) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let mine: Vec<T> = (0..count).map(|i| from(val(rank, i, 3))).collect();
    let input = stream.clone_htod(&mine).map_err(err)?;
    let mut output: CudaSlice<T> = stream.clone_htod(&mine).map_err(err)?;
    comm.all_reduce(&input, &mut output, ReduceOp::Sum, stream)
        .map_err(err)?;
    let got: Vec<f32> = stream.clone_dtoh(&output).map_err(err)?.into_iter().map(to).collect();
    let expect: Vec<f32> = (0..count)
        .map(|i| (0..world).map(|r| val(r, i, 3)).sum())
        .collect();
    compare(&f32_bytes(&got), &f32_bytes(&expect), "sum")
}

fn reduce_scatter(comm: &Comm, stream: &Arc<CudaStream>) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let count = 8192 + 16;
    let mine: Vec<f32> = (0..count * world).map(|i| val(rank, i, 4)).collect();
    let input = stream.clone_htod(&mine).map_err(err)?;
    let mut output = stream.clone_htod(&vec![f32::NAN; count]).map_err(err)?;
    comm.reduce_scatter(&input, &mut output, ReduceOp::Sum, stream)
        .map_err(err)?;
    let expect: Vec<f32> = (0..count)
        .map(|i| (0..world).map(|r| val(r, rank * count + i, 4)).sum())
        .collect();
    let got = stream.clone_dtoh(&output).map_err(err)?;
    compare(&f32_bytes(&got), &f32_bytes(&expect), "this rank's shard")
}

fn all_gather(comm: &Comm, stream: &Arc<CudaStream>) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let count = 8192 + 16;
    let mine: Vec<f32> = (0..count).map(|i| val(rank, i, 5)).collect();
    let input = stream.clone_htod(&mine).map_err(err)?;
    let mut output = stream.clone_htod(&vec![f32::NAN; count * world]).map_err(err)?;
    comm.all_gather(&input, &mut output, stream).map_err(err)?;
    let expect: Vec<f32> = (0..world)
        .flat_map(|r| (0..count).map(move |i| val(r, i, 5)))
        .collect();
    let got = stream.clone_dtoh(&output).map_err(err)?;
    compare(&f32_bytes(&got), &f32_bytes(&expect), "gathered")
}

fn hooked_all_reduce(comm: &Comm, stream: &Arc<CudaStream>, twice: &Hooks<f32>) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let count = 64 * ROW;
    let mine: Vec<f32> = (0..count).map(|i| val(rank, i, 6)).collect();
    let input = stream.clone_htod(&mine).map_err(err)?;
    let mut output = stream.clone_htod(&vec![f32::NAN; count]).map_err(err)?;
    let args = HookArgs::rows(ROW);
    comm.all_reduce_hooked(twice, &input, &mut output, ReduceOp::Sum, &args, stream)
        .map_err(err)?;
    let expect: Vec<f32> = (0..count)
        .map(|i| 2.0 * (0..world).map(|r| val(r, i, 6)).sum::<f32>())
        .collect();
    let got = stream.clone_dtoh(&output).map_err(err)?;
    compare(&f32_bytes(&got), &f32_bytes(&expect), "twice the sum")
}

/// Zero-copy ring step into a registered buffer; `false` (nothing run but the collective
/// registration) when a ring peer is not on NVLink.
fn zero_copy(comm: &Comm, stream: &Arc<CudaStream>, cx: &Ctx) -> Result<bool, String> {
    let (next, prev) = ring(comm);
    let bytes = (1 << 20) + 5;
    // cuMemAlloc memory (cudarc's stream-ordered pool memory cannot be shared).
    let dst = devcomm::testing::DeviceBuffer::zeroed(comm.context(), bytes).map_err(err)?;
    devcomm::testing::synchronize(comm.context()).map_err(err)?;
    // Registration is collective: every rank registers, whatever its peers' links.
    // SAFETY: `dst` outlives `reg` (dropped in reverse order of declaration).
    let reg = unsafe { comm.register(dst.ptr(), bytes) }.map_err(err)?;
    let nvl = |p: usize| comm.topology().kind(p) == LinkKind::Nvl;
    let runs = comm.topology().kind(next) == comm.topology().kind(prev) && nvl(next);
    // Every rank must agree whether the ring runs, or a rank would wait for a peer that
    // skipped: agree through the store (any rank off NVLink skips the whole ring).
    let tag = format!("__devcomm_cli/cold/zc/{}", cx.seed);
    let all = comm
        .store()
        .all_gather(&tag, &[u8::from(runs)], comm.setup_timeout())
        .map_err(err)?;
    if all.iter().any(|v| v.first() != Some(&1)) {
        return Ok(false);
    }
    let src = stream
        .clone_htod(&cx.data_of(comm.rank(), 9_200, bytes))
        .map_err(err)?;
    let at = reg.range(0, bytes as u64);
    comm.sendrecv_registered(&src, next, at, at, prev, stream)
        .map_err(err)?;
    comm.synchronize(stream).map_err(err)?;
    let got = cx.read_ptr(dst.ptr(), bytes)?;
    reg.release().map_err(err)?;
    compare(&got, &cx.data_of(prev, 9_200, bytes), "from the previous rank")?;
    Ok(true)
}
