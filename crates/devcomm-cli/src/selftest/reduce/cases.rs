//! `devcomm selftest` checks of the reductions (all-reduce, reduce-scatter, all-gather): every
//! type x operation, in place and out of place, at sizes around every algorithm switch and up
//! to 256 MiB, on fresh data that every rank can regenerate, outputs poisoned and guarded,
//! results compared bit for bit with a host reduction in rank order and across ranks; the
//! argument errors; the RMSNorm example (at its own row group and at the whole block).

use cudarc::driver::CudaSlice;
use devcomm::reduce::plan::{Algorithm, Collective};
use devcomm::{DataType, Error, HookArgs, Hooks, ReduceOp};
use half::{bf16, f16};

use super::reference::{data, first_diff, hash, reduce, HostNum};
use crate::examples::all_reduce_rmsnorm as rmsnorm_example;
use crate::selftest::harness::Ctx;


type Check = Result<String, String>;
/// Guard elements on each side of every output.
pub(super) const GUARD: usize = 64;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// One call of a case.
#[derive(Debug, Clone, Copy)]
pub(super) struct Case {
    pub coll: Collective,
    /// `None` for all-gather.
    pub op: Option<ReduceOp>,
    /// As the methods name it: all-reduce elements, reduce-scatter output, all-gather input.
    pub count: usize,
    pub in_place: bool,
    pub tag: u64,
}

impl Case {
    pub(super) fn what<N: HostNum>(&self) -> String {
        format!(
            "{} {} {}{} of {} elements",
            self.coll.name(),
            N::DTYPE,
            self.op.map_or("", |o| o.name()),
            if self.in_place { " in place" } else { "" },
            self.count
        )
    }
}

/// Enqueues the case's call on the typed buffers.
fn call<N: HostNum>(
    cx: &Ctx,
    c: &Case,
    input: &CudaSlice<N>,
    buf: &mut CudaSlice<N>,
    len: usize,
) -> Result<(), Error> {
    let (comm, s) = (&cx.comm, &cx.stream);
    let mut out = buf.slice_mut(GUARD..GUARD + len);
    let op = c.op.unwrap_or(ReduceOp::Sum);
    match (c.coll, c.in_place) {
        (Collective::AllReduce, false) => comm.all_reduce(input, &mut out, op, s),
        (Collective::AllReduce, true) => comm.all_reduce_in_place(&mut out, op, s),
        (Collective::ReduceScatter, false) => comm.reduce_scatter(input, &mut out, op, s),
        (Collective::ReduceScatter, true) => comm.reduce_scatter_in_place(&mut out, op, s),
        (Collective::AllGather, false) => comm.all_gather(input, &mut out, s),
        (Collective::AllGather, true) => comm.all_gather_in_place(&mut out, s),
    }
}

/// The buffer a case's call writes (`GUARD` poison on each side) and what it must hold after.
pub(super) struct Expect<N> {
    pub initial: Vec<N>,
    pub want: Vec<N>,
    pub input: Vec<N>,
}

pub(super) fn expect<N: HostNum>(cx: &Ctx, c: &Case) -> Expect<N> {
    let (rank, w, n) = (cx.comm.rank(), cx.comm.world_size(), c.count);
    let in_len = if c.coll == Collective::ReduceScatter {
        w * n
    } else {
        n
    };
    let inputs: Vec<Vec<N>> = (0..w)
        .map(|p| data::<N>(cx.seed, c.tag, p, in_len))
        .collect();
    let op = c.op.unwrap_or(ReduceOp::Sum);
    let result = match c.coll {
        Collective::AllReduce => reduce(&inputs, op, 0, n),
        Collective::ReduceScatter => reduce(&inputs, op, rank * n, n),
        Collective::AllGather => inputs.concat(),
    };
    let mine = inputs[rank].clone();
    let (initial, want) = match (c.coll, c.in_place) {
        (_, false) => (vec![N::poison(); result.len()], result),
        (Collective::AllReduce, true) => (mine.clone(), result),
        (Collective::ReduceScatter, true) => {
            let mut after = mine.clone();
            after[rank * n..(rank + 1) * n].copy_from_slice(&result);
            (mine.clone(), after)
        }
        (Collective::AllGather, true) => {
            let mut before = vec![N::poison(); w * n];
            before[rank * n..(rank + 1) * n].copy_from_slice(&mine);
            (before, result)
        }
    };
    Expect {
        initial,
        want,
        input: mine,
    }
}

