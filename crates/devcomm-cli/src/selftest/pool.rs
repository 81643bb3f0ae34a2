//! Checks of the communicator's memory pool: local allocation, free and reuse; exhaustion
//! refused with a clear error and nothing overwritten (poisoned slices read back); lookups by
//! address; the first segment of `DEVCOMM_POOL_MIB`; zero-copy rings and all-to-all between
//! pool slices of every rank, verified byte for byte; replays of a captured call on pool
//! slices (allocated before the capture, freed after).

use cudarc::driver::CudaSlice;
use devcomm::{Config, Error, PoolSlice};

use super::harness::{compare, verified, Check, Ctx, Ranks, POISON};
use super::{fresh_comm_with, Fresh};

type Detail = Result<String, String>;

/// The group's checks, in run order.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "pool_alloc",
        ranks: Ranks::AtLeast(1),
        about: "grow, allocate, free, reuse, lookups; double and foreign frees refused",
        run: |cx, _| verified(check_alloc(cx)),
    },
    Check {
        name: "pool_exhausted",
        ranks: Ranks::AtLeast(1),
        about: "an exhausted pool refuses with the request and sizes, nothing overwritten",
        run: |cx, _| verified(check_exhausted(cx)),
    },
    Check {
        name: "pool_config",
        ranks: Ranks::AtLeast(1),
        about: "DEVCOMM_POOL_MIB grows the first segment at build; torn down with the comm",
        run: |cx, _| verified(check_config(cx)),
    },
    Check {
        name: "pool_ring",
        ranks: Ranks::AtLeast(2),
        about: "zero-copy ring and all-to-all between pool slices of every rank",
        run: |cx, _| verified(check_ring(cx)),
    },
    Check {
        name: "pool_graph",
        ranks: Ranks::AtLeast(2),
        about: "--replays replays of a captured zero-copy ring on pool slices",
        run: |cx, p| verified(check_graph(cx, p.replays)),
    },
];

const MIB: usize = 1 << 20;

fn err(e: Error) -> String {
    e.to_string()
}

/// Collective: makes sure the pool has a free range of at least `bytes` (grows a segment of
/// that size, rounded up, when the largest free range is smaller: every rank's pool is in the
/// same state, so all decide alike).
fn ensure_room(cx: &Ctx, bytes: usize) -> Result<(), String> {
    if (cx.comm.pool_usage().largest_free as usize) < bytes {
        cx.comm.grow_pool(bytes).map_err(err)?;
    }
    Ok(())
}

/// Fills a slice with [`POISON`] on the check's stream.
fn poison(cx: &Ctx, s: &PoolSlice<'_>) -> Result<(), String> {
    // SAFETY: the slice's own bytes, ordered on the rank's stream; it stays allocated until
    // it drops (which synchronises).
    unsafe { devcomm::testing::memset_d8_async(s.ptr(), POISON, s.bytes() as usize, &cx.stream) }
        .map_err(err)
}

/// Writes `data` into the slice and waits.
fn fill(cx: &Ctx, s: &PoolSlice<'_>, data: &[u8]) -> Result<(), String> {
    if data.len() as u64 > s.bytes() {
        return Err(format!("{} bytes do not fit {s:?}", data.len()));
    }
    let src = cx.stream.clone_htod(data).map_err(|e| e.to_string())?;
    cx.copy_to_ptr(s.ptr(), &src)
}

