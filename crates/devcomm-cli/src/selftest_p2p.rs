//! `devcomm selftest` checks of send/recv and the ring all-gather: fresh random data, poisoned
//! outputs, every byte compared with the sender's data regenerated on the host.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use devcomm::p2p::{default_config, staged_config, P2PConfig, Protocol, Transfer, CE_DEFAULT_MIN};
use devcomm::Error;

use crate::selftest::Ctx;

type Check = Result<String, String>;
pub(crate) const POISON: u8 = 0xA5;

/// Partner for pairwise checks: 0<->1, 2<->3, ...; None for an odd last rank.
pub(crate) fn partner(cx: &Ctx) -> Option<usize> {
    let (r, w) = (cx.comm.rank(), cx.comm.world_size());
    let p = r ^ 1;
    (p < w).then_some(p)
}

fn poisoned(cx: &Ctx, bytes: usize) -> Result<CudaSlice<u8>, String> {
    cx.stream
        .clone_htod(&vec![POISON; bytes])
        .map_err(|e| e.to_string())
}

/// Message sizes of the size checks: 1 B to 1 GiB, odd sizes included.
pub(crate) const SIZES: &[usize] = &[
    1,
    7,
    8,
    13,
    4095,
    4099,
    65_536,
    65_537,
    262_147,
    (1 << 20) + 5,
    (8 << 20) + 17,
    64 << 20,
    (256 << 20) + 1,
    1 << 30,
];

