//! `devcomm selftest` stress checks of the reductions: CUDA-graph replays with fresh data, and
//! long runs of back-to-back calls mixing all-reduce, reduce-scatter and all-gather with
//! send/recv and all-to-all on one stream.

use cudarc::driver::CudaSlice;
use devcomm::ReduceOp;
use half::bf16;

use super::reference::{data, first_diff, reduce, HostNum};
use crate::selftest::harness::Ctx;

type Check = Result<String, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// One operation of the mix: device input sets, the output, and how to make the reference.
struct Op<N: HostNum> {
    name: &'static str,
    inputs: Vec<CudaSlice<N>>,
    output: CudaSlice<N>,
    /// References, one per input set.
    want: Vec<Vec<N>>,
}

/// Rank `p`'s input of set `set` for operation `k` (`len` elements).
fn input<N: HostNum>(cx: &Ctx, k: u64, set: u64, p: usize, len: usize) -> Vec<N> {
    data::<N>(cx.seed, 40_000 + 16 * k + set, p, len)
}

/// The inputs and references of the mix's reductions on `sets` input sets.
fn reduction_op<N: HostNum>(
    cx: &Ctx,
    name: &'static str,
    k: u64,
    (in_len, out_len): (usize, usize),
    sets: u64,
    reference: impl Fn(&[Vec<N>]) -> Vec<N>,
) -> Result<Op<N>, String> {
    let (rank, w) = (cx.comm.rank(), cx.comm.world_size());
    let mut inputs = Vec::new();
    let mut want = Vec::new();
    for set in 0..sets {
        let all: Vec<Vec<N>> = (0..w).map(|p| input::<N>(cx, k, set, p, in_len)).collect();
        inputs.push(cx.stream.clone_htod(&all[rank]).map_err(err)?);
        want.push(reference(&all));
    }
    let output = cx
        .stream
        .clone_htod(&vec![N::poison(); out_len])
        .map_err(err)?;
    Ok(Op {
        name,
        inputs,
        output,
        want,
    })
}

fn verify<N: HostNum>(cx: &Ctx, op: &Op<N>, set: usize, call: usize) -> Result<(), String> {
    let got = cx.stream.clone_dtoh(&op.output).map_err(err)?;
    match first_diff(&got, &op.want[set]) {
        Some((i, g, w)) => Err(format!(
            "call {call} ({}): element {i} is {g:?}, expected {w:?}",
            op.name
        )),
        None => Ok(()),
    }
}

fn poison<N: HostNum>(cx: &Ctx, op: &mut Op<N>) -> Result<(), String> {
    let p = vec![N::poison(); op.output.len()];
    cx.stream.memcpy_htod(&p, &mut op.output).map_err(err)
}

