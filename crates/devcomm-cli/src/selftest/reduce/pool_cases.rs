//! `devcomm selftest` checks of the zero-copy reductions on memory-pool buffers: every
//! collective, in and out of place, with the buffers in the pool in every arrangement that
//! takes a zero-copy path, bit for bit against the host reduction in rank order and against
//! the same call on ordinary buffers; the epilogue on pool buffers; graph replays; and ranks
//! whose pool buffers lie at different offsets (refused on every rank, nothing written).

use devcomm::reduce::plan::{Algorithm, Collective};
use devcomm::{DataType, Error, HookArgs, PoolSlice, ReduceOp};
use half::{bf16, f16};

use super::cases::{expect, run_case, same_everywhere, Case, GUARD};
use super::reference::{data, first_diff, hash, reduce, HostNum};
use crate::selftest::harness::{fresh_comm_with, verified, Checked, Ctx, Outcome, Skip};

type Check = Result<String, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Which of a call's buffers lie in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    input: bool,
    output: bool,
}

const BOTH: Place = Place {
    input: true,
    output: true,
};

/// Collective: makes sure the pool has a free range of `bytes` (every rank's pool is in the
/// same state, so all decide alike).
fn ensure_room(comm: &devcomm::Comm, bytes: usize) -> Result<(), String> {
    if (comm.pool_usage().largest_free as usize) < bytes {
        comm.grow_pool(bytes.max(64 << 20)).map_err(err)?;
    }
    Ok(())
}

/// `v` as raw bytes.
fn bytes_of<N: HostNum>(v: &[N]) -> Vec<u8> {
    // SAFETY: N is a plain numeric type (Reducible: DeviceRepr + Copy) without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        .to_vec()
}

/// Raw bytes as `N`s.
fn from_bytes<N: HostNum>(b: &[u8]) -> Vec<N> {
    let size = std::mem::size_of::<N>();
    b.chunks_exact(size)
        // SAFETY: each chunk holds size_of::<N>() bytes of a plain numeric type.
        .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<N>()) })
        .collect()
}

/// A device buffer of the call: a pool slice, a place in adopted memory, or an ordinary
/// allocation, with its address.
enum Buf<'c> {
    Pool(PoolSlice<'c>),
    Adopted(u64),
    Plain {
        _alloc: cudarc::driver::CudaSlice<u8>,
        ptr: u64,
    },
}

impl Buf<'_> {
    fn ptr(&self) -> u64 {
        match self {
            Buf::Pool(s) => s.ptr(),
            Buf::Adopted(ptr) | Buf::Plain { ptr, .. } => *ptr,
        }
    }
}

/// Memory adopted into the pool (`Comm::pool_adopt`), handed out front to back: every rank
/// takes the same sizes in the same order, so its places are symmetric.
pub(super) struct Arena {
    pub(super) base: u64,
    pub(super) bytes: u64,
    pub(super) next: std::cell::Cell<u64>,
}

impl Arena {
    /// The next `bytes` (256-byte aligned), or an error when the arena is full.
    fn take(&self, bytes: u64) -> Result<u64, String> {
        let at = self.next.get();
        let end = at + bytes.max(1).next_multiple_of(256);
        if end > self.bytes {
            return Err(format!("the adopted arena of {} bytes is full", self.bytes));
        }
        self.next.set(end);
        Ok(self.base + at)
    }
}

