//! The protocols forced by configuration: pull, LL128 and the copy engine, alone and mixed
//! with the others on the same channels.

use cudarc::driver::{DevicePtr, DevicePtrMut};
use devcomm::p2p::{staged_config, P2PConfig, Protocol, Transfer};

use super::exchange::{
    asymmetric, back_to_back, check_received, exchange_cases, exchange_with, fresh_pair, ll128,
    replay_graph,
};
use crate::selftest::harness::{partner, Ctx};

type Check = Result<String, String>;

/// The default configuration of `bytes` with the pull protocol (staged sizes only).
fn pulled(cx: &Ctx, bytes: usize) -> P2PConfig {
    P2PConfig {
        protocol: Protocol::Pull,
        ..staged_config(bytes as u64, cx.comm.tuning().p2p_limits())
    }
}

/// The pull protocol at staged sizes, one way and both ways, then back-to-back calls that
/// alternate push, pull and low-latency on the same channels.
pub(super) fn check_pull(cx: &Ctx, calls: usize) -> Check {
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
        (call % 3 == 1 && bytes > cx.comm.tuning().p2p_limits().ll_max_bytes as usize)
            .then(|| pulled(cx, bytes))
    })?;
    Ok(format!(
        "{n} pulled exchanges (1 MiB to 256 MiB, odd sizes and alignments, one-way and both \
         ways, and one rank's sendrecv against the other's send then recv); {mixed} \
         back-to-back calls mixing pull, push and low-latency, all verified"
    ))
}

/// LL128 lines forced at sizes from 1 B to its largest message (partial lines, a line per
/// block, odd alignments), one way and both ways, on few and many blocks of both thread
/// counts; then back-to-back calls that alternate LL128, LL and the staged protocols on the
/// same call counters and parities, every call verified.
pub(super) fn check_ll128(cx: &Ctx, calls: usize) -> Check {
    let max = cx.comm.tuning().p2p_limits().ll128_max_bytes as usize;
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
        cx.comm.tuning().p2p_limits().max_blocks.min(32)
    ))
}

/// The copy-engine protocol with `blocks` receiver blocks (at most the window's) and chunks of
/// `chunk` bytes.
fn by_copy_engine(cx: &Ctx, blocks: u32, chunk: u64) -> P2PConfig {
    P2PConfig {
        protocol: Protocol::CopyEngine,
        blocks: blocks.min(cx.comm.tuning().p2p_limits().max_blocks),
        threads: 512,
        chunk_bytes: chunk,
    }
}

/// Copy-engine messages from 1 B to 256 MiB (one chunk, several, more chunks than slots, odd
/// sizes and alignments), one way and both ways; one rank's copy engine against the other's
/// SMs in the same launch; back-to-back calls mixing the copy engine with the staged and
/// low-latency protocols on the same staging; 100 replays of a captured graph.
pub(super) fn check_copy_engine(cx: &Ctx, calls: usize) -> Check {
    let slot = cx.comm.tuning().p2p_limits().ce_slot_bytes();
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
        3 if bytes > cx.comm.tuning().p2p_limits().ll_max_bytes as usize => Some(pulled(cx, bytes)),
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