fn check_alloc(cx: &Ctx) -> Detail {
    let comm = &cx.comm;
    let rank = comm.rank();
    ensure_room(cx, 4 * MIB)?;
    let before = comm.pool_usage();
    let sizes = [1u64, 300, 4096, MIB as u64 + 5];
    let slices: Vec<PoolSlice<'_>> = sizes
        .iter()
        .map(|&b| comm.alloc(b))
        .collect::<Result<_, _>>()
        .map_err(err)?;
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (s, &b) in slices.iter().zip(&sizes) {
        if s.ptr() % 256 != 0 || s.bytes() != b {
            return Err(format!("{s:?}: not 256-byte aligned or not {b} bytes"));
        }
        let at = comm
            .pool_lookup(s.ptr(), b)
            .ok_or_else(|| format!("{s:?} not found by its address"))?;
        if (at.segment, at.offset) != (s.segment(), s.offset()) || at.peer_ptr(rank) != Some(s.ptr())
        {
            return Err(format!("lookup of {s:?} gave {at:?}"));
        }
        let inner = comm.pool_lookup(s.ptr() + 1, b - 1);
        if inner.as_ref().map(|l| l.offset) != Some(s.offset() + 1) {
            return Err(format!("lookup inside {s:?} gave {inner:?}"));
        }
        if comm.registered_range_of(s.ptr(), b).map(|r| r.offset) != Some(s.offset()) {
            return Err(format!("no registered range for {s:?}"));
        }
        spans.push((s.ptr(), b.next_multiple_of(256)));
    }
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(format!("slices overlap: {spans:?}"));
    }
    // Memory outside the pool, and ranges running past a segment, are no pool memory.
    let outside: CudaSlice<u8> = cx.stream.alloc_zeros(4096).map_err(|e| e.to_string())?;
    let outside_ptr = {
        use cudarc::driver::DevicePtr;
        let (p, _g) = outside.device_ptr(&cx.stream);
        p
    };
    let last = comm.pool_usage().segments.len() - 1;
    let seg = comm
        .pool_lookup(slices[0].ptr(), 1)
        .ok_or("lookup of the first slice")?;
    let seg_end = seg.segment_base + seg.segment_bytes;
    if comm.pool_lookup(outside_ptr, 16).is_some() || comm.pool_lookup(seg_end - 8, 16).is_some()
    {
        return Err("memory outside the pool, or past a segment, found in it".into());
    }
    // Double and foreign frees are refused and change nothing.
    let pool = comm.pool();
    let used = comm.pool_usage();
    let inside = slices[2].ptr() + 256;
    // SAFETY: every address below is refused (not the start of a live allocation), so
    // nothing is freed.
    let refused = unsafe { [pool.free(outside_ptr), pool.free(inside)] };
    for r in &refused {
        if !matches!(r, Err(Error::InvalidArgument { .. })) {
            return Err(format!("a foreign free was not refused: {r:?}"));
        }
    }
    let raw = comm.alloc(512).map_err(err)?.into_raw();
    // SAFETY: `raw` is a live allocation no work uses; the second free must be refused.
    let (first, second) = unsafe { (pool.free(raw), pool.free(raw)) };
    if first.is_err() || !matches!(second, Err(Error::InvalidArgument { .. })) {
        return Err(format!("free then double free of {raw:#x}: {first:?}, {second:?}"));
    }
    if comm.pool_usage() != used {
        return Err("a refused free changed the pool".into());
    }
    // Free and reuse: first fit hands the freed range out again.
    let reused_ptr = slices[1].ptr();
    drop(slices);
    if comm.pool_usage() != before {
        return Err(format!(
            "after freeing everything: {:?}, before: {before:?}",
            comm.pool_usage()
        ));
    }
    let again = comm.alloc(1).map_err(err)?;
    let again2 = comm.alloc(300).map_err(err)?;
    if again2.ptr() != reused_ptr {
        return Err(format!("{again2:?} did not reuse {reused_ptr:#x}"));
    }
    drop((again, again2));
    // A zero-byte segment is refused on every rank.
    match comm.grow_pool(0) {
        Err(Error::Setup { .. }) => {}
        other => return Err(format!("grow_pool(0): {other:?}")),
    }
    Ok(format!(
        "{} slices aligned, disjoint, found by address; refused frees changed nothing; freed \
         ranges reused; {} segment(s)",
        sizes.len(),
        last + 1
    ))
}

