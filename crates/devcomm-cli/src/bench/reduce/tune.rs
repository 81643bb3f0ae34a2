//! `devcomm tune --op all_reduce,reduce_scatter,all_gather`: per collective, buffers (ordinary
//! or in devcomm's memory pool) and size, times the default plan and every candidate the
//! planner can take (algorithm x blocks, pushed results for the staged all-reduce), each
//! checked bit for bit against the default plan's result (itself checked against NCCL's with
//! the benchmark's exactly representable data), and NCCL on the same buffers; rank 0 writes a
//! table (`devcomm::reduce::ReduceTuneTable`) of the fastest choice per size, adjacent sizes
//! with the same choice merged, that a communicator loads through `DEVCOMM_REDUCE_TUNE_FILE`.
//!
//! The run's communicator takes no table and a window wider than the defaults' (twice the
//! line one-shot's and the line two-shot's sizes, or `--one-shot-kib`, `--line-two-shot-kib`),
//! so that those algorithms are tried beyond the built-in limits; the table records the
//! window, and a communicator that loads it makes its window as wide.

use std::path::PathBuf;

use devcomm::reduce::tune::REDUCE_TUNE_VERSION;
use devcomm::reduce::{
    Buffers, Choice, Plan, ReduceLimits, ReduceTuneEntry, ReduceTuneTable, TunedAlgorithm,
    TunedWindow,
};
use devcomm::{DataType, ReduceOp};

use super::data::{first_mismatch, Check, Codec, Run, Values};
use super::fitting_sizes;
use super::nccl_coll::NcclColl;
use super::types::{nccl_dtype, nccl_op, Coll, Reference, Size};
use super::{check_point, devcomm_call, download, poison, upload, Memory, Setup, HEADROOM};
use crate::bench::nccl::max_over_ranks;
use crate::bench::{calls_per_sample, min_free_bytes, time_ranks_each, today};
use crate::selftest::Ctx;

/// What to tune (from `devcomm tune`'s arguments, checked).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Request {
    /// The collectives, in the order they are tuned.
    pub(crate) colls: Vec<Coll>,
    /// Where the buffers lie, in the order they are tuned.
    pub(crate) buffers: Vec<Buffers>,
    /// The element type timed.
    pub(crate) dtype: DataType,
    /// Block counts tried for every algorithm.
    pub(crate) blocks: Vec<u32>,
    /// The run's window: the line one-shot's payload and the line two-shot's size, in KiB
    /// (`None`: twice the default of the world size).
    pub(crate) one_shot_kib: Option<u32>,
    pub(crate) line_two_shot_kib: Option<u32>,
    pub(crate) min_bytes: usize,
    pub(crate) max_bytes: usize,
    pub(crate) warmup: usize,
    pub(crate) iters: usize,
    pub(crate) out: PathBuf,
    /// Keep the entries of the table already at `out` for what this run does not tune.
    pub(crate) append: bool,
}

/// The run's window on `world` ranks with staged rounds of `chunk_bytes`: the sizes asked
/// for, else twice the defaults (the line one-shot at most 4 MiB, as its setting allows).
pub(crate) fn run_window(
    world: usize,
    (one_shot_kib, line_two_shot_kib): (Option<u32>, Option<u32>),
    chunk_bytes: u64,
) -> TunedWindow {
    let d = ReduceLimits::for_world(world);
    let kib = |k: Option<u32>, default: u64| k.map_or(default, |k| u64::from(k) << 10);
    TunedWindow {
        one_shot_bytes: kib(one_shot_kib, (2 * d.one_shot_bytes).min(4 << 20)),
        line_two_shot_bytes: kib(line_two_shot_kib, 2 * d.line_two_shot_bytes),
        chunk_bytes,
    }
}

/// Every choice of the grid for `coll`: each algorithm with a kernel for it, on each of
/// `blocks`, the staged all-reduce pulled and pushed (which of them can serve a call, the
/// communicator says: `Tuning::reduction_plan_with`).
pub(crate) fn grid(coll: Coll, blocks: &[u32]) -> Vec<Choice> {
    let c = coll.devcomm();
    let mut out = Vec::new();
    for algorithm in TunedAlgorithm::ALL {
        if !algorithm.serves(c) {
            continue;
        }
        let pushed: &[bool] =
            if algorithm == TunedAlgorithm::Staged && c == devcomm::reduce::Collective::AllReduce {
                &[false, true]
            } else {
                &[false]
            };
        for &p in pushed {
            for &b in blocks {
                out.push(Choice {
                    algorithm,
                    blocks: b,
                    pushed: p,
                });
            }
        }
    }
    out
}