/// A buffer holding `host`: in the pool (a slice of it, or a place in `arena`, adopted
/// memory) or not.
fn buffer<'c, N: HostNum>(
    cx: &'c Ctx,
    pooled: bool,
    arena: Option<&Arena>,
    host: &[N],
) -> Result<Buf<'c>, String> {
    let bytes = bytes_of(host);
    let src = cx.stream.clone_htod(&bytes).map_err(err)?;
    let buf = if pooled {
        match arena {
            Some(a) => Buf::Adopted(a.take(bytes.len() as u64)?),
            None => Buf::Pool(cx.comm.alloc(bytes.len().max(1) as u64).map_err(err)?),
        }
    } else {
        let b = cx.stream.alloc_zeros::<u8>(bytes.len().max(1)).map_err(err)?;
        let p = {
            use cudarc::driver::DevicePtr;
            b.device_ptr(&cx.stream).0
        };
        Buf::Plain { _alloc: b, ptr: p }
    };
    if !bytes.is_empty() {
        cx.copy_to_ptr(buf.ptr(), &src)?;
    }
    Ok(buf)
}

/// Enqueues the case's call on raw addresses (`out` is the output's first element).
fn call_raw(cx: &Ctx, c: &Case, dtype: DataType, input: u64, out: u64) -> Result<(), Error> {
    let (comm, s) = (&cx.comm, &cx.stream);
    let op = c.op.unwrap_or(ReduceOp::Sum);
    let (rank, es) = (comm.rank(), dtype.size_bytes() as u64);
    // In place: the input is the output (all-reduce) or this rank's shard of it.
    let shard = (rank * c.count) as u64 * es;
    let (i, o) = match (c.coll, c.in_place) {
        (_, false) => (input, out),
        (Collective::AllReduce, true) => (out, out),
        (Collective::ReduceScatter, true) => (out, out + shard),
        (Collective::AllGather, true) => (out + shard, out),
    };
    // SAFETY: `i` and `o` lie in live buffers of this rank sized for the case (the output
    // with GUARD elements on each side), synchronised before they are freed.
    unsafe {
        match c.coll {
            Collective::AllReduce => comm.all_reduce_raw(i, o, c.count, dtype, op, s),
            Collective::ReduceScatter => comm.reduce_scatter_raw(i, o, c.count, dtype, op, s),
            Collective::AllGather => comm.all_gather_raw(i, o, c.count, dtype, s),
        }
    }
}

/// The output region of a case (in place: the buffer the input lives in).
fn out_len(c: &Case, w: usize) -> usize {
    match c.coll {
        Collective::AllReduce => c.count,
        Collective::ReduceScatter if c.in_place => w * c.count,
        Collective::ReduceScatter => c.count,
        Collective::AllGather => w * c.count,
    }
}

/// Runs one case with its buffers placed as `at` says; checks the plan took `want` (when
/// given), the result against the host reference, the guards, and (all-reduce) that every rank
/// holds the same bits. Returns the output's hash. The pooled buffers are pool slices, or
/// places in `arena` (adopted memory) when given.
fn run_pool_case<N: HostNum>(
    cx: &Ctx,
    c: &Case,
    at: Place,
    want: Option<Algorithm>,
    arena: Option<&Arena>,
) -> Result<u64, String> {
    let w = cx.comm.world_size();
    let what = format!("{} ({at:?})", c.what::<N>());
    let e = expect::<N>(cx, c);
    let len = out_len(c, w);
    let mut host = vec![N::poison(); GUARD];
    host.extend_from_slice(&e.initial);
    host.extend(std::iter::repeat_n(N::poison(), GUARD));
    let es = std::mem::size_of::<N>();
    match arena {
        Some(a) => a.next.set(0),
        None => ensure_room(&cx.comm, (host.len() + e.input.len()) * es + 4096)?,
    }
    let input = buffer(cx, at.input && !c.in_place, arena, &e.input)?;
    let outbuf = buffer(cx, at.output || (c.in_place && at.input), arena, &host)?;
    let out = outbuf.ptr() + (GUARD * es) as u64;
    let (i, o) = (input.ptr(), out);
    if let Some(want) = want {
        let shard = (cx.comm.rank() * c.count * es) as u64;
        let (pi, po) = match (c.coll, c.in_place) {
            (_, false) => (i, o),
            (Collective::AllReduce, true) => (o, o),
            (Collective::ReduceScatter, true) => (o, o + shard),
            (Collective::AllGather, true) => (o + shard, o),
        };
        let plan = cx
            .comm
            .tuning().reduction_plan_at(c.coll, N::DTYPE, (pi, po, c.count as u64))
            .map_err(err)?;
        if plan.map(|p| p.algorithm) != Some(want) {
            return Err(format!("{what}: planned {plan:?}, the test expects {want:?}"));
        }
    }
    call_raw(cx, c, N::DTYPE, i, o).map_err(|x| format!("{what}: {x}"))?;
    cx.sync().map_err(|x| format!("{what}: {x}"))?;
    let got: Vec<N> = from_bytes(&cx.read_ptr(outbuf.ptr(), host.len() * es)?);
    let guard = vec![N::poison(); GUARD];
    if first_diff(&got[..GUARD], &guard).is_some()
        || first_diff(&got[GUARD + len..], &guard).is_some()
    {
        return Err(format!("{what}: a guard element was overwritten"));
    }
    if let Some((k, g, x)) = first_diff(&got[GUARD..GUARD + len], &e.want) {
        return Err(format!("{what}: element {k} is {g:?}, expected {x:?}"));
    }
    let h = hash(&got[GUARD..GUARD + len]);
    if c.coll == Collective::AllReduce {
        same_everywhere(cx, h, &format!("pool case {}", c.tag))
            .map_err(|x| format!("{what}: {x}"))?;
    }
    Ok(h)
}