/// Runs one case and checks the result, the guards and (all-reduce) that every rank holds the
/// same bits. Returns the output's hash.
pub(super) fn run_case<N: HostNum>(cx: &Ctx, c: &Case) -> Result<u64, String> {
    let e = expect::<N>(cx, c);
    let len = e.want.len();
    let mut host = vec![N::poison(); GUARD];
    host.extend_from_slice(&e.initial);
    host.extend(std::iter::repeat_n(N::poison(), GUARD));
    let input = cx.stream.clone_htod(&e.input).map_err(err)?;
    let mut buf = cx.stream.clone_htod(&host).map_err(err)?;
    call(cx, c, &input, &mut buf, len).map_err(|x| format!("{}: {x}", c.what::<N>()))?;
    cx.sync().map_err(|x| format!("{}: {x}", c.what::<N>()))?;
    let got = cx.stream.clone_dtoh(&buf).map_err(err)?;
    let guard = vec![N::poison(); GUARD];
    if first_diff(&got[..GUARD], &guard).is_some()
        || first_diff(&got[GUARD + len..], &guard).is_some()
    {
        return Err(format!(
            "{}: a guard element was overwritten",
            c.what::<N>()
        ));
    }
    if let Some((i, g, w)) = first_diff(&got[GUARD..GUARD + len], &e.want) {
        return Err(format!(
            "{}: element {i} is {g:?}, expected {w:?}",
            c.what::<N>()
        ));
    }
    let h = hash(&got[GUARD..GUARD + len]);
    if c.coll == Collective::AllReduce {
        same_everywhere(cx, h, &format!("case {}", c.tag))
            .map_err(|x| format!("{}: {x}", c.what::<N>()))?;
    }
    Ok(h)
}

/// Fails unless every rank passed the same `value` under `tag`.
pub(super) fn same_everywhere(cx: &Ctx, value: u64, tag: &str) -> Result<(), String> {
    let all = cx
        .comm
        .store()
        .all_gather(
            &format!("__devcomm_cli/reduce/{tag}"),
            &value.to_le_bytes(),
            cx.comm.setup_timeout(),
        )
        .map_err(err)?;
    match all.iter().position(|v| v[..] != value.to_le_bytes()[..]) {
        Some(r) => Err(format!(
            "rank {r}'s result differs from rank {}'s",
            cx.comm.rank()
        )),
        None => Ok(()),
    }
}

/// Dispatches a generic function on a data type.
macro_rules! by_type {
    ($dtype:expr, $f:ident ( $($a:expr),* )) => {
        match $dtype {
            DataType::F32 => $f::<f32>($($a),*),
            DataType::F16 => $f::<f16>($($a),*),
            DataType::BF16 => $f::<bf16>($($a),*),
            DataType::F64 => $f::<f64>($($a),*),
            DataType::I32 => $f::<i32>($($a),*),
            DataType::I64 => $f::<i64>($($a),*),
            DataType::U8 => $f::<u8>($($a),*),
            other => Err(format!("no self-test for {other}")),
        }
    };
}