/// The fastest of the default plan (`default_us`, its choice `default`) and the candidates,
/// the default on a tie: (choice, time).
pub(crate) fn fastest(default: Choice, default_us: f64, timed: &[(Choice, f64)]) -> (Choice, f64) {
    timed.iter().fold((default, default_us), |best, &(c, us)| {
        if us < best.1 {
            (c, us)
        } else {
            best
        }
    })
}

/// Merges adjacent entries of one (collective, buffers) with the same choice into the larger
/// size's entry (its bucket then starts where the first one's did).
pub(crate) fn merge(entries: Vec<ReduceTuneEntry>) -> Vec<ReduceTuneEntry> {
    let mut out: Vec<ReduceTuneEntry> = Vec::with_capacity(entries.len());
    for e in entries {
        match out.last_mut() {
            Some(last)
                if last.collective == e.collective
                    && last.buffers == e.buffers
                    && last.choice() == e.choice() =>
            {
                *last = e;
            }
            _ => out.push(e),
        }
    }
    out
}

/// `new` with the entries of `old` (the table already at `--out`, `--append`) for every
/// (collective, buffers) that `new` has none of: both measured on the same GPU model, world
/// size, window and element type, else an error.
pub(crate) fn append(
    old: ReduceTuneTable,
    mut new: ReduceTuneTable,
) -> Result<ReduceTuneTable, String> {
    let same = [
        ("GPU model", old.device == new.device),
        ("world size", old.world_size == new.world_size),
        ("window", old.window == new.window),
        ("element type", old.dtype == new.dtype),
    ];
    if let Some((what, _)) = same.iter().find(|(_, same)| !same) {
        return Err(format!(
            "--append: the table there was measured with another {what} ({}, {} ranks, {:?}, \
             {}; this run: {}, {} ranks, {:?}, {})",
            old.device,
            old.world_size,
            old.window,
            old.dtype,
            new.device,
            new.world_size,
            new.window,
            new.dtype
        ));
    }
    let tuned = |e: &ReduceTuneEntry| {
        new.entries
            .iter()
            .any(|n| n.collective == e.collective && n.buffers == e.buffers)
    };
    let kept: Vec<ReduceTuneEntry> = old.entries.into_iter().filter(|e| !tuned(e)).collect();
    new.entries.splice(0..0, kept);
    Ok(new)
}

/// How a candidate is named in progress lines.
fn describe(p: &Plan, c: &Choice) -> String {
    match p.rounds {
        1 => format!("{} on {} blocks{}", p.algorithm.name(), p.blocks, pushed(c)),
        r => format!(
            "{} ({r} rounds) on {} blocks{}",
            p.algorithm.name(),
            p.blocks,
            pushed(c)
        ),
    }
}

fn pushed(c: &Choice) -> &'static str {
    if c.pushed {
        ", pushed"
    } else {
        ""
    }
}

