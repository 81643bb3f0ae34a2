//! All-to-all-v with device-resident counts: random count matrices, back-to-back calls, graph
//! replays with counts changed on the device, overflow, and mixed link kinds.

use cudarc::driver::CudaSlice;
use devcomm::{AllToAllVCounts, Error};
use rand::{Rng, SeedableRng};

use super::a2a::{a2a_once, err, GUARD};
use crate::selftest::harness::{compare as first_diff, Ctx, POISON};

type Detail = Result<String, String>;

/// A counts matrix `[src][dst]` in rows: random with zeros, plus one very large entry.
fn counts_matrix(cx: &Ctx, tag: u64, max_rows: u64, big: Option<u64>) -> Vec<Vec<u64>> {
    let world = cx.comm.world_size();
    let mut rng = rand::rngs::StdRng::seed_from_u64(cx.seed ^ tag.wrapping_mul(0x5851_F42D));
    let mut m: Vec<Vec<u64>> = (0..world)
        .map(|_| {
            (0..world)
                .map(|_| {
                    if rng.gen_bool(0.25) {
                        0
                    } else {
                        rng.gen_range(1..=max_rows)
                    }
                })
                .collect()
        })
        .collect();
    if let Some(rows) = big {
        let s = rng.gen_range(0..world);
        let d = rng.gen_range(0..world);
        m[s][d] = rows;
    }
    m
}

/// One all-to-all-v call's buffers and its expected outcome on this rank.
struct VCase {
    send: CudaSlice<u8>,
    recv: CudaSlice<u8>,
    counts: AllToAllVCounts,
    capacity_rows: u64,
    expect: Vec<u8>,
    expect_counts: Vec<u64>,
    expect_offsets: Vec<u64>,
}

/// Builds a case: rank s's rows for d are `data_of(s, tag * 64 + d)`; with `gaps`, the send
/// segments are placed in reverse order with gaps (explicit send offsets).
fn vcase(
    cx: &Ctx,
    m: &[Vec<u64>],
    row: usize,
    tag: u64,
    gaps: bool,
    spare_rows: u64,
) -> Result<VCase, String> {
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let seg = |s: usize, d: usize| cx.data_of(s, tag * 64 + d as u64, m[s][d] as usize * row);
    let mut host = Vec::new();
    let mut offsets = vec![0u64; world];
    let order: Vec<usize> = if gaps {
        (0..world).rev().collect()
    } else {
        (0..world).collect()
    };
    for &d in &order {
        if gaps {
            host.extend(std::iter::repeat_n(0x3C, row * 2));
        }
        offsets[d] = (host.len() / row) as u64;
        host.extend(seg(rank, d));
    }
    let mut counts = AllToAllVCounts::new(&cx.stream, world).map_err(err)?;
    let mine: Vec<u64> = (0..world).map(|d| m[rank][d]).collect();
    cx.stream
        .memcpy_htod(&mine, &mut counts.send_counts)
        .map_err(err)?;
    if gaps {
        counts.send_offsets = Some(cx.stream.clone_htod(&offsets).map_err(err)?);
    }
    let poison = vec![u64::MAX; world];
    cx.stream
        .memcpy_htod(&poison, &mut counts.recv_counts)
        .map_err(err)?;
    cx.stream
        .memcpy_htod(&poison, &mut counts.recv_offsets)
        .map_err(err)?;
    let total: u64 = (0..world).map(|s| m[s][rank]).sum();
    let capacity_rows = (total + spare_rows).max(1);
    let mut expect = Vec::new();
    let mut expect_offsets = Vec::new();
    for s in 0..world {
        expect_offsets.push((expect.len() / row) as u64);
        expect.extend(seg(s, rank));
    }
    expect.resize(capacity_rows as usize * row + GUARD, POISON);
    let send = cx.stream.clone_htod(&host).map_err(err)?;
    let recv = cx
        .stream
        .clone_htod(&vec![POISON; capacity_rows as usize * row + GUARD])
        .map_err(err)?;
    Ok(VCase {
        send,
        recv,
        counts,
        capacity_rows,
        expect,
        expect_counts: (0..world).map(|s| m[s][rank]).collect(),
        expect_offsets,
    })
}

fn launch_v(cx: &Ctx, c: &mut VCase, row: usize) -> Result<(), Error> {
    let cap = c.capacity_rows as usize * row;
    let mut out = c.recv.slice_mut(..cap);
    cx.comm
        .all_to_all_v(&c.send, &mut out, &mut c.counts, row, &cx.stream)
}

fn verify_v(cx: &Ctx, c: &VCase, what: &str) -> Result<(), String> {
    let got = cx.stream.clone_dtoh(&c.recv).map_err(err)?;
    first_diff(&got, &c.expect, what)?;
    let counts = cx.stream.clone_dtoh(&c.counts.recv_counts).map_err(err)?;
    let offsets = cx.stream.clone_dtoh(&c.counts.recv_offsets).map_err(err)?;
    if counts != c.expect_counts || offsets != c.expect_offsets {
        return Err(format!(
            "{what}: recv counts {counts:?} offsets {offsets:?}, expected {:?} {:?}",
            c.expect_counts, c.expect_offsets
        ));
    }
    Ok(())
}