/// The counts of a collective and type: 0, 1, odd, both sides of the line one-shot's limit,
/// of the window one-shot's, of the window's size and of the single-round two-shot's (of this
/// communicator's window), and with network links of the network path's round, each with the
/// algorithm the plan must take there, so that the sizes really straddle every switch.
fn sizes(cx: &Ctx, coll: Collective, dtype: DataType) -> Vec<(usize, Option<Algorithm>)> {
    let (w, es) = (cx.comm.world_size(), dtype.size_bytes());
    let limits = cx.comm.tuning().reduction_limits();
    // All-reduce: the two-shot on lines above the one-shot (which yields to it from
    // LINE_TWO_SHOT_FROM_BYTES), up to its limit.
    let lines = match coll {
        Collective::AllReduce => limits.line_two_shot_bytes as usize / es,
        _ => 0,
    };
    let one = limits.one_shot_bytes as usize / es;
    let one = match lines {
        0 => one,
        _ => one.min(devcomm::reduce::plan::LINE_TWO_SHOT_FROM_BYTES as usize / es),
    };
    let vec = 16 / es;
    // All-reduces on 2 ranks push their results (Plan::pushed): a round's result slots take
    // half the window's half, so a round holds half the elements. (On more ranks only calls
    // of 8 rounds or more push, far beyond these sizes.)
    let halves = if coll == Collective::AllReduce && w == 2 { 2 } else { 1 };
    let per_shard = limits.chunk_bytes as usize / w / es / halves / vec * vec;
    let round = if coll == Collective::AllReduce {
        per_shard * w
    } else {
        per_shard
    };
    // A job with network links runs every reduction as all-to-alls in rounds of the network
    // scratch (docs/NETWORK.md): its sizes straddle that round as well.
    let network = cx.comm.tuning().has_network_links();
    let expect = |n: usize| match n {
        0 => None,
        _ if network => Some(Algorithm::Network),
        n if n <= one => Some(Algorithm::OneShot),
        n if n <= lines => Some(Algorithm::LineTwoShot),
        n if n <= round => Some(Algorithm::TwoShot),
        _ => Some(Algorithm::Pipelined),
    };
    let mut counts = vec![
        0,
        1,
        3,
        1001,
        one.saturating_sub(1),
        one,
        one + 1,
        (one + lines) / 2 + 3,
        lines,
        lines + 1,
        lines + 777,
        round,
        round + 1,
    ];
    let net_round = match network {
        true => cx.comm.tuning().reduction_plan(coll, dtype, 1).ok().flatten(),
        false => None,
    }
    .map(|p| match coll {
        Collective::AllReduce => p.chunk as usize * w,
        _ => p.chunk as usize,
    });
    if let Some(r) = net_round {
        counts.extend([r, r + 1]);
    }
    if matches!(dtype, DataType::F32 | DataType::BF16) {
        counts.push(2 * net_round.unwrap_or(round) + 777);
    }
    counts.sort_unstable();
    counts.dedup();
    counts.into_iter().map(|n| (n, expect(n))).collect()
}

/// Every type x operation x place at every size of [`sizes`].
pub(super) fn check_sizes(cx: &Ctx) -> Check {
    let mut cases = 0usize;
    let mut tag = 10_000u64;
    for dtype in DataType::ALL {
        for coll in [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
        ] {
            let ops: Vec<Option<ReduceOp>> = if coll == Collective::AllGather {
                vec![None]
            } else {
                ReduceOp::ALL.into_iter().map(Some).collect()
            };
            for (count, algo) in sizes(cx, coll, dtype) {
                let plan = cx
                    .comm
                    .tuning().reduction_plan(coll, dtype, count as u64)
                    .map_err(err)?;
                if let (Some(want), Some(p)) = (algo, plan) {
                    if p.algorithm != want {
                        return Err(format!(
                            "{} {dtype} of {count}: planned {:?}, the test expects {want:?}",
                            coll.name(),
                            p.algorithm
                        ));
                    }
                }
                // At and past the two-shot limit (tens of MiB per call) one operation and one
                // place per size, in turn: the operations and places differ only in
                // instantiations that the smaller sizes cover, and the host reference of every
                // combination at these sizes took minutes of the self-test.
                let large = matches!(algo, Some(Algorithm::Pipelined))
                    || count as u64 * dtype.size_bytes() as u64 >= (1 << 20);
                for (i, &op) in ops.iter().enumerate() {
                    for in_place in [false, true] {
                        if large && 2 * i + usize::from(in_place) != count % (2 * ops.len()) {
                            continue;
                        }
                        tag += 1;
                        let c = Case {
                            coll,
                            op,
                            count,
                            in_place,
                            tag,
                        };
                        by_type!(dtype, run_case(cx, &c))?;
                        cases += 1;
                    }
                }
            }
        }
    }
    Ok(format!(
        "{cases} cases: 7 types x (all-reduce, reduce-scatter x 4 ops, all-gather) x in/out of \
         place (from 1 MiB one operation and place per size, in turn), 0 to 2 rounds past the \
         two-shot limit; bitwise equal to the host reference"
    ))
}