/// Runs the sweep on every rank; rank 0 writes the table.
pub(crate) fn run(req: &Request) -> Result<i32, String> {
    crate::bench::refuse_shared_gpu("tuning runs")?;
    let config = devcomm::Config::from_env().map_err(|e| e.to_string())?;
    let info = devcomm_bootstrap::RankInfo::from_env().map_err(|e| e.to_string())?;
    let chunk = devcomm::reduce::chunk_bytes(&config, info.world_size);
    let window = run_window(
        info.world_size,
        (req.one_shot_kib, req.line_two_shot_kib),
        chunk,
    );
    // No table (the default plans are the reference and a candidate), the wider window.
    let cx = Ctx::built(|b| b.reduce_tune_table(None).reduce_window(window))?;
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    if world < 2 {
        return Err("tuning needs at least 2 ranks".into());
    }
    if cx.comm.tuning().has_network_links() {
        return Err(
            "a job with network links reduces by the network algorithm, which takes no table"
                .into(),
        );
    }
    // SAFETY: every buffer the run makes from here on is allocated, used and freed on
    // `cx.stream` alone (devcomm's own streams join back into it within each call), so stream
    // order is all the synchronisation they need (as `devcomm bench`).
    unsafe { cx.comm.context().disable_event_tracking() };
    let nccl = NcclColl::new(&cx)?;
    let device = cx.comm.device_info().name.clone();
    if rank == 0 && req.min_bytes > 8 {
        eprintln!(
            "--min-bytes {}: a table's first bucket serves every smaller call too (with the \
             choice measured at the first size)",
            req.min_bytes
        );
    }
    if rank == 0 {
        let w = cx.comm.tuning().reduction_window();
        eprintln!(
            "tuning {} on {world} x {device}, {} buffers, {}: window with the line one-shot up \
             to {} KiB, the line two-shot up to {} KiB, rounds of {} MiB; blocks {:?}",
            req.colls
                .iter()
                .map(|c| c.name())
                .collect::<Vec<_>>()
                .join(", "),
            req.buffers
                .iter()
                .map(|b| b.name())
                .collect::<Vec<_>>()
                .join(" and "),
            req.dtype.name(),
            w.one_shot_bytes >> 10,
            w.line_two_shot_bytes >> 10,
            w.chunk_bytes >> 20,
            req.blocks
        );
    }
    let table = |entries| ReduceTuneTable {
        version: REDUCE_TUNE_VERSION,
        device: device.clone(),
        world_size: world,
        date: today(),
        dtype: req.dtype.name().into(),
        window: cx.comm.tuning().reduction_window(),
        entries,
    };
    // Rank 0 writes the file, so it alone reads the one it appends to: first, whether this
    // run can append to it at all (the launcher stops every rank when one fails).
    let appended = match req.append && rank == 0 && req.out.exists() {
        true => {
            let old = ReduceTuneTable::load(&req.out).map_err(|e| format!("--append: {e}"))?;
            append(old.clone(), table(Vec::new()))?;
            Some(old)
        }
        false => None,
    };
    let mut entries = Vec::new();
    for &buffers in &req.buffers {
        for &coll in &req.colls {
            entries.extend(merge(tune(&cx, req, &nccl, coll, buffers)?));
            cx.host_barrier()?;
        }
    }
    drop(nccl);
    let table = match appended {
        Some(old) => append(old, table(entries))?,
        None => table(entries),
    };
    // What the table will be checked against when it is loaded.
    table
        .check()
        .and_then(|()| table.validate(&device, world, chunk))
        .map_err(|e| format!("the measured table: {e}"))?;
    if rank == 0 {
        std::fs::write(&req.out, table.to_json())
            .map_err(|e| format!("{}: {e}", req.out.display()))?;
        println!(
            "wrote {} ({} entries); use it with DEVCOMM_REDUCE_TUNE_FILE={} on every rank",
            req.out.display(),
            table.entries.len(),
            req.out.display()
        );
    }
    cx.host_barrier()?;
    Ok(0)
}

/// One collective on one kind of buffers: every size's entry (not merged yet).
fn tune(
    cx: &Ctx,
    req: &Request,
    nccl: &NcclColl,
    coll: Coll,
    buffers: Buffers,
) -> Result<Vec<ReduceTuneEntry>, String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let codec = Codec::of(req.dtype)?;
    let op = ReduceOp::Sum;
    let s = Setup {
        coll,
        dtype: req.dtype,
        op,
        values: Values::new(codec, coll.reduces().then_some(op), world)?,
        reference: Reference::Nccl,
        pool: buffers == Buffers::Pool,
        epilogue: None,
    };
    let elem = codec.bytes();
    let free = min_free_bytes(cx, HEADROOM)?;
    let footprint = |z: &Size| {
        let (i, o) = coll.in_out(z.count, world);
        (i + o) * elem
    };
    let (points, largest) = fitting_sizes(
        (coll, elem, world, rank),
        (req.min_bytes, req.max_bytes),
        free,
        |z| footprint(z) <= free,
    )?;
    let (n_in, n_out) = coll.in_out(largest.count, world);
    let memory = Memory::new(cx, s.pool, n_in * elem, n_out * elem)?;
    let ptrs = memory.ptrs(cx);
    cx.sync()?;
    let mut entries = Vec::with_capacity(points.len());
    for (i, z) in points.iter().enumerate() {
        let e = point(cx, req, &s, nccl, ptrs, z, buffers)?;
        if rank == 0 {
            let label = format!(
                "[{}/{}] {} {} {} B",
                i + 1,
                points.len(),
                coll.name(),
                buffers.name(),
                z.bytes
            );
            eprintln!(
                "{label}: {} {:.2} us (default {:.2} us: {:.2}x; NCCL {:.2} us: {:.2}x)",
                e.1,
                e.0.us,
                e.0.default_us,
                e.0.default_us / e.0.us,
                e.0.nccl_us,
                e.0.nccl_us / e.0.us
            );
        }
        entries.push(e.0);
        cx.host_barrier()?;
    }
    cx.sync()?;
    drop(memory);
    Ok(entries)
}

