//! Checks of zero-copy send/recv into registered buffers: fresh random data,
//! poisoned destinations with guard bytes, every byte compared with the sender's data
//! regenerated on the host.

use cudarc::driver::CudaSlice;
use devcomm::p2p::ZcRoute;
use devcomm::Error;

use super::harness::{
    compare, partner, roles, verified, Check, Checked, Ctx, Outcome, Ranks, RegBuf, Skip, POISON,
    SIZES,
};

type Detail = Result<String, String>;

/// The group's checks, in run order.
pub(super) const CHECKS: &[Check] = &[
    Check {
        name: "zc_sizes",
        ranks: Ranks::Pairs,
        about: "zero-copy 0 B to 1 GiB into registered buffers, guard bytes untouched",
        run: |cx, _| verified(check_sizes(cx)),
    },
    Check {
        name: "zc_errors",
        ranks: Ranks::Pairs,
        about: "bad ranges refused, mismatched sides reported on both, nothing written",
        run: |cx, _| check_errors(cx),
    },
    Check {
        name: "zc_ring",
        ranks: Ranks::AtLeast(3),
        about: "zero-copy ring on every route",
        run: |cx, _| verified(check_ring(cx)),
    },
    Check {
        name: "zc_back_to_back",
        ranks: Ranks::Pairs,
        about: "--calls zero-copy exchanges back to back on every route",
        run: |cx, p| verified(check_back_to_back(cx, p.calls)),
    },
    Check {
        name: "zc_graph",
        ranks: Ranks::Pairs,
        about: "--replays replays of a captured zero-copy exchange",
        run: |cx, p| verified(check_graph(cx, p.replays)),
    },
    Check {
        name: "zc_all_to_all",
        ranks: Ranks::AtLeast(2),
        about: "all-to-all into a registered output on both schedules",
        run: |cx, _| verified(check_all_to_all(cx)),
    },
];

/// A size on the copy-engine route (the smallest, at most 64 MiB; with the copy engine off,
/// 64 MiB on whatever route it takes then).
fn large_size(cx: &Ctx) -> usize {
    let ll = cx.comm.tuning().p2p_limits().ll_max_bytes;
    cx.comm.tuning().p2p_switches().zc_ce_min.clamp(ll + 1, 64 << 20) as usize
}

fn route_name(cx: &Ctx, bytes: usize) -> &'static str {
    match cx.comm.tuning().zero_copy_route(bytes as u64) {
        ZcRoute::Staged => "staged",
        ZcRoute::Blocks(_) => "SM blocks",
        ZcRoute::CopyEngine => "copy engine",
    }
}

/// Reads back `[0, off + bytes + guard)` of the destination and checks the message and that
/// everything around it is still poison.
fn verify(
    cx: &Ctx,
    dst: &RegBuf<'_>,
    off: usize,
    bytes: usize,
    expect: Option<&[u8]>,
    what: &str,
) -> Result<(), String> {
    let guard = 64.min(dst.bytes - off - bytes);
    let got = cx.read_ptr(dst.ptr, off + bytes + guard)?;
    if let Some(expect) = expect {
        compare(&got[off..off + bytes], expect, what)?;
    }
    let written = if expect.is_some() { bytes } else { 0 };
    if got[..off]
        .iter()
        .chain(&got[off + written..])
        .any(|&b| b != POISON)
    {
        return Err(format!(
            "{what}: bytes outside the destination were written"
        ));
    }
    Ok(())
}