fn check_exhausted(cx: &Ctx) -> Detail {
    let comm = &cx.comm;
    ensure_room(cx, 2 * MIB)?;
    let a = comm.alloc(MIB as u64).map_err(err)?;
    let b = comm.alloc(4096).map_err(err)?;
    let da = cx.data_of(comm.rank(), 700, MIB);
    let db = cx.data_of(comm.rank(), 701, 4096);
    fill(cx, &a, &da)?;
    fill(cx, &b, &db)?;
    let usage = comm.pool_usage();
    let ask = usage.largest_free + 1;
    let text = match comm.alloc(ask) {
        Err(e @ Error::PoolExhausted { .. }) => e.to_string(),
        other => return Err(format!("alloc({ask}) of a full pool: {other:?}")),
    };
    for want in ["pool exhausted", &ask.to_string(), &usage.free.to_string()] {
        if !text.contains(want) {
            return Err(format!("the error does not name `{want}`: {text}"));
        }
    }
    if comm.pool_usage() != usage {
        return Err("a refused allocation changed the pool".into());
    }
    // The live slices read back unchanged.
    compare(&cx.read_ptr(a.ptr(), MIB)?, &da, "slice a")?;
    compare(&cx.read_ptr(b.ptr(), 4096)?, &db, "slice b")?;
    // The largest free range itself still fits.
    let fits = comm.alloc(usage.largest_free).map_err(err)?;
    drop(fits);
    Ok(format!("refused {ask} B with: {text}"))
}

fn check_config(cx: &Ctx) -> Detail {
    let mut n = 0;
    let mut config = Config::from_env().map_err(err)?;
    config.pool_mib = 6;
    let Fresh { comm, .. } = fresh_comm_with(cx, "pool_config", &mut n, |b| b.config(config))?;
    let usage = comm.pool_usage();
    let ok = usage.segments.len() == 1 && usage.segments[0] >= 6 * MIB as u64;
    if !ok {
        return Err(format!("DEVCOMM_POOL_MIB=6 built a pool of {usage:?}"));
    }
    let s = comm.alloc(5 * MIB as u64).map_err(err)?;
    let at = comm.pool_lookup(s.ptr(), s.bytes()).ok_or("lookup")?;
    let world = comm.world_size();
    let mapped = (0..world).filter(|&p| at.peer_ptr(p).is_some()).count();
    drop(s);
    // Collective: the segment is released on every rank with the communicator.
    drop(comm);
    cx.host_barrier()?;
    Ok(format!(
        "first segment {} B at build, mapped for {mapped} of {world} ranks, torn down",
        usage.segments[0]
    ))
}

/// Allocates the same slices on every rank (same order: same offsets, checked across ranks
/// through the store under `tag`).
fn symmetric_slices<'c>(
    cx: &'c Ctx,
    tag: &str,
    sizes: &[usize],
) -> Result<Vec<PoolSlice<'c>>, String> {
    let slices: Vec<PoolSlice<'c>> = sizes
        .iter()
        .map(|&b| cx.comm.alloc(b as u64))
        .collect::<Result<_, _>>()
        .map_err(err)?;
    let mine: Vec<u8> = slices
        .iter()
        .flat_map(|s| [s.segment() as u64, s.offset()])
        .flat_map(u64::to_le_bytes)
        .collect();
    let all = cx
        .comm
        .store()
        .all_gather(
            &format!("__devcomm_cli/pool/offsets/{tag}"),
            &mine,
            cx.comm.setup_timeout(),
        )
        .map_err(|e| e.to_string())?;
    if all.iter().any(|o| *o != mine) {
        return Err("ranks' pool slices are not at the same (segment, offset)".into());
    }
    Ok(slices)
}