/// One size: the default plan checked against NCCL, every feasible candidate checked against
/// the default plan bit for bit, then all of them and NCCL timed in turn. Returns the entry
/// and a description of its choice.
fn point(
    cx: &Ctx,
    req: &Request,
    s: &Setup,
    nccl: &NcclColl,
    ptrs: (u64, u64),
    z: &Size,
    buffers: Buffers,
) -> Result<(ReduceTuneEntry, String), String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let tuning = cx.comm.tuning();
    let coll = s.coll;
    let (n_in, n_out) = coll.in_out(z.count, world);
    let codec = s.codec();
    let out_bytes = n_out * codec.bytes();
    let run = Run {
        values: s.values,
        seed: cx.seed,
        tag: ((z.bytes as u64) << 2) | coll as u64,
        world,
    };
    let host = s.values.input(run.seed, run.tag, rank, n_in);
    upload(cx, ptrs.0, &host)?;
    drop(host);
    // The default plan's result, checked against NCCL's; the candidates' reference.
    check_point(cx, s, Some(nccl), ptrs, &run, z)?;
    let want = download(cx, ptrs.1, out_bytes)?;
    let at = (ptrs.0, ptrs.1, z.count as u64);
    let default = tuning
        .reduction_plan_at(coll.devcomm(), s.dtype, at)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{}: no plan", s.what(z)))?;
    let default_choice =
        Choice::of(&default).ok_or_else(|| format!("{}: no tunable plan", s.what(z)))?;
    // The candidates the communicator can run here, each plan once (the default's apart).
    let mut candidates: Vec<(Choice, Plan)> = Vec::new();
    for c in grid(coll, &req.blocks) {
        let Ok(Some(p)) = tuning.reduction_plan_with(coll.devcomm(), s.dtype, at, c) else {
            continue;
        };
        if p != default && candidates.iter().all(|(_, q)| *q != p) {
            candidates.push((c, p));
        }
    }
    let forced = |c: Choice| {
        // SAFETY: the buffers hold the largest size's input and output, alive until the run's
        // end (after a synchronisation); nothing else writes them meanwhile.
        unsafe { tuning.reduction_raw_with(coll.devcomm(), s.dtype, s.op, at, c, &cx.stream) }
            .map_err(|e| e.to_string())
    };
    for (c, p) in &candidates {
        poison(cx, ptrs.1, out_bytes, codec.poison())?;
        cx.host_barrier()?;
        forced(*c)?;
        let got = download(cx, ptrs.1, out_bytes)?;
        let wrong = first_mismatch(codec, Check::Bitwise, &got, &want);
        let any = max_over_ranks(
            cx,
            "reduce-tune-check",
            f64::from(u8::from(wrong.is_some())),
        )?;
        match wrong {
            Some((i, g, w)) => {
                return Err(format!(
                    "{} with {}: rank {rank}: element {i} of {n_out} is {g}, the default plan \
                     gives {w}",
                    s.what(z),
                    describe(p, c)
                ))
            }
            None if any > 0.0 => {
                return Err(format!(
                    "{} with {}: another rank's result differs from the default plan's",
                    s.what(z),
                    describe(p, c)
                ))
            }
            None => {}
        }
    }
    // Timed in turn: the default plan, the candidates, NCCL.
    let n = candidates.len();
    let names: Vec<String> = (0..n + 2).map(|i| format!("reduce-tune-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let types = (nccl_dtype(s.dtype)?, nccl_op(s.op));
    let us = time_ranks_each(
        cx,
        world,
        req.warmup,
        req.iters,
        calls_per_sample(z.bytes),
        &names,
        &mut |i| match i {
            0 => devcomm_call(cx, s, ptrs, z.count),
            i if i <= n => forced(candidates[i - 1].0),
            // SAFETY: as `forced`'s.
            _ => unsafe { nccl.call(coll, ptrs, z.count, types, &cx.stream) },
        },
    )?;
    let timed: Vec<(Choice, f64)> = candidates
        .iter()
        .zip(&us[1..=n])
        .map(|((c, _), &t)| (*c, t))
        .collect();
    let (pick, pick_us) = fastest(default_choice, us[0], &timed);
    let what = match candidates.iter().find(|(c, _)| *c == pick) {
        Some((c, p)) => format!("{} of {} candidates", describe(p, c), n + 1),
        None => format!(
            "the default, {}, of {} candidates",
            describe(&default, &default_choice),
            n + 1
        ),
    };
    Ok((
        ReduceTuneEntry {
            collective: coll.devcomm(),
            buffers,
            max_bytes: z.bytes as u64,
            algorithm: pick.algorithm,
            blocks: pick.blocks,
            pushed: pick.pushed,
            us: pick_us,
            default_us: us[0],
            nccl_us: us[n + 1],
        },
        what,
    ))
}

#[cfg(test)]
mod tests;