/// `calls` back-to-back calls cycling through all-reduce (one-shot f32, two-shot bf16),
/// reduce-scatter (f32 max), all-gather (u8, odd), a send/recv ring and an all-to-all, with two
/// input sets alternating; every 250th round and the last are poisoned before and verified.
pub(super) fn check_back_to_back(cx: &Ctx, calls: usize) -> Check {
    let (rank, w) = (cx.comm.rank(), cx.comm.world_size());
    let sum = ReduceOp::Sum;
    let mut ar1 = reduction_op::<f32>(cx, "all_reduce f32", 0, (2000, 2000), 2, |a| {
        reduce(a, sum, 0, 2000)
    })?;
    // Past the one-shot limit (bf16: 2 bytes an element), so that this all-reduce is two-shot.
    let n2 = cx.comm.tuning().reduction_limits().one_shot_bytes as usize / 2 + 1_001;
    let mut ar2 = reduction_op::<bf16>(cx, "all_reduce bf16", 1, (n2, n2), 2, |a| {
        reduce(a, sum, 0, n2)
    })?;
    let n3 = 50_000;
    let mut rs = reduction_op::<f32>(cx, "reduce_scatter f32 max", 2, (w * n3, n3), 2, |a| {
        reduce(a, ReduceOp::Max, rank * n3, n3)
    })?;
    let n4 = 300_001;
    let mut ag = reduction_op::<u8>(cx, "all_gather u8", 3, (n4, w * n4), 2, |a| a.concat())?;
    let (next, prev) = ((rank + 1) % w, (rank + w - 1) % w);
    let n5 = 65_536 + 3;
    let mut ring = reduction_op::<u8>(cx, "sendrecv ring", 4, (n5, n5), 2, |a| a[prev].clone())?;
    let n6 = 16 << 10;
    let mut a2a = reduction_op::<u8>(cx, "all_to_all", 5, (w * n6, w * n6), 2, |a| {
        (0..w)
            .flat_map(|p| a[p][rank * n6..(rank + 1) * n6].to_vec())
            .collect()
    })?;
    cx.sync()?;
    cx.host_barrier()?;
    let rounds = calls.div_ceil(6);
    let mut verified = 0usize;
    for r in 0..rounds {
        let set = r % 2;
        let sample = r % 250 == 0 || r + 1 == rounds;
        if sample {
            poison(cx, &mut ar1)?;
            poison(cx, &mut ar2)?;
            poison(cx, &mut rs)?;
            poison(cx, &mut ag)?;
            poison(cx, &mut ring)?;
            poison(cx, &mut a2a)?;
        }
        let (c, s) = (&cx.comm, &cx.stream);
        let e = |what: &str, x: devcomm::Error| format!("round {r}, {what}: {x}");
        c.all_reduce(&ar1.inputs[set], &mut ar1.output, sum, s)
            .map_err(|x| e(ar1.name, x))?;
        c.all_reduce(&ar2.inputs[set], &mut ar2.output, sum, s)
            .map_err(|x| e(ar2.name, x))?;
        c.reduce_scatter(&rs.inputs[set], &mut rs.output, ReduceOp::Max, s)
            .map_err(|x| e(rs.name, x))?;
        c.all_gather(&ag.inputs[set], &mut ag.output, s)
            .map_err(|x| e(ag.name, x))?;
        c.sendrecv(&ring.inputs[set], next, &mut ring.output, prev, s)
            .map_err(|x| e(ring.name, x))?;
        c.all_to_all(&a2a.inputs[set], &mut a2a.output, s)
            .map_err(|x| e(a2a.name, x))?;
        if sample {
            cx.sync()?;
            verify(cx, &ar1, set, 6 * r)?;
            verify(cx, &ar2, set, 6 * r + 1)?;
            verify(cx, &rs, set, 6 * r + 2)?;
            verify(cx, &ag, set, 6 * r + 3)?;
            verify(cx, &ring, set, 6 * r + 4)?;
            verify(cx, &a2a, set, 6 * r + 5)?;
            verified += 6;
        }
    }
    cx.sync()?;
    cx.host_barrier()?;
    Ok(format!(
        "{} calls on one stream (all-reduce {}, reduce-scatter, all-gather, send/recv ring, \
         all-to-all), {verified} poisoned and verified incl. the last round",
        rounds * 6,
        paths(cx)
    ))
}