/// Large calls (256 MiB buffers on 2 ranks, 64 MiB on more) and batch invariance: the prefix
/// of a large all-reduce equals the all-reduce of the prefix alone.
pub(super) fn check_large(cx: &Ctx) -> Check {
    let w = cx.comm.world_size();
    let bytes: usize = if w <= 2 { 256 << 20 } else { 64 << 20 };
    let mut t = 20_000u64;
    let mut next = || {
        t += 1;
        t
    };
    let big = |es: usize| bytes / es;
    let ar = Collective::AllReduce;
    let sum = Some(ReduceOp::Sum);
    let h_big = run_case::<f32>(
        cx,
        &Case {
            coll: ar,
            op: sum,
            count: big(4),
            in_place: false,
            tag: 1,
        },
    )?;
    run_case::<bf16>(
        cx,
        &Case {
            coll: ar,
            op: Some(ReduceOp::Avg),
            count: big(2) + 3,
            in_place: true,
            tag: next(),
        },
    )?;
    run_case::<f32>(
        cx,
        &Case {
            coll: Collective::ReduceScatter,
            op: Some(ReduceOp::Max),
            count: big(4) / w,
            in_place: false,
            tag: next(),
        },
    )?;
    run_case::<u8>(
        cx,
        &Case {
            coll: Collective::AllGather,
            op: None,
            count: big(1) / w + 1,
            in_place: true,
            tag: next(),
        },
    )?;
    // Batch invariance: prefixes of case 1's inputs (the same data) alone, on every algorithm,
    // against the prefix of the reference that the large call matched bit for bit.
    for k in [1usize, 1000, 300_001, 3 << 20] {
        let (input, mut out) = (
            cx.stream
                .clone_htod(&data::<f32>(cx.seed, 1, cx.comm.rank(), k))
                .map_err(err)?,
            cx.stream.alloc_zeros::<f32>(k).map_err(err)?,
        );
        cx.comm
            .all_reduce(&input, &mut out, ReduceOp::Sum, &cx.stream)
            .map_err(err)?;
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&out).map_err(err)?;
        let inputs: Vec<Vec<f32>> = (0..w).map(|p| data::<f32>(cx.seed, 1, p, k)).collect();
        if let Some((i, g, x)) = first_diff(&got, &reduce(&inputs, ReduceOp::Sum, 0, k)) {
            return Err(format!(
                "prefix of {k}: element {i} is {g}, the large call's is {x}"
            ));
        }
    }
    Ok(format!(
        "{} MiB: f32 sum, bf16 avg in place, reduce-scatter max, all-gather in place; prefixes of \
         1 to 3M elements equal the large call's (hash {h_big:016x}, same on {w} ranks)",
        bytes >> 20
    ))
}