pub(super) fn check_all_to_all_v(cx: &Ctx) -> Detail {
    // (row bytes, max rows per pair, one very large pair, explicit offsets with gaps)
    let cases: [(usize, u64, Option<u64>, bool); 5] = [
        (1, 50, None, false),
        (7, 3000, Some(200_000), false),
        (64, 100, Some(40_000), true),
        (14_336, 40, Some(600), false),
        (3, 1, None, true),
    ];
    for (i, &(row, max_rows, big, gaps)) in cases.iter().enumerate() {
        let tag = 800 + i as u64;
        let m = counts_matrix(cx, tag, max_rows, big);
        let mut c = vcase(cx, &m, row, tag, gaps, 3)?;
        cx.sync()?;
        cx.host_barrier()?;
        launch_v(cx, &mut c, row).map_err(err)?;
        cx.sync()?;
        verify_v(cx, &c, &format!("case {i} (row {row} B)"))?;
    }
    cx.host_barrier()?;
    Ok(format!(
        "{} count matrices (zeros, a very large pair up to 1.4 MB, odd rows, explicit offsets): \
         data, recv counts and offsets verified, guard untouched",
        cases.len()
    ))
}

pub(super) fn check_back_to_back(cx: &Ctx, calls: usize) -> Detail {
    let row = 24;
    let mut cases = Vec::with_capacity(calls);
    for i in 0..calls {
        let tag = 2000 + i as u64;
        let big = (i % 5 == 0).then_some(5000);
        let m = counts_matrix(cx, tag, 400, big);
        cases.push(vcase(cx, &m, row, tag, i % 3 == 0, 0)?);
    }
    let plain: Vec<u64> = vec![1 << 10, 1, 300_000, 64];
    let plain_bufs: Vec<(CudaSlice<u8>, CudaSlice<u8>)> = plain
        .iter()
        .enumerate()
        .map(|(j, &n)| {
            let w = cx.comm.world_size() * n as usize;
            Ok((
                cx.stream
                    .clone_htod(&cx.data_of(cx.comm.rank(), 3000 + j as u64, w))
                    .map_err(err)?,
                cx.stream.alloc_zeros::<u8>(w).map_err(err)?,
            ))
        })
        .collect::<Result<_, String>>()?;
    let mut plain_bufs = plain_bufs;
    cx.sync()?;
    cx.host_barrier()?;
    // Every call enqueued without a host synchronisation in between, interleaved with
    // all-to-alls of other sizes.
    for (i, c) in cases.iter_mut().enumerate() {
        launch_v(cx, c, row).map_err(err)?;
        let (s, r) = &mut plain_bufs[i % plain.len()];
        cx.comm.all_to_all(s, r, &cx.stream).map_err(err)?;
    }
    cx.sync()?;
    for (i, c) in cases.iter().enumerate() {
        verify_v(cx, c, &format!("call {i}"))?;
    }
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    for (j, &n) in plain.iter().enumerate() {
        let got = cx.stream.clone_dtoh(&plain_bufs[j].1).map_err(err)?;
        let n = n as usize;
        let mut expect = Vec::new();
        for src in 0..world {
            expect.extend_from_slice(
                &cx.data_of(src, 3000 + j as u64, world * n)[rank * n..(rank + 1) * n],
            );
        }
        first_diff(&got, &expect, &format!("interleaved all_to_all {n} B"))?;
    }
    cx.host_barrier()?;
    Ok(format!("{calls} all-to-all-v calls with different counts and all-to-alls interleaved, back to back, all verified"))
}

