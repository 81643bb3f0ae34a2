//! Send/recv at every size and type, rings, the negotiated large messages, back-to-back
//! calls, graph replays, a ring all-gather of sendrecv calls, and refusals of bad calls.

use cudarc::driver::{DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use devcomm::p2p::{default_config, P2PConfig, Protocol, Transfer, CE_DEFAULT_MIN};
use devcomm::Error;

use super::exchange::{
    asymmetric, back_to_back, check_received, exchange, fresh_pair, ll128, replay_graph,
};
use crate::selftest::harness::{compare, partner, poisoned, ring_gather, Ctx, POISON, SIZES};

type Check = Result<String, String>;

pub(super) fn check_sizes(cx: &Ctx) -> Check {
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

pub(super) fn check_types(cx: &Ctx) -> Check {
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

pub(super) fn check_ring(cx: &Ctx) -> Check {
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
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
pub(super) fn check_negotiated(cx: &Ctx) -> Check {
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

pub(super) fn check_back_to_back(cx: &Ctx, calls: usize) -> Check {
    let n = back_to_back(cx, calls, &|_, _| None)?;
    Ok(format!(
        "{n} back-to-back sendrecv calls of mixed sizes (8 B to 1 MiB), every one verified"
    ))
}

pub(super) fn check_graph(cx: &Ctx, replays: usize) -> Check {
    replay_graph(cx, replays, &[1000, (1 << 20) + 8], None)?;
    Ok(format!("{replays} replays of a captured sendrecv (1000 B low-latency + 1 MiB bulk), every one verified"))
}

/// A ring all-gather composed from `Comm::sendrecv` (each call sends to the next rank and
/// receives from the previous one, over whatever route each link takes).
pub(super) fn check_ring_gather(cx: &Ctx) -> Check {
    let world = cx.comm.world_size();
    for (i, n) in [1usize, 333, (1 << 20) + 3].into_iter().enumerate() {
        let tag = 600 + i as u64;
        let (src, mut dst) = fresh_pair(cx, tag, n, n * world)?;
        ring_gather(&cx.comm, &src, &mut dst.slice_mut(..), &cx.stream)
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
        "ring all-gather of sendrecv calls over {world} ranks: 1 B, 333 B, 1 MiB + 3 per rank"
    ))
}

pub(super) fn check_guard(cx: &Ctx) -> Check {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let peer = (rank + 1) % world;
    let limits = *comm.tuning().p2p_limits();
    let mut dst = poisoned(cx, 4096)?;
    let (dp, _d) = dst.device_ptr_mut(&cx.stream);
    let base = P2PConfig {
        protocol: Protocol::Bulk,
        ..default_config(64 << 20, &limits, comm.tuning().p2p_switches())
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