/// One zero-copy message between partners: even ranks send (or both ways), at byte offsets.
fn exchange(
    cx: &Ctx,
    dst: &RegBuf<'_>,
    bytes: usize,
    src_off: usize,
    dst_off: usize,
    both: bool,
    tag: u64,
) -> Result<(), String> {
    let Some((peer, sends, receives)) = roles(cx, both) else {
        return cx.host_barrier();
    };
    let src: CudaSlice<u8> = cx
        .stream
        .clone_htod(&cx.data_of(cx.comm.rank(), tag, src_off + bytes))
        .map_err(|e| e.to_string())?;
    let view = src.slice(src_off..);
    dst.poison(&cx.stream)?;
    cx.sync()?;
    cx.host_barrier()?;
    let at = dst.at(dst_off, bytes);
    let r = match (sends, receives) {
        (true, true) => cx
            .comm
            .sendrecv_registered(&view, peer, at, at, peer, &cx.stream),
        (true, false) => cx.comm.send_registered(&view, peer, at, &cx.stream),
        _ => cx.comm.recv_registered(at, peer, &cx.stream),
    };
    r.map_err(|e| e.to_string())?;
    cx.sync()?;
    let what = format!("{bytes} B (src+{src_off}, dst+{dst_off}) from {peer}");
    let expect = receives.then(|| cx.data_of(peer, tag, src_off + bytes));
    verify(
        cx,
        dst,
        dst_off,
        bytes,
        expect.as_ref().map(|e| &e[src_off..]),
        &what,
    )?;
    cx.host_barrier()
}

fn check_sizes(cx: &Ctx) -> Detail {
    let sizes: Vec<usize> = std::iter::once(0).chain(SIZES.iter().copied()).collect();
    let dst = RegBuf::new(cx, (1 << 30) + 4096)?;
    let mut n = 0;
    for (i, &bytes) in sizes.iter().enumerate() {
        for both in [false, true] {
            let (so, doff) = if i % 2 == 0 { (0, 0) } else { (3, 5) };
            exchange(
                cx,
                &dst,
                bytes,
                so,
                doff,
                both,
                900 + 2 * i as u64 + u64::from(both),
            )?;
            n += 1;
        }
    }
    Ok(format!(
        "{n} zero-copy messages, 0 B to 1 GiB, odd sizes and offsets, one-way and both ways; guard bytes untouched"
    ))
}