/// The zero-copy algorithm a case takes with its buffers placed as `at` says, or `None` when
/// it stays staged.
fn zero_copy_algorithm(cx: &Ctx, c: &Case, es: usize, at: Place) -> Option<Algorithm> {
    if cx.comm.tuning().has_network_links() {
        // A job with network links runs every reduction on the network algorithm, wherever
        // its buffers lie (docs/NETWORK.md): pool buffers must give the same results there.
        return Some(Algorithm::Network);
    }
    let l = cx.comm.tuning().reduction_limits();
    let bytes = (c.count * es) as u64;
    if bytes <= l.zero_copy_min_bytes.min(l.one_shot_bytes) {
        return None; // the line one-shot serves these
    }
    let small = bytes <= l.zero_copy_one_shot_bytes;
    match c.coll {
        Collective::AllReduce if at.input && small && !c.in_place => Some(Algorithm::ZeroCopyOneShot),
        Collective::AllReduce if at.input && (at.output || c.in_place) => {
            Some(Algorithm::ZeroCopyTwoShot)
        }
        Collective::ReduceScatter if at.input => Some(Algorithm::ZeroCopyTwoShot),
        Collective::AllGather if at.output || (c.in_place && at.input) => {
            Some(Algorithm::ZeroCopyTwoShot)
        }
        _ => None,
    }
}

fn sizes_and_places<N: HostNum>(cx: &Ctx) -> Vec<(usize, Place)> {
    let es = std::mem::size_of::<N>();
    let l = cx.comm.tuning().reduction_limits();
    let zc_one = l.zero_copy_one_shot_bytes as usize / es;
    let zc_min = l.zero_copy_min_bytes.min(l.one_shot_bytes) as usize / es;
    let mut v = Vec::new();
    for count in [1usize, 1001, zc_min, zc_min + 1, zc_one, zc_one + 1, (3 << 20) / es + 5] {
        for at in [
            BOTH,
            Place {
                input: true,
                output: false,
            },
            Place {
                input: false,
                output: true,
            },
        ] {
            v.push((count, at));
        }
    }
    v
}

