//! The exchanges the send/recv checks are made of: fresh data and poisoned destinations,
//! one message between partners (odd offsets, guard bytes), back-to-back calls, graph replays.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use devcomm::p2p::{P2PConfig, Protocol, Transfer};
use devcomm::Error;

use crate::selftest::harness::{compare, partner, poisoned, roles, Ctx, POISON};

/// This rank's fresh source (`data_of(rank, tag, src_bytes)`) and a poisoned destination of
/// `dst_bytes`, both ready on the device and every rank past a barrier.
pub(super) fn fresh_pair(
    cx: &Ctx,
    tag: u64,
    src_bytes: usize,
    dst_bytes: usize,
) -> Result<(CudaSlice<u8>, CudaSlice<u8>), String> {
    let src = cx
        .stream
        .clone_htod(&cx.data_of(cx.comm.rank(), tag, src_bytes))
        .map_err(|e| e.to_string())?;
    let dst = poisoned(cx, dst_bytes)?;
    cx.sync()?;
    cx.host_barrier()?;
    Ok((src, dst))
}

/// Waits for the stream, then checks that `dst` holds what rank `from` generated with `tag`.
pub(super) fn check_received(
    cx: &Ctx,
    dst: &CudaSlice<u8>,
    from: usize,
    tag: u64,
    what: &str,
) -> Result<(), String> {
    cx.sync()?;
    let got = cx.stream.clone_dtoh(dst).map_err(|e| e.to_string())?;
    compare(&got, &cx.data_of(from, tag, got.len()), what)
}

/// One send/recv between partners at `bytes`, source and destination at byte offsets
/// `src_off`/`dst_off` (odd alignments), one-way (even rank sends) or both ways. Checks that the
/// bytes around the destination stay poisoned.
pub(super) fn exchange(
    cx: &Ctx,
    bytes: usize,
    src_off: usize,
    dst_off: usize,
    both: bool,
    tag: u64,
) -> Result<(), String> {
    exchange_with(cx, bytes, (src_off, dst_off), both, tag, None)
}

/// [`exchange`] with an explicit configuration (the same on both ranks), or the defaults.
pub(super) fn exchange_with(
    cx: &Ctx,
    bytes: usize,
    (src_off, dst_off): (usize, usize),
    both: bool,
    tag: u64,
    config: Option<P2PConfig>,
) -> Result<(), String> {
    let Some((peer, sends, receives)) = roles(cx, both) else {
        return cx.host_barrier();
    };
    let guard = 64;
    let (src, mut dst) = fresh_pair(cx, tag, src_off + bytes, dst_off + bytes + guard)?;
    {
        let (sp, _s) = src.device_ptr(&cx.stream);
        let (dp, _d) = dst.device_ptr_mut(&cx.stream);
        let t = |ptr: u64| Transfer {
            ptr,
            bytes: bytes as u64,
            peer,
            config,
        };
        let send = sends.then(|| t(sp + src_off as u64));
        let recv = receives.then(|| t(dp + dst_off as u64));
        // SAFETY: both buffers hold offset + bytes (+ guard) and live until the sync below.
        unsafe { cx.comm.sendrecv_raw(send, recv, &cx.stream) }.map_err(|e| e.to_string())?;
    }
    cx.sync()?;
    let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
    let what = format!("{bytes} B (src+{src_off}, dst+{dst_off}) from {peer}");
    if receives {
        let expect = &cx.data_of(peer, tag, src_off + bytes)[src_off..];
        compare(&got[dst_off..dst_off + bytes], expect, &what)?;
    }
    let outside = got[..dst_off]
        .iter()
        .chain(&got[dst_off + if receives { bytes } else { 0 }..]);
    if outside.clone().any(|&b| b != POISON) {
        return Err(format!(
            "{what}: bytes outside the destination were written"
        ));
    }
    cx.host_barrier()
}

/// Each (size, configuration) one way and both ways, odd offsets on every other case; tags
/// from `tag0`. Returns the number of exchanges.
pub(super) fn exchange_cases(cx: &Ctx, cases: &[(usize, P2PConfig)], tag0: u64) -> Result<usize, String> {
    let mut n = 0;
    for (i, &(bytes, config)) in cases.iter().enumerate() {
        for both in [false, true] {
            let offs = if i % 2 == 0 { (0, 0) } else { (3, 5) };
            let tag = tag0 + i as u64 + if both { 50 } else { 0 };
            exchange_with(cx, bytes, offs, both, tag, Some(config))?;
            n += 1;
        }
    }
    Ok(n)
}

/// LL128 with `blocks` blocks of `threads` threads (at most the window's blocks, fewer on a
/// GPU with few SMs: `p2p::fit_to_sms`).
pub(super) fn ll128(cx: &Ctx, blocks: u32, threads: u32) -> P2PConfig {
    P2PConfig {
        protocol: Protocol::LowLatency128,
        blocks: blocks.min(cx.comm.tuning().p2p_limits().max_blocks),
        threads,
        chunk_bytes: 0,
    }
}

/// Both ways between partners where the even rank calls `sendrecv` (so it pushes: it also
/// receives from its peer) and the odd rank calls `send`, then `recv` (a one-way launch, so
/// it pulls): each receiver must follow the sender's choice.
pub(super) fn asymmetric(cx: &Ctx, bytes: usize, tag: u64) -> Result<(), String> {
    let Some(peer) = partner(cx) else {
        return cx.host_barrier();
    };
    let rank = cx.comm.rank();
    let (src, mut dst) = fresh_pair(cx, tag, bytes, bytes)?;
    let e = |x: devcomm::Error| x.to_string();
    if rank % 2 == 0 {
        cx.comm
            .sendrecv(&src, peer, &mut dst, peer, &cx.stream)
            .map_err(e)?;
    } else {
        cx.comm.send(&src, peer, &cx.stream).map_err(e)?;
        cx.comm.recv(&mut dst, peer, &cx.stream).map_err(e)?;
    }
    let what = format!("{bytes} B from {peer} (sendrecv against send, recv)");
    check_received(cx, &dst, peer, tag, &what)?;
    cx.host_barrier()
}