/// Mismatched calls are refused on both sides with nothing written; bad ranges are refused
/// before launch; the communicator stays usable.
fn check_errors(cx: &Ctx) -> Checked {
    let comm = &cx.comm;
    let rank = comm.rank();
    let big = large_size(cx);
    let n = (1usize << 20) + 16;
    let most = big.max(n) + 64;
    let dst = RegBuf::new(cx, most + (1 << 20))?;
    let src = cx
        .stream
        .clone_htod(&cx.data_of(rank, 950, most))
        .map_err(|e| e.to_string())?;
    // Refused before launch, on every rank.
    let peer = (rank + 1) % comm.world_size();
    let before: Vec<(&str, Result<(), Error>)> = vec![
        (
            "range past the peer's buffer",
            comm.send_registered(
                &src.slice(..4096),
                peer,
                dst.at(dst.bytes - 100, 4096),
                &cx.stream,
            ),
        ),
        (
            "range past this rank's buffer",
            comm.recv_registered(dst.at(16, dst.bytes), peer, &cx.stream),
        ),
        (
            "range of another size than the message",
            comm.send_registered(&src.slice(..16), peer, dst.at(0, 8), &cx.stream),
        ),
        (
            "peer is this rank",
            comm.send_registered(&src.slice(..16), rank, dst.at(0, 16), &cx.stream),
        ),
        (
            "peer out of range",
            comm.recv_registered(dst.at(0, 16), comm.world_size(), &cx.stream),
        ),
    ];
    for (what, r) in before {
        match r {
            Err(Error::InvalidArgument { .. }) | Err(Error::CapacityExceeded { .. }) => {}
            other => return Err(format!("{what}: expected a refusal, got {other:?}")),
        }
    }
    let Some(peer) = partner(cx) else {
        cx.host_barrier()?;
        return verified(Ok("refusals before launch only (no partner)".into()));
    };
    // Mismatches on the routes that compare the two sides' ranges (SM blocks, copy engine;
    // the staged route, like send/recv itself, trusts both sides to agree): the sender (even
    // rank) names another offset, then another size.
    let cases = [
        ("offset", 64usize, n, 128usize, n),
        ("size", 0, n, 0, n + 16),
        ("offset (large)", 64, big + 16, 128, big + 16),
        ("size (large)", 0, big + 16, 0, big + 32),
    ];
    let mut checked = Vec::new();
    for (what, send_off, send_n, recv_off, recv_n) in cases {
        let route = comm.tuning().zero_copy_route(send_n as u64);
        if route == ZcRoute::Staged || comm.tuning().zero_copy_route(recv_n as u64) != route {
            continue;
        }
        checked.push(format!("{what} on {}", route_name(cx, send_n)));
        dst.poison(&cx.stream)?;
        cx.sync()?;
        cx.host_barrier()?;
        let r = if rank % 2 == 0 {
            let at = dst.at(send_off, send_n);
            comm.send_registered(&src.slice(..send_n), peer, at, &cx.stream)
        } else {
            comm.recv_registered(dst.at(recv_off, recv_n), peer, &cx.stream)
        };
        r.map_err(|e| e.to_string())?;
        let sync = cx.sync();
        let seen = sync
            .err()
            .or_else(|| comm.check().err().map(|e| e.to_string()));
        match seen {
            Some(e) if e.contains("does not match") => {}
            other => {
                return Err(format!(
                    "{what} mismatch: expected ZeroCopyMismatch, got {other:?}"
                ))
            }
        }
        if route == ZcRoute::CopyEngine && rank % 2 == 1 {
            // A copy already enqueued cannot be taken back: the sender's own range of this
            // buffer may hold its bytes; everything else must be untouched.
            let got = cx.read_ptr(dst.ptr, dst.bytes)?;
            let (a, b) = (send_off, send_off + send_n);
            if got[..a].iter().chain(&got[b..]).any(|&x| x != POISON) {
                return Err(format!(
                    "{what} mismatch: bytes outside the sender's range were written"
                ));
            }
        } else {
            verify(cx, &dst, 0, 0, None, &format!("{what} mismatch"))?;
        }
        cx.host_barrier()?;
    }
    // The next matching calls succeed.
    exchange(cx, &dst, 312_345, 0, 48, false, 951)?;
    exchange(cx, &dst, 2_000_001, 1, 3, true, 952)?;
    exchange(cx, &dst, big + 1, 1, 3, true, 953)?;
    if checked.is_empty() {
        return Ok(Outcome::Skip(Skip::Unavailable(format!(
            "every size ({n} B, {} B) takes the staged route here, which does not compare the \
             sides: no mismatch checked (refusals and later calls verified)",
            big + 16
        ))));
    }
    verified(Ok(format!(
        "5 bad calls refused before launch; mismatches reported on both sides ({}), nothing \
         written outside the sender's range (nothing at all on SM blocks); later calls verified",
        checked.join(", ")
    )))
}

/// Ring on 3 or more ranks: send to rank + 1, receive from rank - 1, in one kernel.
fn check_ring(cx: &Ctx) -> Detail {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    let big = large_size(cx) + 3;
    let sizes = [5usize, 65_536, (1 << 20) + 3, 3 << 20, big];
    let dst = RegBuf::new(cx, big.max(3 << 20) + 64)?;
    let mut n = 0;
    for (i, bytes) in sizes.into_iter().enumerate() {
        let tag = 960 + i as u64;
        let src = cx
            .stream
            .clone_htod(&cx.data_of(rank, tag, bytes))
            .map_err(|e| e.to_string())?;
        dst.poison(&cx.stream)?;
        cx.sync()?;
        cx.host_barrier()?;
        let at = dst.at(7, bytes);
        comm.sendrecv_registered(&src, next, at, at, prev, &cx.stream)
            .map_err(|e| e.to_string())?;
        cx.sync()?;
        let expect = cx.data_of(prev, tag, bytes);
        verify(
            cx,
            &dst,
            7,
            bytes,
            Some(&expect),
            &format!("ring {bytes} B from {prev}"),
        )?;
        cx.host_barrier()?;
        n += 1;
    }
    Ok(format!(
        "{n} ring steps (send to rank+1, receive from rank-1), 5 B to {big} B ({})",
        route_name(cx, big)
    ))
}