/// Every collective x in/out of place x pool arrangement of one type, at sizes around the
/// zero-copy one-shot's limit; each against the host reference and the ordinary buffers' call.
pub(super) fn pool_cases_of<N: HostNum>(
    cx: &Ctx,
    ops: &[ReduceOp],
    tag: &mut u64,
    arena: Option<&Arena>,
) -> Result<usize, String> {
    let es = std::mem::size_of::<N>();
    let mut n = 0;
    for (count, at) in sizes_and_places::<N>(cx) {
        for coll in [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
        ] {
            let coll_ops: Vec<Option<ReduceOp>> = match coll {
                Collective::AllGather => vec![None],
                _ => ops.iter().copied().map(Some).collect(),
            };
            for op in coll_ops {
                for in_place in [false, true] {
                    // In place there is one buffer: the output's arrangement is the input's.
                    if in_place && at.input != at.output {
                        continue;
                    }
                    *tag += 1;
                    let c = Case {
                        coll,
                        op,
                        count,
                        in_place,
                        tag: *tag,
                    };
                    let want = zero_copy_algorithm(cx, &c, es, at);
                    let pooled = run_pool_case::<N>(cx, &c, at, want, arena)?;
                    let plain = run_case::<N>(cx, &c)?;
                    if pooled != plain {
                        return Err(format!(
                            "{} ({at:?}): pool buffers gave other bits than ordinary buffers",
                            c.what::<N>()
                        ));
                    }
                    n += 1;
                }
            }
        }
    }
    Ok(n)
}

/// The zero-copy paths on every arrangement of pool buffers, bitwise against the host
/// reference and the staged paths on ordinary buffers.
pub(super) fn check_pool(cx: &Ctx) -> Check {
    let mut tag = 50_000u64;
    let all = ReduceOp::ALL;
    let n = pool_cases_of::<f32>(cx, &all, &mut tag, None)?
        + pool_cases_of::<bf16>(cx, &[ReduceOp::Sum, ReduceOp::Avg], &mut tag, None)?
        + pool_cases_of::<f16>(cx, &[ReduceOp::Max], &mut tag, None)?
        + pool_cases_of::<i32>(cx, &[ReduceOp::Sum], &mut tag, None)?
        + pool_cases_of::<u8>(cx, &[ReduceOp::Min], &mut tag, None)?
        + pool_cases_of::<f64>(cx, &[ReduceOp::Sum], &mut tag, None)?;
    Ok(format!(
        "{n} cases (f32 x 4 ops, bf16 sum/avg, f16 max, i32 sum, u8 min, f64 sum; all-reduce, \
         reduce-scatter, all-gather; in/out of place; input, output or both in the pool; 1 \
         element to 3 MiB, both sides of the line one-shot's and the zero-copy one-shot's limits): the planned zero-copy \
         algorithm, bitwise equal to the host reference and to ordinary buffers"
    ))
}