/// `calls` back-to-back sendrecv calls of mixed sizes both ways with the partner, each call's
/// configuration from `config(call, bytes)` (None: the defaults); every call verified.
pub(super) fn back_to_back(
    cx: &Ctx,
    calls: usize,
    config: &dyn Fn(usize, usize) -> Option<P2PConfig>,
) -> Result<usize, String> {
    let Some(peer) = partner(cx) else {
        cx.host_barrier()?;
        return Ok(0);
    };
    let rank = cx.comm.rank();
    let sizes = [8usize, 4097, 100_000, (1 << 20) + 3, 24];
    let slots = 32;
    let stride = (1 << 20) + 64;
    let src = cx
        .stream
        .clone_htod(&cx.data_of(rank, 400, stride + 4096))
        .map_err(|e| e.to_string())?;
    let mut dst = poisoned(cx, slots * stride)?;
    let expect_all = cx.data_of(peer, 400, stride + 4096);
    cx.sync()?;
    cx.host_barrier()?;
    let mut pending: Vec<(usize, usize, usize)> = Vec::new(); // (slot, src offset, bytes)
    for call in 0..calls {
        let bytes = sizes[call % sizes.len()];
        let off = (call * 7) % 4096;
        let slot = call % slots;
        {
            let (sp, _s) = src.device_ptr(&cx.stream);
            let (dp, _d) = dst.device_ptr_mut(&cx.stream);
            let t = |ptr: u64| Transfer {
                ptr,
                bytes: bytes as u64,
                peer,
                config: config(call, bytes),
            };
            // SAFETY: offsets stay inside src (stride + 4096) and inside dst's slot.
            unsafe {
                cx.comm.sendrecv_raw(
                    Some(t(sp + off as u64)),
                    Some(t(dp + (slot * stride) as u64)),
                    &cx.stream,
                )
            }
            .map_err(|e| e.to_string())?;
        }
        pending.push((slot, off, bytes));
        if slot == slots - 1 || call + 1 == calls {
            cx.sync()?;
            let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
            for &(s, o, b) in &pending {
                let region = &got[s * stride..s * stride + b];
                compare(
                    region,
                    &expect_all[o..o + b],
                    &format!("call of {b} B in slot {s}"),
                )?;
            }
            pending.clear();
        }
    }
    cx.host_barrier()?;
    Ok(calls)
}

/// Captures one sendrecv with the partner per size in `sizes` (configuration `config`, or the
/// defaults) into a graph and replays it `replays` times on fresh data, verifying each replay.
pub(super) fn replay_graph(
    cx: &Ctx,
    replays: usize,
    sizes: &[usize],
    config: Option<P2PConfig>,
) -> Result<(), String> {
    let Some(peer) = partner(cx) else {
        return cx.host_barrier();
    };
    replay_graph_with(cx, peer, replays, sizes, config, 500)
}

/// [`replay_graph`] with `peer` (the partner of every rank that calls it), the source
/// variants drawn with data tags `tag..tag + 8` (the network checks use it too).
pub(crate) fn replay_graph_with(
    cx: &Ctx,
    peer: usize,
    replays: usize,
    sizes: &[usize],
    config: Option<P2PConfig>,
    tag: u64,
) -> Result<(), String> {
    let rank = cx.comm.rank();
    let total: usize = sizes.iter().sum();
    let variants = 8;
    let pool: Vec<CudaSlice<u8>> = (0..variants)
        .map(|v| cx.stream.clone_htod(&cx.data_of(rank, tag + v as u64, total)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let expects: Vec<Vec<u8>> = (0..variants)
        .map(|v| cx.data_of(peer, tag + v as u64, total))
        .collect();
    let mut src = cx
        .stream
        .alloc_zeros::<u8>(total)
        .map_err(|e| e.to_string())?;
    let mut dst = poisoned(cx, total)?;
    cx.sync()?;
    cx.host_barrier()?;
    // Raw addresses are taken before capturing, so that cudarc's event tracking records
    // nothing inside the graph.
    let sp = {
        let (p, _s) = src.device_ptr(&cx.stream);
        p
    };
    let dp = {
        let (p, _d) = dst.device_ptr_mut(&cx.stream);
        p
    };
    cx.sync()?;
    let graph = cx.capture(|| -> Result<(), Error> {
        let mut off = 0u64;
        for &b in sizes {
            let t = |ptr: u64| Transfer {
                ptr: ptr + off,
                bytes: b as u64,
                peer,
                config,
            };
            // SAFETY: src and dst hold `total` bytes and outlive the graph's replays below.
            unsafe { cx.comm.sendrecv_raw(Some(t(sp)), Some(t(dp)), &cx.stream) }?;
            off += b as u64;
        }
        Ok(())
    })?;
    for r in 0..replays {
        let v = (r * 5 + 3) % variants;
        cx.stream
            .memcpy_dtod(&pool[v], &mut src)
            .map_err(|e| e.to_string())?;
        cx.stream
            .memset_zeros(&mut dst)
            .map_err(|e| e.to_string())?;
        cx.sync()?;
        cx.host_barrier()?;
        graph.launch().map_err(|e| e.to_string())?;
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
        compare(&got, &expects[v], &format!("replay {r}"))?;
    }
    cx.host_barrier()
}