/// Many calls back to back without host synchronisation: sizes cycle, each call lands in its
/// own slice of the destination; the last message of every slice is verified.
fn check_back_to_back(cx: &Ctx, calls: usize) -> Detail {
    let rank = cx.comm.rank();
    let slices = 8usize;
    let big = large_size(cx);
    // Every route, interleaved.
    let sizes = [8usize, 4099, (1 << 20) + 3, 96, (5 << 20) + 7, big + 7];
    let slice = sizes.iter().max().copied().unwrap_or(0) + (1 << 20);
    let pool = slice + (16 << 20);
    // Registration is collective: the rank without a partner registers too.
    let dst = RegBuf::new(cx, slices * slice)?;
    let Some(peer) = partner(cx) else {
        return Ok("no partner".into());
    };
    let src = cx
        .stream
        .clone_htod(&cx.data_of(rank, 970, pool))
        .map_err(|e| e.to_string())?;
    dst.poison(&cx.stream)?;
    cx.sync()?;
    cx.host_barrier()?;
    let plan = |i: usize| {
        (
            sizes[i % sizes.len()],
            (i * 4097) % (pool - slice),
            i % slices,
        )
    };
    for i in 0..calls {
        let (bytes, so, s) = plan(i);
        let at = dst.at(s * slice, bytes);
        cx.comm
            .sendrecv_registered(&src.slice(so..so + bytes), peer, at, at, peer, &cx.stream)
            .map_err(|e| e.to_string())?;
    }
    cx.sync()?;
    let got = cx.read_ptr(dst.ptr, slices * slice)?;
    let theirs = cx.data_of(peer, 970, pool);
    for s in 0..slices.min(calls) {
        let last = (0..calls).rev().find(|&i| i % slices == s).unwrap_or(s);
        let (bytes, so, _) = plan(last);
        compare(
            &got[s * slice..s * slice + bytes],
            &theirs[so..so + bytes],
            &format!("call {last} ({bytes} B)"),
        )?;
    }
    cx.host_barrier()?;
    Ok(format!(
        "{calls} zero-copy exchanges back to back (8 B to {} B: {}), the last of each of {slices} slices verified",
        big + 7,
        sizes.map(|b| route_name(cx, b)).join(", ")
    ))
}

/// A captured zero-copy exchange (destination poisoned inside the graph first) replayed many
/// times; every replay verified.
fn check_graph(cx: &Ctx, replays: usize) -> Detail {
    let rank = cx.comm.rank();
    let variants = 4usize;
    // The large size a tenth as often: each replay moves and verifies 64 MiB by default.
    let sizes = [(1usize << 20) + 40, large_size(cx) + 40];
    let mut done = Vec::new();
    for (bytes, replays) in sizes.into_iter().zip([replays, replays.div_ceil(10)]) {
        // Registration is collective: the rank without a partner registers too.
        let dst = RegBuf::new(cx, bytes + 64)?;
        let Some(peer) = partner(cx) else {
            continue;
        };
        // No event tracking for these buffers: captured work must record no events.
        // SAFETY: every use of these buffers below is ordered on cx.stream and synchronised.
        unsafe { cx.comm.context().disable_event_tracking() };
        let result = graph_replays(cx, &dst, peer, rank, bytes, variants, replays);
        // SAFETY: restores the default for buffers made later.
        unsafe { cx.comm.context().enable_event_tracking() };
        result?;
        done.push(format!(
            "{replays} of {bytes} B ({})",
            route_name(cx, bytes)
        ));
    }
    if done.is_empty() {
        return Ok("no partner".into());
    }
    Ok(format!(
        "replays of captured zero-copy exchanges, poisoned in the graph, every one verified: {}",
        done.join(", ")
    ))
}