/// Batch invariance across the zero-copy switch: prefixes of one input, all-reduced on pool
/// buffers (one-shot, two-shot) and on ordinary buffers (staged), all equal the reference's
/// prefix.
pub(super) fn check_pool_prefixes(cx: &Ctx) -> Check {
    let (rank, w) = (cx.comm.rank(), cx.comm.world_size());
    let big = 5 << 20; // f32 elements
    let inputs: Vec<Vec<f32>> = (0..w).map(|p| data::<f32>(cx.seed, 51_000, p, big)).collect();
    let want = reduce(&inputs, ReduceOp::Sum, 0, big);
    ensure_room(&cx.comm, 3 * big * 4 + 4096)?;
    let mut kinds = std::collections::BTreeSet::new();
    for k in [1usize, 1000, 65_536, 300_001, 3 << 20, big] {
        for at in [BOTH, Place { input: false, output: false }] {
            for in_place in [false, true] {
                let x = buffer(cx, at.input && !in_place, None, &inputs[rank][..k])?;
                let o = buffer(cx, at.output || (in_place && at.input), None, &inputs[rank][..k])?;
                let i = if in_place { o.ptr() } else { x.ptr() };
                let plan = cx
                    .comm
                    .tuning().reduction_plan_at(Collective::AllReduce, DataType::F32, (i, o.ptr(), k as u64))
                    .map_err(err)?;
                if let Some(p) = plan {
                    kinds.insert(p.algorithm.name());
                }
                // SAFETY: both buffers hold k f32 and outlive the synchronisation below.
                unsafe {
                    cx.comm
                        .all_reduce_raw(i, o.ptr(), k, DataType::F32, ReduceOp::Sum, &cx.stream)
                }
                .map_err(err)?;
                cx.sync()?;
                let got: Vec<f32> = from_bytes(&cx.read_ptr(o.ptr(), k * 4)?);
                if let Some((j, g, x)) = first_diff(&got, &want[..k]) {
                    return Err(format!(
                        "prefix of {k} ({at:?}, in place {in_place}): element {j} is {g}, the \
                         whole call's reference is {x}"
                    ));
                }
            }
        }
    }
    Ok(format!(
        "prefixes of 1 to 5M f32 in and out of place, pool and ordinary buffers, equal the whole \
         call's reference; algorithms: {}",
        kinds.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// The doubling epilogue on pool buffers (zero-copy one-shot and two-shot) against ordinary
/// buffers (staged two-shot): the same bits.
pub(super) fn check_pool_hooked(cx: &Ctx) -> Check {
    let (rank, w) = (cx.comm.rank(), cx.comm.world_size());
    let hooks = crate::selftest::harness::doubling_epilogue();
    let row = 256usize;
    // The largest call the zero-copy path takes hooked: each rank's part of the rows fills
    // half the window's two-shot area, where the hook runs (a part placed at its offset in the
    // whole buffer would run past the area on every rank but the first).
    let largest = w * (cx.comm.tuning().reduction_limits().chunk_bytes as usize / (row * 4));
    let mut done = Vec::new();
    for rows in [1usize, 7, 64, 1024, largest] {
        let n = rows * row;
        let inputs: Vec<Vec<f32>> = (0..w).map(|p| data::<f32>(cx.seed, 52_000 + rows as u64, p, n)).collect();
        ensure_room(&cx.comm, 3 * n * 4 + 4096)?;
        let mut results = Vec::new();
        let zeros = vec![0f32; n];
        for (pooled, in_place) in [(false, false), (true, false), (true, true)] {
            let x = buffer(cx, pooled && !in_place, None, &inputs[rank])?;
            let o = buffer(cx, pooled, None, if in_place { &inputs[rank] } else { &zeros })?;
            let i = if in_place { o.ptr() } else { x.ptr() };
            let args = HookArgs::rows(row);
            // SAFETY: both buffers hold n f32 and outlive the synchronisation below.
            unsafe {
                cx.comm.all_reduce_hooked_raw(
                    hooks.raw(),
                    i,
                    o.ptr(),
                    n,
                    DataType::F32,
                    ReduceOp::Sum,
                    &args,
                    &cx.stream,
                )
            }
            .map_err(err)?;
            cx.sync()?;
            results.push(from_bytes::<f32>(&cx.read_ptr(o.ptr(), n * 4)?));
        }
        let twice: Vec<f32> = reduce(&inputs, ReduceOp::Sum, 0, n).iter().map(|v| v * 2.0).collect();
        for (k, r) in results.iter().enumerate() {
            if let Some((j, g, x)) = first_diff(r, &twice) {
                return Err(format!(
                    "{rows} rows, variant {k} (0 ordinary, 1 pool, 2 pool in place): element \
                     {j} is {g}, expected {x}"
                ));
            }
        }
        done.push(rows.to_string());
    }
    Ok(format!(
        "doubling epilogue, rows of {row}, {} rows: ordinary, pool, pool in place all equal 2 x \
         the rank-order sum",
        done.join("/")
    ))
}

/// `replays` (at most [`POOL_GRAPH_REPLAYS`]) replays of a captured graph of zero-copy calls (in-place all-reduce, reduce-scatter,
/// all-gather on pool slices), with fresh data before each, every result verified.
pub(super) fn check_pool_graph(cx: &Ctx, replays: usize) -> Check {
    // Each replay is checked against a host reduction of every rank's 12 MiB: at most
    // POOL_GRAPH_REPLAYS of them (with the default --replays of 1000 this check kept the
    // 4-rank `reduce` group past a 280 s limit on 4 H200s).
    let replays = replays.min(POOL_GRAPH_REPLAYS);
    let (rank, w) = (cx.comm.rank(), cx.comm.world_size());
    let n = 98_304usize; // bf16 elements, 192 KiB: the one-shot and the two-shot both appear below
    ensure_room(&cx.comm, (70 + 2 * w) * n * 2 + 8192)?;
    let ar = cx.comm.alloc((n * 2) as u64).map_err(err)?;
    let ar_big = cx.comm.alloc((64 * n * 2) as u64).map_err(err)?;
    let ar_out = cx.comm.alloc((n * 2) as u64).map_err(err)?;
    let rs_in = cx.comm.alloc((w * n * 2) as u64).map_err(err)?;
    let rs_out = cx.stream.alloc_zeros::<u8>(n * 2).map_err(err)?;
    let ag_out = cx.comm.alloc((w * n * 2) as u64).map_err(err)?;
    let rs_ptr = {
        use cudarc::driver::DevicePtr;
        rs_out.device_ptr(&cx.stream).0
    };
    let s = &cx.stream;
    let sum = ReduceOp::Sum;
    let bf = DataType::BF16;
    let graph = cx.capture(|| -> Result<(), Error> {
        // SAFETY: every buffer is live until after the replays (synchronised) and sized for
        // its call.
        unsafe {
            cx.comm.all_reduce_raw(ar.ptr(), ar_out.ptr(), n, bf, sum, s)?;
            cx.comm.all_reduce_raw(ar_big.ptr(), ar_big.ptr(), 64 * n, bf, sum, s)?;
            cx.comm.reduce_scatter_raw(rs_in.ptr(), rs_ptr, n, bf, sum, s)?;
            cx.comm.all_gather_raw(ar_out.ptr(), ag_out.ptr(), n, bf, s)
        }
    })?;
    for k in 0..replays {
        let t = 53_000 + 8 * k as u64;
        let x: Vec<Vec<bf16>> = (0..w).map(|p| data::<bf16>(cx.seed, t, p, n)).collect();
        let y: Vec<Vec<bf16>> = (0..w).map(|p| data::<bf16>(cx.seed, t + 1, p, 64 * n)).collect();
        let z: Vec<Vec<bf16>> = (0..w).map(|p| data::<bf16>(cx.seed, t + 2, p, w * n)).collect();
        for (buf, host) in [(ar.ptr(), &x[rank]), (ar_big.ptr(), &y[rank]), (rs_in.ptr(), &z[rank])] {
            cx.copy_to_ptr(buf, &cx.stream.clone_htod(&bytes_of(host)).map_err(err)?)?;
        }
        cx.host_barrier()?;
        graph.launch().map_err(err)?;
        cx.sync()?;
        let ar_want = reduce(&x, sum, 0, n);
        let checks: [(&str, u64, Vec<bf16>); 4] = [
            ("all-reduce", ar_out.ptr(), ar_want.clone()),
            ("all-reduce in place", ar_big.ptr(), reduce(&y, sum, 0, 64 * n)),
            ("reduce-scatter", rs_ptr, reduce(&z, sum, rank * n, n)),
            ("all-gather", ag_out.ptr(), std::iter::repeat_n(ar_want, w).flatten().collect()),
        ];
        for (what, ptr, want) in checks {
            let got: Vec<bf16> = from_bytes(&cx.read_ptr(ptr, want.len() * 2)?);
            if let Some((j, g, x)) = first_diff(&got, &want) {
                return Err(format!("replay {k}, {what}: element {j} is {g}, expected {x}"));
            }
        }
        cx.host_barrier()?;
    }
    Ok(format!(
        "{replays} replays of a graph of 4 zero-copy calls on pool slices (bf16 all-reduce \
         one-shot 192 KiB, in place two-shot 12 MiB, reduce-scatter, all-gather), fresh data, \
         each verified"
    ))
}

/// The most replays `reduce_pool_graph` verifies.
const POOL_GRAPH_REPLAYS: usize = 100;

/// Ranks whose pool buffers lie at different offsets: every rank's call fails with the
/// layout named, nothing is written into any output; a fresh communicator is used (the
/// failure aborts it).
pub(super) fn check_pool_asymmetric(cx: &Ctx) -> Checked {
    if cx.comm.tuning().has_network_links() {
        return Ok(Outcome::Skip(Skip::Links(
            "a job with network links reduces through the network algorithm, which reads no \
             peer's pool buffer in place: their places need not agree"
                .into(),
        )));
    }
    verified(asymmetric_refused(cx))
}

fn asymmetric_refused(cx: &Ctx) -> Check {
    let mut n = 0;
    let fresh = fresh_comm_with(cx, "reduce_pool_asymmetric", &mut n, |b| {
        b.device_timeout(std::time::Duration::from_secs(5))
    })?;
    let comm = &fresh.comm;
    comm.grow_pool(16 << 20).map_err(err)?;
    // Rank 0 takes 256 bytes first: its buffers lie 256 bytes further than everyone else's.
    let _skew = (comm.rank() == 0)
        .then(|| comm.alloc(256))
        .transpose()
        .map_err(err)?;
    // 1 MiB of f32: above the line one-shot's share of pool calls, a zero-copy path.
    let count = 256usize << 10;
    let input = comm.alloc((count * 4) as u64).map_err(err)?;
    let output = comm.alloc((count * 4) as u64).map_err(err)?;
    let poison = vec![0xa5u8; count * 4];
    let src = fresh.stream.clone_htod(&poison).map_err(err)?;
    {
        use cudarc::driver::DevicePtr;
        let (sp, _g) = src.device_ptr(&fresh.stream);
        // SAFETY: both hold count f32; waited for below.
        unsafe {
            devcomm::testing::memcpy_dtod_async(output.ptr(), sp, count * 4, &fresh.stream)
        }
        .map_err(err)?;
    }
    comm.synchronize(&fresh.stream).map_err(err)?;
    // SAFETY: both slices hold count f32 and live past the synchronisation.
    let launched = unsafe {
        comm.all_reduce_raw(input.ptr(), output.ptr(), count, DataType::F32, ReduceOp::Sum, &fresh.stream)
    };
    let outcome = launched.and_then(|()| comm.synchronize(&fresh.stream));
    let detail = match outcome {
        Err(e @ Error::CallMismatch { .. }) if e.to_string().contains("place of its pool buffers") => {
            e.to_string()
        }
        // A peer's abort may reach a rank before its own comparison fails.
        Err(Error::Aborted { .. }) => "aborted by a peer's mismatch".into(),
        Err(other) => return Err(format!("expected a pool-layout CallMismatch, got: {other}")),
        Ok(()) => return Err("the call on asymmetric pool buffers succeeded".into()),
    };
    let mut back = fresh.stream.alloc_zeros::<u8>(count * 4).map_err(err)?;
    {
        use cudarc::driver::DevicePtrMut;
        let (bp, _g) = back.device_ptr_mut(&fresh.stream);
        // SAFETY: both hold count f32; clone_dtoh below waits on the same stream.
        unsafe { devcomm::testing::memcpy_dtod_async(bp, output.ptr(), count * 4, &fresh.stream) }
            .map_err(err)?;
    }
    let host = fresh.stream.clone_dtoh(&back).map_err(err)?;
    if host != poison {
        return Err("the refused call wrote into its output".into());
    }
    Ok(format!("refused on rank {}: {detail}; output untouched", comm.rank()))
}