fn check_ring(cx: &Ctx) -> Detail {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    let sizes = [5usize, 65_536, MIB + 3, 3 * MIB, 24 * MIB + 7];
    let big = sizes[sizes.len() - 1];
    let guard = 512usize;
    let chunk = 96 << 10;
    ensure_room(cx, big + 2 * guard + world * chunk + 4096)?;
    let slices = symmetric_slices(cx, "ring", &[big + 2 * guard, world * chunk])?;
    let (dst, out) = (&slices[0], &slices[1]);
    for (i, bytes) in sizes.into_iter().enumerate() {
        let tag = 720 + i as u64;
        let src = cx
            .stream
            .clone_htod(&cx.data_of(rank, tag, bytes))
            .map_err(|e| e.to_string())?;
        poison(cx, dst)?;
        cx.sync()?;
        cx.host_barrier()?;
        // The receiving side finds its range by address, the sending side from its slice.
        let recv = comm
            .registered_range_of(dst.ptr() + guard as u64, bytes as u64)
            .ok_or("the destination is not found in the pool")?;
        let send = dst.range(guard as u64, bytes as u64).map_err(err)?;
        comm.sendrecv_registered(&src, next, send, recv, prev, &cx.stream)
            .map_err(err)?;
        cx.sync()?;
        let got = cx.read_ptr(dst.ptr(), bytes + 2 * guard)?;
        let what = format!("ring {bytes} B from {prev}");
        compare(&got[guard..guard + bytes], &cx.data_of(prev, tag, bytes), &what)?;
        if got[..guard]
            .iter()
            .chain(&got[guard + bytes..])
            .any(|&b| b != POISON)
        {
            return Err(format!("{what}: bytes around the message were overwritten"));
        }
        cx.host_barrier()?;
    }
    // All-to-all into a pool output: chunk p of rank r's input lands at rank p's output.
    let input: Vec<u8> = (0..world)
        .flat_map(|p| cx.data_of(rank, 760 + p as u64, chunk))
        .collect();
    let src = cx.stream.clone_htod(&input).map_err(|e| e.to_string())?;
    poison(cx, out)?;
    cx.sync()?;
    cx.host_barrier()?;
    comm.all_to_all_registered(&src, out.whole(), &cx.stream)
        .map_err(err)?;
    cx.sync()?;
    let expect: Vec<u8> = (0..world)
        .flat_map(|p| cx.data_of(p, 760 + rank as u64, chunk))
        .collect();
    compare(&cx.read_ptr(out.ptr(), world * chunk)?, &expect, "all-to-all into the pool")?;
    cx.host_barrier()?;
    Ok(format!(
        "{} ring steps 5 B to {big} B between pool slices (guards intact), all-to-all of {chunk} \
         B chunks into a pool slice",
        sizes.len()
    ))
}

fn check_graph(cx: &Ctx, replays: usize) -> Detail {
    // No event tracking for the buffers made here: captured work must record no events.
    // SAFETY: every use of these buffers below is ordered on cx.stream and synchronised.
    unsafe { cx.comm.context().disable_event_tracking() };
    let result = graph_replays(cx, replays);
    // SAFETY: restores the default for buffers made later.
    unsafe { cx.comm.context().enable_event_tracking() };
    result
}

fn graph_replays(cx: &Ctx, replays: usize) -> Detail {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    let bytes = 2 * MIB + 40;
    let variants = 3u64;
    ensure_room(cx, 2 * bytes + 4096)?;
    // Allocated before the capture; the captured calls allocate and free nothing.
    let slices = symmetric_slices(cx, "graph", &[bytes, bytes])?;
    let (src, dst) = (&slices[0], &slices[1]);
    let send = dst.whole();
    let recv = comm
        .registered_range_of(dst.ptr(), bytes as u64)
        .ok_or("the destination is not found in the pool")?;
    // The source is pool memory too: a cudarc view of it, never dropped (the slice frees it).
    // SAFETY: `src` is `bytes` of live pool memory that outlives the view.
    let view = std::mem::ManuallyDrop::new(unsafe {
        cx.stream.upgrade_device_ptr::<u8>(src.ptr(), bytes)
    });
    cx.sync()?;
    cx.host_barrier()?;
    let graph = cx.capture(|| -> Result<(), String> {
        poison(cx, dst)?;
        comm.sendrecv_registered(&*view, next, send, recv, prev, &cx.stream)
            .map_err(err)
    })?;
    for r in 0..replays as u64 {
        let v = r % variants;
        fill(cx, src, &cx.data_of(rank, 780 + v, bytes))?;
        cx.host_barrier()?;
        graph.launch().map_err(|e| e.to_string())?;
        cx.sync()?;
        let got = cx.read_ptr(dst.ptr(), bytes)?;
        compare(&got, &cx.data_of(prev, 780 + v, bytes), &format!("replay {r}"))?;
        cx.host_barrier()?;
    }
    drop(graph);
    Ok(format!(
        "{replays} replays of a captured ring step of {bytes} B from one pool slice into \
         another, each verified"
    ))
}