fn graph_replays(
    cx: &Ctx,
    dst: &RegBuf<'_>,
    peer: usize,
    rank: usize,
    bytes: usize,
    variants: usize,
    replays: usize,
) -> Result<(), String> {
    let pool: Vec<CudaSlice<u8>> = (0..variants)
        .map(|v| {
            cx.stream
                .clone_htod(&cx.data_of(rank, 980 + v as u64, bytes))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut src = cx
        .stream
        .alloc_zeros::<u8>(bytes)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    let graph = cx.capture(|| -> Result<(), String> {
        dst.poison(&cx.stream)?;
        let at = dst.at(32, bytes);
        cx.comm
            .sendrecv_registered(&src, peer, at, at, peer, &cx.stream)
            .map_err(|e| e.to_string())
    })?;
    let expects: Vec<Vec<u8>> = (0..variants)
        .map(|v| cx.data_of(peer, 980 + v as u64, bytes))
        .collect();
    for r in 0..replays {
        let v = (r * 3 + 1) % variants;
        cx.stream
            .memcpy_dtod(&pool[v], &mut src)
            .map_err(|e| e.to_string())?;
        cx.sync()?;
        cx.host_barrier()?;
        graph.launch().map_err(|e| e.to_string())?;
        cx.sync()?;
        verify(
            cx,
            dst,
            32,
            bytes,
            Some(&expects[v]),
            &format!("replay {r}"),
        )?;
    }
    cx.host_barrier()
}

/// All-to-all into a registered output, on both schedules (the fused kernel below the
/// copy-engine size, copy-engine exchanges from it): odd chunk sizes at an odd offset, the
/// output poisoned first and its guard bytes checked; ten calls back to back; a range past the
/// buffer refused before launch.
fn check_all_to_all(cx: &Ctx) -> Detail {
    let comm = &cx.comm;
    let (world, rank) = (comm.world_size(), comm.rank());
    let big = large_size(cx) + 24;
    let off = 40usize;
    let dst = RegBuf::new(cx, world * big + off + 64)?;
    let mut done = Vec::new();
    for (i, chunk) in [1000usize, 96 << 10, big].into_iter().enumerate() {
        let tag = 990 + i as u64;
        // Chunk p of rank r's input: data_of(r, tag * 8 + p).
        let input: Vec<u8> = (0..world)
            .flat_map(|p| cx.data_of(rank, tag * 8 + p as u64, chunk))
            .collect();
        let src = cx.stream.clone_htod(&input).map_err(|e| e.to_string())?;
        let expect: Vec<u8> = (0..world)
            .flat_map(|p| cx.data_of(p, tag * 8 + rank as u64, chunk))
            .collect();
        for calls in [1usize, 10] {
            dst.poison(&cx.stream)?;
            cx.sync()?;
            cx.host_barrier()?;
            for _ in 0..calls {
                comm.all_to_all_registered(&src, dst.at(off, world * chunk), &cx.stream)
                    .map_err(|e| e.to_string())?;
            }
            cx.sync()?;
            let what = format!("all_to_all_registered {chunk} B per peer x {calls}");
            verify(cx, &dst, off, world * chunk, Some(&expect), &what)?;
            cx.host_barrier()?;
        }
        done.push(format!("{chunk} B ({})", route_name(cx, chunk)));
    }
    // Past the end of the buffer: refused on every rank, nothing launched.
    let src = cx
        .stream
        .alloc_zeros::<u8>(world * big)
        .map_err(|e| e.to_string())?;
    match comm.all_to_all_registered(&src, dst.at(off + 128, world * big), &cx.stream) {
        Err(Error::CapacityExceeded { .. }) => {}
        other => {
            return Err(format!(
                "range past the buffer: expected a refusal, got {other:?}"
            ))
        }
    }
    cx.host_barrier()?;
    Ok(format!(
        "chunks of {} per peer at offset {off}, once and 10 times back to back, verified with guard bytes; a range past the buffer refused",
        done.join(", ")
    ))
}