/// This rank's fresh source (`data_of(rank, tag, src_bytes)`) and a poisoned destination of
/// `dst_bytes`, both ready on the device and every rank past a barrier.
fn fresh_pair(
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
fn check_received(
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

pub(crate) fn compare(got: &[u8], expect: &[u8], what: &str) -> Result<(), String> {
    if got.len() != expect.len() {
        return Err(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            expect.len()
        ));
    }
    match got.iter().zip(expect).position(|(a, b)| a != b) {
        Some(i) => Err(format!(
            "{what}: byte {i} is {:#x}, expected {:#x}",
            got[i], expect[i]
        )),
        None => Ok(()),
    }
}

/// The partner and whether this rank sends and receives: both ways, or even ranks send and odd
/// ranks receive. `None` for an odd last rank.
pub(crate) fn roles(cx: &Ctx, both: bool) -> Option<(usize, bool, bool)> {
    let rank = cx.comm.rank();
    partner(cx).map(|peer| (peer, both || rank % 2 == 0, both || rank % 2 == 1))
}

/// One send/recv between partners at `bytes`, source and destination at byte offsets
/// `src_off`/`dst_off` (odd alignments), one-way (even rank sends) or both ways. Checks that the
/// bytes around the destination stay poisoned.
fn exchange(
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
fn exchange_with(
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

pub(crate) fn check_sizes(cx: &Ctx) -> Check {
    let sizes = SIZES;
    let mut n = 0;
    for (i, &bytes) in sizes.iter().enumerate() {
        for both in [false, true] {
            let (so, doff) = if i % 2 == 0 { (0, 0) } else { (3, 5) };
            exchange(
                cx,
                bytes,
                so,
                doff,
                both,
                100 + i as u64 + if both { 50 } else { 0 },
            )?;
            n += 1;
        }
    }
    Ok(format!(
        "{n} exchanges, 1 B to 1 GiB, odd sizes and alignments, one-way and both ways"
    ))
}

fn typed<T: DeviceRepr + ValidAsZeroBits + Copy + PartialEq + std::fmt::Debug>(
    cx: &Ctx,
    make: impl Fn(u64) -> T,
    len: usize,
) -> Result<(), String> {
    let Some(peer) = partner(cx) else {
        return cx.host_barrier();
    };
    let rank = cx.comm.rank() as u64;
    let seed = cx.seed;
    let mine: Vec<T> = (0..len as u64)
        .map(|i| make(seed ^ (rank << 40) ^ i))
        .collect();
    let theirs: Vec<T> = (0..len as u64)
        .map(|i| make(seed ^ ((peer as u64) << 40) ^ i))
        .collect();
    let src = cx.stream.clone_htod(&mine).map_err(|e| e.to_string())?;
    let mut dst = cx.stream.alloc_zeros::<T>(len).map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    cx.comm
        .sendrecv(&src, peer, &mut dst, peer, &cx.stream)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
    if got != theirs {
        return Err(format!(
            "{} elements of {}: mismatch",
            len,
            std::any::type_name::<T>()
        ));
    }
    cx.host_barrier()
}

pub(crate) fn check_types(cx: &Ctx) -> Check {
    let mix = |x: u64| x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    typed(cx, |x| mix(x) as u8, 100_003)?;
    typed(cx, |x| mix(x) as u16, 77_777)?;
    typed(cx, |x| mix(x) as i32, 300_001)?;
    typed(cx, mix, 5)?;
    typed(cx, |x| (mix(x) % 1_000_000) as f32 * 0.25, 1 << 20)?;
    typed(cx, |x| (mix(x) % 1_000_000) as f64 * 0.125, 123_457)?;
    typed(cx, |x| mix(x) as i64, 3 << 20)?;
    Ok("u8, u16, i32, u64, f32, f64, i64 through the typed API".into())
}

pub(crate) fn check_ring(cx: &Ctx) -> Check {
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    if world < 3 {
        return Ok("needs 3 or more ranks; skipped".into());
    }
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    let large = CE_DEFAULT_MIN as usize + 1; // negotiated by every rank: both roles, staged
    for (i, bytes) in [13usize, 40_000, (3 << 20) + 1, large]
        .into_iter()
        .enumerate()
    {
        let tag = 300 + i as u64;
        let (src, mut dst) = fresh_pair(cx, tag, bytes, bytes)?;
        cx.comm
            .sendrecv(&src, next, &mut dst, prev, &cx.stream)
            .map_err(|e| e.to_string())?;
        check_received(cx, &dst, prev, tag, &format!("ring {bytes} B from {prev}"))?;
        cx.host_barrier()?;
    }
    Ok(format!(
        "send to {next}, receive from {prev}: 13 B, 40 KB, 3 MiB, {large} B"
    ))
}

/// Large messages on the defaults, whose layout each launch negotiates with its peer
/// (docs/PROTOCOL.md, "Copy engine"): one way (both sides alone in their launch: the copy
/// engines), both ways in one launch on both sides (the staged protocol), and one side both
/// ways in one launch against one-way launches on the other (the copy-engine layout, moved by
/// SMs on the first side), in turn and twice over, so that the negotiation's sequence numbers
/// carry over between calls of every kind.
pub(crate) fn check_negotiated(cx: &Ctx) -> Check {
    let bytes = CE_DEFAULT_MIN as usize + 13;
    for round in 0..2u64 {
        let tag = 1200 + 10 * round;
        let step = |what: &str, r: Result<(), String>| {
            r.map_err(|e| format!("round {round}, {what}: {e}"))
        };
        step("one way", exchange(cx, bytes, 3, 5, false, tag))?;
        step("one launch against two", asymmetric(cx, bytes, tag + 1))?;
        step("both ways", exchange(cx, bytes, 0, 0, true, tag + 2))?;
        step(
            "one launch against two, +7 B",
            asymmetric(cx, bytes + 7, tag + 3),
        )?;
        step(
            "one way, +16 B",
            exchange(cx, bytes + 16, 0, 0, false, tag + 4),
        )?;
    }
    Ok(format!(
        "{bytes} B and up on the defaults: one way, both ways, one launch against two, in \
         turn, twice, all verified"
    ))
}

/// The default configuration of `bytes` with the pull protocol (staged sizes only).
fn pulled(cx: &Ctx, bytes: usize) -> P2PConfig {
    P2PConfig {
        protocol: Protocol::Pull,
        ..staged_config(bytes as u64, cx.comm.p2p_limits())
    }
}

/// The pull protocol at staged sizes, one way and both ways, then back-to-back calls that
/// alternate push, pull and low-latency on the same channels.
pub(crate) fn check_pull(cx: &Ctx, calls: usize) -> Check {
    let sizes = [
        (1usize << 20) + 3,
        (7 << 20) + 5,
        64 << 20,
        (256 << 20) + 16,
    ];
    let mut n = 0;
    for (i, &bytes) in sizes.iter().enumerate() {
        for both in [false, true] {
            let offs = if i % 2 == 0 { (0, 0) } else { (5, 3) };
            let tag = 700 + i as u64 + if both { 50 } else { 0 };
            exchange_with(cx, bytes, offs, both, tag, Some(pulled(cx, bytes)))?;
            n += 1;
        }
    }
    for (i, bytes) in [(4usize << 20) + 7, 64 << 20].into_iter().enumerate() {
        asymmetric(cx, bytes, 760 + i as u64)?;
        n += 1;
    }
    let mixed = back_to_back(cx, calls, &|call, bytes| {
        (call % 3 == 1 && bytes > cx.comm.p2p_limits().ll_max_bytes as usize)
            .then(|| pulled(cx, bytes))
    })?;
    Ok(format!(
        "{n} pulled exchanges (1 MiB to 256 MiB, odd sizes and alignments, one-way and both \
         ways, and one rank's sendrecv against the other's send then recv); {mixed} \
         back-to-back calls mixing pull, push and low-latency, all verified"
    ))
}

/// LL128 with `blocks` blocks of `threads` threads (at most the window's blocks, fewer on a
/// GPU with few SMs: `p2p::fit_to_sms`).
fn ll128(cx: &Ctx, blocks: u32, threads: u32) -> P2PConfig {
    P2PConfig {
        protocol: Protocol::LowLatency128,
        blocks: blocks.min(cx.comm.p2p_limits().max_blocks),
        threads,
        chunk_bytes: 0,
    }
}

/// LL128 lines forced at sizes from 1 B to its largest message (partial lines, a line per
/// block, odd alignments), one way and both ways, on few and many blocks of both thread
/// counts; then back-to-back calls that alternate LL128, LL and the staged protocols on the
/// same call counters and parities, every call verified.
pub(crate) fn check_ll128(cx: &Ctx, calls: usize) -> Check {
    let max = cx.comm.p2p_limits().ll128_max_bytes as usize;
    let cases = [
        (1usize, ll128(cx, 1, 256)),
        (119, ll128(cx, 1, 512)),
        (121, ll128(cx, 2, 256)),
        (32 * 120 - 1, ll128(cx, 32, 512)),
        (100_003, ll128(cx, 8, 256)),
        ((1 << 20) + 5, ll128(cx, 32, 512)),
        ((3 << 20) + 17, ll128(cx, 16, 256)),
        (max, ll128(cx, 32, 512)),
    ];
    let n = exchange_cases(cx, &cases, 800)?;
    let mixed = back_to_back(cx, calls, &|call, _| {
        (call % 4 == 2).then(|| ll128(cx, 8, 512))
    })?;
    Ok(format!(
        "{n} LL128 exchanges (1 B to {} MiB, odd sizes and alignments, 1 to {} blocks, one way \
         and both ways); {mixed} back-to-back calls mixing LL128, LL and staged, all verified",
        max >> 20,
        cx.comm.p2p_limits().max_blocks.min(32)
    ))
}

/// Each (size, configuration) one way and both ways, odd offsets on every other case; tags
/// from `tag0`. Returns the number of exchanges.
fn exchange_cases(cx: &Ctx, cases: &[(usize, P2PConfig)], tag0: u64) -> Result<usize, String> {
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

/// The copy-engine protocol with `blocks` receiver blocks (at most the window's) and chunks of
/// `chunk` bytes.
fn by_copy_engine(cx: &Ctx, blocks: u32, chunk: u64) -> P2PConfig {
    P2PConfig {
        protocol: Protocol::CopyEngine,
        blocks: blocks.min(cx.comm.p2p_limits().max_blocks),
        threads: 512,
        chunk_bytes: chunk,
    }
}

/// Copy-engine messages from 1 B to 256 MiB (one chunk, several, more chunks than slots, odd
/// sizes and alignments), one way and both ways; one rank's copy engine against the other's
/// SMs in the same launch; back-to-back calls mixing the copy engine with the staged and
/// low-latency protocols on the same staging; 100 replays of a captured graph.
pub(crate) fn check_copy_engine(cx: &Ctx, calls: usize) -> Check {
    let slot = cx.comm.p2p_limits().ce_slot_bytes();
    let cases = [
        (1usize, by_copy_engine(cx, 1, 64 << 10)),
        (100_003, by_copy_engine(cx, 2, 64 << 10)),
        ((5 << 20) + 7, by_copy_engine(cx, 4, 1 << 20)),
        ((64 << 20) + 16, by_copy_engine(cx, 8, slot)),
        ((256 << 20) + 3, by_copy_engine(cx, 16, slot)),
    ];
    let n = exchange_cases(cx, &cases, 900)?;
    let mixed = back_to_back(cx, calls, &|call, bytes| match call % 5 {
        1 => Some(by_copy_engine(cx, 4, 256 << 10)),
        3 if bytes > cx.comm.p2p_limits().ll_max_bytes as usize => Some(pulled(cx, bytes)),
        _ => None,
    })?;
    mixed_launch(cx)?;
    asymmetric_copy_engine(cx)?;
    replay_graph(
        cx,
        100,
        &[(3 << 20) + 1, 1000],
        Some(by_copy_engine(cx, 4, 1 << 20)),
    )?;
    Ok(format!(
        "{n} copy-engine exchanges (1 B to 256 MiB, 1 to 17 chunks, odd sizes and alignments, \
         one way and both ways); {mixed} back-to-back calls mixing the copy engine, staged and \
         low-latency; one side both ways in one launch against one-way launches; 100 graph \
         replays, all verified"
    ))
}

/// One launch per rank that sends by one protocol and receives by another: the even rank
/// sends 5 MiB + 1 by the copy engine and receives 3 MiB + 5 staged, the odd rank the reverse.
fn mixed_launch(cx: &Ctx) -> Result<(), String> {
    let Some(peer) = partner(cx) else {
        return cx.host_barrier();
    };
    let (ce_bytes, sm_bytes) = ((5usize << 20) + 1, (3usize << 20) + 5);
    let even = cx.comm.rank() % 2 == 0;
    let (send_bytes, recv_bytes) = if even {
        (ce_bytes, sm_bytes)
    } else {
        (sm_bytes, ce_bytes)
    };
    let tag = 990;
    let (src, mut dst) = fresh_pair(cx, tag, send_bytes, recv_bytes)?;
    let config = |ce: bool| ce.then(|| by_copy_engine(cx, 4, 1 << 20));
    {
        let (sp, _s) = src.device_ptr(&cx.stream);
        let (dp, _d) = dst.device_ptr_mut(&cx.stream);
        let send = Transfer {
            ptr: sp,
            bytes: send_bytes as u64,
            peer,
            config: config(even),
        };
        let recv = Transfer {
            ptr: dp,
            bytes: recv_bytes as u64,
            peer,
            config: config(!even),
        };
        // SAFETY: src holds send_bytes and dst recv_bytes; both live until the sync below.
        unsafe { cx.comm.sendrecv_raw(Some(send), Some(recv), &cx.stream) }
            .map_err(|e| e.to_string())?;
    }
    check_received(
        cx,
        &dst,
        peer,
        tag,
        "copy engine one way, staged the other, one launch",
    )?;
    cx.host_barrier()
}

/// Copy-engine messages both ways between partners where the even rank sends and receives in
/// one launch (so its engines are `DEVCOMM_P2P_CE_BOTH`'s: by default SMs push, its copy
/// engine pulls) and the odd rank in two one-way launches (its copy engine pushes and pulls):
/// each side's engine is its own choice over the same slots.
fn asymmetric_copy_engine(cx: &Ctx) -> Result<(), String> {
    let Some(peer) = partner(cx) else {
        return cx.host_barrier();
    };
    let bytes = (5usize << 20) + 3; // six chunks of 1 MiB: three pushed, three pulled
    let tag = 995;
    let (src, mut dst) = fresh_pair(cx, tag, bytes, bytes)?;
    {
        let (sp, _s) = src.device_ptr(&cx.stream);
        let (dp, _d) = dst.device_ptr_mut(&cx.stream);
        let config = Some(by_copy_engine(cx, 4, 1 << 20));
        let send = Transfer {
            ptr: sp,
            bytes: bytes as u64,
            peer,
            config,
        };
        let recv = Transfer { ptr: dp, ..send };
        let e = |x: devcomm::Error| x.to_string();
        // SAFETY: src and dst hold `bytes` each and live until the check below synchronises.
        unsafe {
            if cx.comm.rank() % 2 == 0 {
                cx.comm
                    .sendrecv_raw(Some(send), Some(recv), &cx.stream)
                    .map_err(e)?;
            } else {
                cx.comm
                    .sendrecv_raw(Some(send), None, &cx.stream)
                    .map_err(e)?;
                cx.comm
                    .sendrecv_raw(None, Some(recv), &cx.stream)
                    .map_err(e)?;
            }
        }
    }
    let what = "copy engine, one launch both ways against one-way launches";
    check_received(cx, &dst, peer, tag, what)?;
    cx.host_barrier()
}

/// Both ways between partners where the even rank calls `sendrecv` (so it pushes: it also
/// receives from its peer) and the odd rank calls `send`, then `recv` (a one-way launch, so
/// it pulls): each receiver must follow the sender's choice.
fn asymmetric(cx: &Ctx, bytes: usize, tag: u64) -> Result<(), String> {
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

pub(crate) fn check_back_to_back(cx: &Ctx, calls: usize) -> Check {
    let n = back_to_back(cx, calls, &|_, _| None)?;
    Ok(format!(
        "{n} back-to-back sendrecv calls of mixed sizes (8 B to 1 MiB), every one verified"
    ))
}

/// `calls` back-to-back sendrecv calls of mixed sizes both ways with the partner, each call's
/// configuration from `config(call, bytes)` (None: the defaults); every call verified.
fn back_to_back(
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

pub(crate) fn check_graph(cx: &Ctx, replays: usize) -> Check {
    replay_graph(cx, replays, &[1000, (1 << 20) + 8], None)?;
    Ok(format!("{replays} replays of a captured sendrecv (1000 B low-latency + 1 MiB bulk), every one verified"))
}

/// Captures one sendrecv with the partner per size in `sizes` (configuration `config`, or the
/// defaults) into a graph and replays it `replays` times on fresh data, verifying each replay.
fn replay_graph(
    cx: &Ctx,
    replays: usize,
    sizes: &[usize],
    config: Option<P2PConfig>,
) -> Result<(), String> {
    let Some(peer) = partner(cx) else {
        return cx.host_barrier();
    };
    let rank = cx.comm.rank();
    let total: usize = sizes.iter().sum();
    let variants = 8;
    let pool: Vec<CudaSlice<u8>> = (0..variants)
        .map(|v| {
            cx.stream
                .clone_htod(&cx.data_of(rank, 500 + v as u64, total))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let expects: Vec<Vec<u8>> = (0..variants)
        .map(|v| cx.data_of(peer, 500 + v as u64, total))
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

pub(crate) fn check_all_gather(cx: &Ctx) -> Check {
    let world = cx.comm.world_size();
    for (i, n) in [1usize, 333, (1 << 20) + 3].into_iter().enumerate() {
        let tag = 600 + i as u64;
        let (src, mut dst) = fresh_pair(cx, tag, n, n * world)?;
        cx.comm
            .all_gather_ring(&src, &mut dst, &cx.stream)
            .map_err(|e| e.to_string())?;
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
        for r in 0..world {
            compare(
                &got[r * n..(r + 1) * n],
                &cx.data_of(r, tag, n),
                &format!("all-gather {n} B, block of rank {r}"),
            )?;
        }
        cx.host_barrier()?;
    }
    Ok(format!(
        "ring all-gather over {world} ranks: 1 B, 333 B, 1 MiB + 3 per rank"
    ))
}

pub(crate) fn check_guard(cx: &Ctx) -> Check {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let peer = (rank + 1) % world;
    let limits = *comm.p2p_limits();
    let mut dst = poisoned(cx, 4096)?;
    let (dp, _d) = dst.device_ptr_mut(&cx.stream);
    let base = P2PConfig {
        protocol: Protocol::Bulk,
        ..default_config(64 << 20, &limits)
    };
    let cases: Vec<(&str, Transfer)> = vec![
        (
            "too many blocks",
            Transfer {
                ptr: dp,
                bytes: 4096,
                peer,
                config: Some(P2PConfig {
                    blocks: limits.max_blocks + 1,
                    ..base
                }),
            },
        ),
        (
            "chunk above the staging slot",
            Transfer {
                ptr: dp,
                bytes: 4096,
                peer,
                config: Some(P2PConfig {
                    chunk_bytes: limits.slot_bytes * 2,
                    ..base
                }),
            },
        ),
        (
            "low-latency message above its buffer",
            Transfer {
                ptr: dp,
                bytes: limits.ll_max_bytes + 16,
                peer,
                config: Some(P2PConfig {
                    protocol: Protocol::LowLatency,
                    ..base
                }),
            },
        ),
        (
            "LL128 message above its buffer",
            Transfer {
                ptr: dp,
                bytes: limits.ll128_max_bytes + 1,
                peer,
                config: Some(ll128(cx, 8, 512)),
            },
        ),
        (
            "peer is this rank",
            Transfer {
                ptr: dp,
                bytes: 4096,
                peer: rank,
                config: None,
            },
        ),
        (
            "peer out of range",
            Transfer {
                ptr: dp,
                bytes: 4096,
                peer: world,
                config: None,
            },
        ),
    ];
    for (what, t) in cases {
        // SAFETY: every case is refused before launch (checked below), so nothing is written.
        match unsafe { comm.sendrecv_raw(None, Some(t), &cx.stream) } {
            Err(Error::InvalidArgument { .. }) | Err(Error::CapacityExceeded { .. }) => {}
            Err(other) => return Err(format!("{what}: unexpected error {other}")),
            Ok(()) => return Err(format!("{what}: was accepted")),
        }
    }
    drop(_d);
    cx.sync()?;
    let got = cx.stream.clone_dtoh(&dst).map_err(|e| e.to_string())?;
    if got.iter().any(|&b| b != POISON) {
        return Err("a refused call wrote into the destination".into());
    }
    cx.host_barrier()?;
    Ok("6 bad calls refused before launch; destination untouched".into())
}