pub(super) fn check_graph(cx: &Ctx, replays: usize) -> Detail {
    let row = 40;
    let variants = 4;
    // Each variant: different counts and data; the graph reads counts and data from fixed
    // buffers that the host refills before each replay.
    let mut cases: Vec<VCase> = (0..variants)
        .map(|v| {
            let tag = 4000 + v as u64;
            let m = counts_matrix(cx, tag, 300, (v == 1).then_some(9000));
            vcase(cx, &m, row, tag, false, 0)
        })
        .collect::<Result<_, _>>()?;
    // Buffers made without cudarc's event tracking: nothing may be recorded or waited on
    // inside the capture except the collective's own kernel.
    // SAFETY: every use of these buffers below is ordered on cx.stream and synchronised.
    unsafe { cx.comm.context().disable_event_tracking() };
    let max_send = cases.iter().map(|c| c.send.len()).max().unwrap_or(1);
    let max_recv = cases.iter().map(|c| c.recv.len()).max().unwrap_or(1);
    let world = cx.comm.world_size();
    let mut send = cx.stream.alloc_zeros::<u8>(max_send).map_err(err)?;
    let mut recv = cx.stream.alloc_zeros::<u8>(max_recv).map_err(err)?;
    let mut counts = AllToAllVCounts::new(&cx.stream, world).map_err(err)?;
    cx.sync()?;
    cx.host_barrier()?;
    let graph = cx.capture(|| {
        cx.comm
            .all_to_all_v(&send, &mut recv, &mut counts, row, &cx.stream)
    })?;
    for r in 0..replays {
        let v = (r * 3 + 1) % variants;
        let c = &mut cases[v];
        cx.stream
            .memcpy_dtod(&c.send, &mut send.slice_mut(..c.send.len()))
            .map_err(err)?;
        cx.stream
            .memcpy_dtod(&c.counts.send_counts, &mut counts.send_counts)
            .map_err(err)?;
        cx.stream.memset_zeros(&mut recv).map_err(err)?;
        cx.sync()?;
        cx.host_barrier()?;
        graph.launch().map_err(err)?;
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&recv).map_err(err)?;
        let used = c.expect_counts.iter().sum::<u64>() as usize * row;
        first_diff(&got[..used], &c.expect[..used], &format!("replay {r}"))?;
        let rc = cx.stream.clone_dtoh(&counts.recv_counts).map_err(err)?;
        if rc != c.expect_counts {
            return Err(format!(
                "replay {r}: recv counts {rc:?}, expected {:?}",
                c.expect_counts
            ));
        }
    }
    cx.host_barrier()?;
    // SAFETY: restores the default for buffers made later.
    unsafe { cx.comm.context().enable_event_tracking() };
    Ok(format!("{replays} replays of a captured all-to-all-v; counts and data changed between replays on the device, every replay verified"))
}

pub(super) fn check_overflow(cx: &Ctx) -> Detail {
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let row = 16;
    let tag = 5000;
    let mut m = counts_matrix(cx, tag, 100, None);
    // Rank world-1 receives far more than its buffer holds.
    let victim = world - 1;
    m[0][victim] = 10_000;
    let mut c = vcase(cx, &m, row, tag, false, 0)?;
    if rank == victim {
        c.capacity_rows = 50; // its buffer holds 50 rows (+ the poisoned guard)
    }
    cx.sync()?;
    cx.host_barrier()?;
    launch_v(cx, &mut c, row).map_err(err)?;
    let outcome = cx.comm.synchronize(&cx.stream);
    let got = cx.stream.clone_dtoh(&c.recv).map_err(err)?;
    if rank == victim {
        match outcome {
            Err(Error::CountOverflow {
                needed,
                capacity: 50,
                ..
            }) => {
                let total: u64 = (0..world).map(|s| m[s][rank]).sum();
                if needed != total {
                    return Err(format!(
                        "overflow reported {needed} rows needed, expected {total}"
                    ));
                }
            }
            other => return Err(format!("expected CountOverflow, got {other:?}")),
        }
        if let Some(i) = got.iter().position(|&b| b != POISON) {
            return Err(format!("overflowing receiver: byte {i} was written"));
        }
    } else {
        outcome.map_err(err)?;
        verify_v(cx, &c, "non-overflowing rank")?;
    }
    cx.host_barrier()?;
    // The communicator stays usable: the next call works everywhere.
    a2a_once(cx, 4096, 5001)?;
    let m = counts_matrix(cx, 5002, 100, None);
    let mut c = vcase(cx, &m, row, 5002, false, 0)?;
    cx.sync()?;
    cx.host_barrier()?;
    launch_v(cx, &mut c, row).map_err(err)?;
    cx.sync()?;
    verify_v(cx, &c, "call after the overflow")?;
    cx.host_barrier()?;
    Ok(format!(
        "rank {victim} got CountOverflow (10k rows into 50), wrote nothing; others verified; the next calls succeeded"
    ))
}

pub(super) fn check_mixed_kinds(cx: &Ctx) -> Detail {
    let world = cx.comm.world_size();
    let tuned: Vec<usize> = (0..world)
        .filter(|&p| p != cx.comm.rank() && cx.comm.topology().tuned_as_net(p))
        .collect();
    let forced = std::env::var(devcomm::topology::OVERRIDE_ENV).unwrap_or_default();
    if forced.contains("nvl-as-net") && tuned.is_empty() && world > 2 {
        return Err(format!(
            "{} is {forced:?} but no peer is tuned as network",
            devcomm::topology::OVERRIDE_ENV
        ));
    }
    for (i, n) in [4096usize, 200_000, 3 << 20].into_iter().enumerate() {
        a2a_once(cx, n, 6000 + i as u64)?;
    }
    let m = counts_matrix(cx, 6100, 2000, Some(30_000));
    let mut c = vcase(cx, &m, 32, 6100, false, 0)?;
    cx.sync()?;
    cx.host_barrier()?;
    launch_v(cx, &mut c, 32).map_err(err)?;
    cx.sync()?;
    verify_v(cx, &c, "all_to_all_v")?;
    cx.host_barrier()?;
    Ok(format!(
        "peers tuned as network: {tuned:?}; all-to-all (3 sizes) and all-to-all-v verified"
    ))
}