/// A graph of four reductions (all-reduce f32 one-shot, bf16 two-shot, reduce-scatter, i32
/// all-gather) replayed `replays` times, with fresh inputs copied in before each replay and
/// every replay's outputs verified.
pub(super) fn check_graph(cx: &Ctx, replays: usize) -> Check {
    let (rank, w) = (cx.comm.rank(), cx.comm.world_size());
    let sum = ReduceOp::Sum;
    let (n1, n2, n3, n4) = (3000usize, 70_001usize, 5000usize, 100_003usize);
    // Buffers made without cudarc's event tracking: nothing may be recorded or waited on
    // inside the capture except the reductions' own kernels (a wait on an event recorded
    // before the capture invalidates it).
    // SAFETY: every use of these buffers below is ordered on cx.stream and synchronised.
    unsafe { cx.comm.context().disable_event_tracking() };
    let mut a1 = cx.stream.alloc_zeros::<f32>(n1).map_err(err)?;
    let mut a2 = cx.stream.clone_htod(&vec![bf16::ZERO; n2]).map_err(err)?;
    let mut a3 = cx.stream.alloc_zeros::<f32>(w * n3).map_err(err)?;
    let mut a4 = cx.stream.alloc_zeros::<i32>(n4).map_err(err)?;
    let mut o1 = cx.stream.alloc_zeros::<f32>(n1).map_err(err)?;
    let mut o3 = cx.stream.alloc_zeros::<f32>(n3).map_err(err)?;
    let mut o4 = cx.stream.alloc_zeros::<i32>(w * n4).map_err(err)?;
    // Warm-up outside the capture: kernels loaded, gates passed.
    let c = &cx.comm;
    let s = &cx.stream;
    c.all_reduce(&a1, &mut o1, sum, s).map_err(err)?;
    c.all_reduce_in_place(&mut a2, ReduceOp::Avg, s)
        .map_err(err)?;
    c.reduce_scatter(&a3, &mut o3, ReduceOp::Min, s)
        .map_err(err)?;
    c.all_gather(&a4, &mut o4, s).map_err(err)?;
    cx.sync()?;
    cx.host_barrier()?;
    let graph = cx.capture(|| -> Result<(), devcomm::Error> {
        c.all_reduce(&a1, &mut o1, sum, s)?;
        c.all_reduce_in_place(&mut a2, ReduceOp::Avg, s)?;
        c.reduce_scatter(&a3, &mut o3, ReduceOp::Min, s)?;
        c.all_gather(&a4, &mut o4, s)
    })?;
    for r in 0..replays {
        let tag = 50_000 + 8 * r as u64;
        let i1: Vec<Vec<f32>> = (0..w).map(|p| data(cx.seed, tag, p, n1)).collect();
        let i2: Vec<Vec<bf16>> = (0..w).map(|p| data(cx.seed, tag + 1, p, n2)).collect();
        let i3: Vec<Vec<f32>> = (0..w).map(|p| data(cx.seed, tag + 2, p, w * n3)).collect();
        let i4: Vec<Vec<i32>> = (0..w).map(|p| data(cx.seed, tag + 3, p, n4)).collect();
        s.memcpy_htod(&i1[rank], &mut a1).map_err(err)?;
        s.memcpy_htod(&i2[rank], &mut a2).map_err(err)?;
        s.memcpy_htod(&i3[rank], &mut a3).map_err(err)?;
        s.memcpy_htod(&i4[rank], &mut a4).map_err(err)?;
        graph.launch().map_err(err)?;
        cx.sync()?;
        let checks: [(&str, Option<String>); 4] = [
            (
                "all_reduce f32",
                diff(&s.clone_dtoh(&o1).map_err(err)?, &reduce(&i1, sum, 0, n1)),
            ),
            (
                "all_reduce bf16 avg in place",
                diff(
                    &s.clone_dtoh(&a2).map_err(err)?,
                    &reduce(&i2, ReduceOp::Avg, 0, n2),
                ),
            ),
            (
                "reduce_scatter min",
                diff(
                    &s.clone_dtoh(&o3).map_err(err)?,
                    &reduce(&i3, ReduceOp::Min, rank * n3, n3),
                ),
            ),
            (
                "all_gather i32",
                diff(&s.clone_dtoh(&o4).map_err(err)?, &i4.concat()),
            ),
        ];
        for (what, d) in checks {
            if let Some(d) = d {
                return Err(format!("replay {r}, {what}: {d}"));
            }
        }
    }
    cx.host_barrier()?;
    Ok(format!(
        "{replays} replays of a graph of 4 reductions ({}), fresh data each, every replay \
         verified",
        paths(cx)
    ))
}

/// The algorithms the small and the larger all-reduces of these checks take: one-shot and
/// two-shot, or with network links the network path.
fn paths(cx: &Ctx) -> &'static str {
    match cx.comm.tuning().has_network_links() {
        true => "network path",
        false => "one-shot and two-shot",
    }
}

fn diff<N: HostNum>(got: &[N], want: &[N]) -> Option<String> {
    first_diff(got, want).map(|(i, g, w)| format!("element {i} is {g:?}, expected {w:?}"))
}