/// Bad arguments give `InvalidArgument` on every rank, and the communicator stays usable.
pub(super) fn check_args(cx: &Ctx) -> Check {
    let (comm, s, w) = (&cx.comm, &cx.stream, cx.comm.world_size());
    let a = s.alloc_zeros::<f32>(12 * w).map_err(err)?;
    let mut b = s.alloc_zeros::<f32>(12 * w + 1).map_err(err)?;
    let (pa, pb) = {
        use cudarc::driver::DevicePtr;
        (a.device_ptr(s).0, b.device_ptr(s).0)
    };
    let hooks = Hooks::<f64, f64>::new("Wrong", "struct Wrong { using T = double; };");
    let f32_hooks = Hooks::<f32>::new("NoRows", "struct NoRows { using T = float; };");
    let sum = ReduceOp::Sum;
    let mut refused = Vec::new();
    let mut expect_invalid = |what: &str, r: Result<(), Error>| -> Result<(), String> {
        match r {
            Err(Error::InvalidArgument { .. }) => {
                refused.push(what.to_owned());
                Ok(())
            }
            other => Err(format!("{what}: expected InvalidArgument, got {other:?}")),
        }
    };
    expect_invalid("all_reduce lengths", comm.all_reduce(&a, &mut b, sum, s))?;
    expect_invalid(
        "reduce_scatter lengths",
        comm.reduce_scatter(&a, &mut b.slice_mut(..13), sum, s),
    )?;
    expect_invalid(
        "all_gather lengths",
        comm.all_gather(&a.slice(..12), &mut b, s),
    )?;
    if w > 1 {
        expect_invalid(
            "reduce_scatter_in_place length",
            comm.reduce_scatter_in_place(&mut b, sum, s),
        )?;
    }
    // SAFETY: pa and pb address live buffers of 12 w and 12 w + 1 f32 on this stream; every
    // call below is refused before anything is launched.
    unsafe {
        expect_invalid(
            "overlap",
            comm.all_reduce_raw(pa, pa + 4, 8, DataType::F32, sum, s),
        )?;
        expect_invalid(
            "misaligned",
            comm.all_reduce_raw(pa + 2, pb, 8, DataType::F32, sum, s),
        )?;
        expect_invalid("null", comm.all_reduce_raw(0, pb, 8, DataType::F32, sum, s))?;
        expect_invalid(
            "reduce_scatter overlap",
            comm.reduce_scatter_raw(pa, pa + 4, 8, DataType::F32, sum, s),
        )?;
    }
    let mut out = s.alloc_zeros::<f32>(12 * w).map_err(err)?;
    let args = HookArgs::default();
    expect_invalid(
        "row_len None",
        comm.all_reduce_hooked(&f32_hooks, &a, &mut out, sum, &args, s),
    )?;
    // Typed calls cannot take hooks of another element type (a compile error); the raw form,
    // whose element type is a run-time value, checks it.
    let args = HookArgs::rows(5);
    // SAFETY: pa and pb address 12 w and 12 w + 1 f32 on this stream; the call is refused
    // before anything is launched.
    expect_invalid("hook element size", unsafe {
        comm.all_reduce_hooked_raw(hooks.raw(), pa, pb, 12 * w, DataType::F32, sum, &args, s)
    })?;
    // Still usable.
    let c = Case {
        coll: Collective::AllReduce,
        op: Some(sum),
        count: 777,
        in_place: false,
        tag: 30_001,
    };
    run_case::<f32>(cx, &c)?;
    Ok(format!(
        "refused: {}; then a call succeeds",
        refused.join(", ")
    ))
}

/// The RMSNorm example against its host reference, bit for bit: at the example's row group
/// (128 lanes) and with the whole block on a row (512 lanes, the hook's `kRowThreads` set in its
/// source), so that the widest row group and its `row_sum` are checked on every algorithm.
pub(super) fn check_rmsnorm(cx: &Ctx) -> Check {
    use rmsnorm_example::{RMSNORM_HOOKS, RMSNORM_ROW_THREADS};
    let w = cx.comm.world_size();
    // (rows, hidden, the algorithm on NVLink): the two-shot; fewer rows than ranks (on the
    // two-shot some ranks would reduce no row); a decode step's rows of 7168 (one line a 120
    // bytes of each row, on the one-shot up to 4 ranks).
    let one_shot = w <= 4;
    let cases = [
        (257, 4096, false),
        (w.max(2) - 1, 1000, true),
        (16, 7168, one_shot),
    ];
    let network = cx.comm.tuning().has_network_links();
    let limits = cx.comm.tuning().reduction_limits();
    let wide = crate::selftest::harness::with_row_threads(RMSNORM_HOOKS, 512)?;
    let mut done = Vec::new();
    for (source, lanes) in [(RMSNORM_HOOKS, RMSNORM_ROW_THREADS), (wide.as_str(), 512)] {
        for (k, (rows, hidden, want_one_shot)) in cases.into_iter().enumerate() {
            let shape = devcomm::reduce::plan::Shape {
                collective: Collective::AllReduce,
                count: (rows * hidden) as u64,
                elem_bytes: 4,
                world: w,
                row_len: Some(hidden as u64),
            };
            let algorithm = devcomm::reduce::plan::plan(&shape, &limits)
                .map_err(|e| format!("{rows} x {hidden}: {e}"))?
                .algorithm;
            if !network && (algorithm == Algorithm::OneShot) != want_one_shot {
                return Err(format!(
                    "{rows} rows x {hidden}: planned {algorithm:?}, the test expects the \
                     one-shot: {want_one_shot}"
                ));
            }
            let seed = cx.seed ^ k as u64;
            let r = rmsnorm_example::run_rmsnorm(
                &cx.comm,
                &cx.stream,
                (rows, hidden),
                seed,
                (source, lanes),
            )?;
            let how = if network { "network" } else { algorithm.name() };
            done.push(format!("{r} ({how})"));
        }
    }
    Ok(done.join("; "))
}

