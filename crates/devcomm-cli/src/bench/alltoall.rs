//! `devcomm bench --op all_to_all` and `--op all_to_all_v`: devcomm's fused all-to-all(-v)
//! against NCCL grouped send/recv on every rank, in the same processes, on the same buffers.
//! `--op all_to_all --reference none` times devcomm alone (a smoke test, on a shared GPU or
//! with network links forced: the records say so).

use std::ops::Range;

use cudarc::driver::CudaSlice;
use devcomm::p2p::ZcRoute;
use devcomm::{AllToAllVCounts, Registration};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::bench::nccl::NcclPair;
use crate::bench::sendrecv_net::{net_config, net_reference, wants_nccl};
use crate::bench::{
    calls_per_sample, min_free_bytes, time_ranks_each, time_wall_each, BenchArgs, Record,
};
use crate::selftest::BenchDst;
use crate::selftest::Ctx;

/// All-to-all sizes per peer: 1 KiB to 256 MiB in powers of 4.
const SIZES: &[usize] = &[
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
    256 << 20,
];

/// Device memory left free for NCCL's lazily allocated connection buffers.
const HEADROOM: usize = 2 << 30;

/// All-to-all-v (MoE dispatch): bf16 tokens of this hidden size, one row of u16 each.
const HIDDEN: usize = 7168;
/// Experts, spread evenly over the ranks, and experts per token.
const EXPERTS: usize = 32;
const TOP_K: usize = 8;
/// Tokens per rank.
const TOKENS: &[usize] = &[128, 512, 2048, 8192];

/// Equal chunks per peer on every rank, each against NCCL's grouped send/recv.
pub(crate) fn run(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let world = cx.comm.world_size();
    let nccl = match wants_nccl(&args.reference)? {
        true => Some(NcclPair::new(cx)?),
        false if args.zero_copy => {
            return Err(
                "bench --op all_to_all --zero-copy compares with NCCL: leave \
                        --reference none out"
                    .into(),
            )
        }
        false => None,
    };
    let free = min_free_bytes(cx, HEADROOM)?;
    let max = args.max_bytes.min(256 << 20);
    let sizes: Vec<usize> = SIZES
        .iter()
        .copied()
        .filter(|&s| s <= max && s >= args.min_bytes && 2 * world * s <= free)
        .collect();
    let largest = sizes.last().copied().ok_or("no all-to-all size fits")?;
    let mut send: CudaSlice<u8> = cx
        .stream
        .alloc_zeros(world * largest)
        .map_err(|e| e.to_string())?;
    // --zero-copy: the output is a registered cuMemAlloc buffer (NCCL receives into the same
    // one) and devcomm calls all_to_all_registered.
    let mut dest = BenchDst::new(cx, world * largest, args.zero_copy)?;
    let (handle, recv) = dest.parts();
    let mut out = Vec::new();
    for &bytes in &sizes {
        let r = a2a_point(cx, args, &nccl, &mut send, recv, handle, bytes)?;
        out.extend(r);
    }
    drop((send, dest));
    if args.zero_copy || nccl.is_none() {
        // The hooked all-to-alls have no registered variant; without NCCL the plain
        // all-to-all is the smoke test.
        return Ok(out);
    }
    if HOOKED_BYTES <= max && 2 * world * HOOKED_BYTES <= free {
        out.extend(hooked_points(cx, args)?);
    }
    Ok(out)
}

/// Bytes per peer at which the hooked all-to-alls are compared with the plain one.
const HOOKED_BYTES: usize = 16 << 20;

/// The transpose and fp8 all-to-alls (the examples' hooks) against devcomm's plain all-to-all
/// of the same f32 buffers: `nccl_us` holds the plain time here (see `reference`).
fn hooked_points(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    use cudarc::driver::DevicePtr;
    use devcomm::{HookArgs, Hooks};
    let e = |x: devcomm::Error| x.to_string();
    let c = |x: cudarc::driver::DriverError| x.to_string();
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let n = HOOKED_BYTES / 4;
    let side = 2048; // n = side x side: each chunk a square matrix
    let data: Vec<f32> = cx
        .data_of(rank, 9000, world * n * 4)
        .chunks_exact(4)
        .map(|b| (i32::from_le_bytes([b[0], b[1], b[2], b[3]]) % 100_000) as f32 * 1e-3)
        .collect();
    let send = cx.stream.clone_htod(&data).map_err(c)?;
    let mut recv = cx.stream.alloc_zeros::<f32>(world * n).map_err(c)?;
    let scales = cx
        .stream
        .clone_htod(&vec![100.0f32 / 448.0; world])
        .map_err(c)?;
    let user_args = {
        let (p, _g) = scales.device_ptr(&cx.stream);
        cx.stream.clone_htod(&[p, p]).map_err(c)?
    };
    let user = user_args.device_ptr(&cx.stream).0;
    let [transpose, fp8] = crate::precompile::example_hooks();
    let copy = Hooks::<f32>::copy();
    cx.sync()?;
    // The plain all-to-all, the examples and any extra hooks, timed in turn.
    let mut cases = vec![
        ("a2a-plain-f32".to_string(), copy, HookArgs::default()),
        ("a2a-transpose".into(), transpose, HookArgs::rows(side)),
        ("a2a-fp8".into(), fp8, HookArgs::default().with_user(user)),
    ];
    for spec in &args.extra_hooks {
        let hooks = crate::precompile::f32_hooks(spec)?;
        let a = HookArgs::rows(side).with_user(user);
        cases.push((hooks.name().to_string(), hooks, a));
    }
    let names: Vec<&str> = cases.iter().map(|c| c.0.as_str()).collect();
    let calls = calls_per_sample(world * HOOKED_BYTES);
    let us = time_ranks_each(
        cx,
        world,
        args.warmup,
        args.iters,
        calls,
        &names,
        &mut |i| {
            cx.comm
                .all_to_all_hooked(&cases[i].1, &send, &mut recv, cases[i].2, &cx.stream)
                .map_err(e)
        },
    )?;
    let (plain, t_us, f_us) = (us[0], us[1], us[2]);
    let extra: Vec<(&str, f64)> = names[3..]
        .iter()
        .copied()
        .zip(us[3..].iter().copied())
        .collect();
    if rank != 0 {
        return Ok(Vec::new());
    }
    let mk = |op: &str, us: f64| Record {
        reference: "devcomm plain all_to_all of the same f32 buffers (nccl_us holds its time)"
            .into(),
        config: format!("plain {plain:.1} us"),
        ..record(cx, args, op, HOOKED_BYTES as u64, (us, plain))
    };
    let mut records = vec![mk("all_to_all_transpose", t_us), mk("all_to_all_fp8", f_us)];
    records.extend(
        extra
            .iter()
            .map(|(name, us)| mk(&format!("all_to_all_hooks:{name}"), *us)),
    );
    Ok(records)
}

/// One size: fresh data, devcomm timed, devcomm verified, NCCL timed. The record on rank 0.
fn a2a_point(
    cx: &Ctx,
    args: &BenchArgs,
    nccl: &Option<NcclPair>,
    send: &mut CudaSlice<u8>,
    recv: &mut CudaSlice<u8>,
    registered: Option<&Registration<'_>>,
    bytes: usize,
) -> Result<Option<Record>, String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let n = world * bytes;
    let chunks = packed(&vec![1; world], bytes);
    for (p, c) in chunks.iter().enumerate() {
        let data = cx.data_of(rank, a2a_tag(bytes, p), bytes);
        cx.stream
            .memcpy_htod(&data, &mut send.slice_mut(c.clone()))
            .map_err(|e| e.to_string())?;
    }
    cx.sync()?;
    verify_a2a(cx, send, recv, registered, bytes)?;
    let calls = calls_per_sample(n);
    let (warmup, iters) = (args.warmup, args.iters);
    let names = ["a2a-devcomm", "a2a-nccl"];
    let names = &names[..1 + usize::from(nccl.is_some())];
    let us = time_ranks_each(
        cx,
        world,
        warmup,
        iters,
        calls,
        names,
        &mut |i| match (i, nccl) {
            (0, _) => a2a_call(cx, send, recv, registered, n),
            (_, Some(nccl)) => {
                nccl.all_to_all(&send.slice(..n), &mut recv.slice_mut(..n), &chunks, &chunks)
            }
            (_, None) => Err("no NCCL reference in this run".into()),
        },
    )?;
    let n_us = us.get(1).copied().unwrap_or(f64::NAN);
    let r = record(cx, args, "all_to_all", bytes as u64, (us[0], n_us));
    let copy_engine = cx.comm.tuning().zero_copy_route(bytes as u64) == ZcRoute::CopyEngine;
    // With network links (forced on one machine) the records say that they time loopback.
    let net = cx.comm.tuning().has_network_peers();
    Ok((rank == 0).then(|| match registered {
        None if net => Record {
            reference: net_reference(nccl.is_some()),
            config: net_config(cx.comm.config().net_slot_kib, cx.comm.config().net_slots),
            ..r
        },
        None if nccl.is_none() => Record {
            reference: "none (devcomm alone)".into(),
            ..r
        },
        None => Record {
            reference: "NCCL grouped send/recv".into(),
            ..r
        },
        Some(_) => Record {
            reference: "NCCL grouped send/recv (into the same registered buffer)".into(),
            config: if copy_engine {
                "registered/copy-engine steps".into()
            } else {
                "registered/fused".into()
            },
            sms: if copy_engine { 1 } else { r.sms },
            ..r
        },
    }))
}

/// One devcomm all-to-all of `n` bytes in all: into `recv`, or with `registered`, into that
/// registration (which `recv` views) at offset 0.
fn a2a_call(
    cx: &Ctx,
    send: &CudaSlice<u8>,
    recv: &mut CudaSlice<u8>,
    registered: Option<&Registration<'_>>,
    n: usize,
) -> Result<(), String> {
    match registered {
        None => cx
            .comm
            .all_to_all(&send.slice(..n), &mut recv.slice_mut(..n), &cx.stream),
        Some(r) => {
            cx.comm
                .all_to_all_registered(&send.slice(..n), r.range(0, n as u64), &cx.stream)
        }
    }
    .map_err(|e| e.to_string())
}

/// Tag of the data rank `src` sends to `dst` at `bytes` per peer (`src` is `data_of`'s sender).
fn a2a_tag(bytes: usize, dst: usize) -> u64 {
    ((bytes as u64) << 6) | dst as u64
}

/// Poisons `recv`, runs one devcomm all-to-all and checks that chunk `p` holds what rank `p`
/// put in its chunk for this rank.
fn verify_a2a(
    cx: &Ctx,
    send: &CudaSlice<u8>,
    recv: &mut CudaSlice<u8>,
    registered: Option<&Registration<'_>>,
    bytes: usize,
) -> Result<(), String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let n = world * bytes;
    cx.stream
        .memset_zeros(&mut recv.slice_mut(..n))
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    a2a_call(cx, send, recv, registered, n)?;
    cx.sync()?;
    for (p, c) in packed(&vec![1; world], bytes).into_iter().enumerate() {
        let got = cx
            .stream
            .clone_dtoh(&recv.slice(c))
            .map_err(|e| e.to_string())?;
        if let Some(i) = first_diff(&got, &cx.data_of(p, a2a_tag(bytes, rank), bytes)) {
            return Err(format!(
                "all_to_all {bytes} B per peer: rank {rank}, chunk from rank {p}: wrong byte at {i}"
            ));
        }
    }
    cx.host_barrier()
}

/// MoE token dispatch: per batch size, devcomm's all-to-all-v with device counts against what a
/// PyTorch user does with NCCL (count exchange, counts to the host, grouped send/recv).
pub(crate) fn run_v(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let world = cx.comm.world_size();
    if EXPERTS % world != 0 {
        return Err(format!(
            "all_to_all_v spreads {EXPERTS} experts evenly: world size {world} must divide it"
        ));
    }
    let nccl = NcclPair::new(cx)?;
    let mut out = Vec::new();
    for &tokens in TOKENS {
        out.extend(a2av_point(cx, args, &nccl, tokens)?);
    }
    Ok(out)
}

/// One rank's batch on the GPU: its tokens grouped by destination rank, room for every rank's
/// whole batch, and devcomm's counts with `send_counts` uploaded.
struct Batch {
    send: CudaSlice<u16>,
    recv: CudaSlice<u16>,
    counts: AllToAllVCounts,
    /// Rows to each rank, on the host.
    send_counts: Vec<u64>,
}

impl Batch {
    fn new(cx: &Ctx, tokens: usize) -> Result<Self, String> {
        let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
        let to = route(cx, rank, tokens);
        let send_counts: Vec<u64> = to.iter().map(|t| t.len() as u64).collect();
        let host: Vec<u16> = to
            .iter()
            .enumerate()
            .flat_map(|(p, ts)| ts.iter().flat_map(move |&t| row(cx, rank, p, t, tokens)))
            .collect();
        let send = cx.stream.clone_htod(&host).map_err(|e| e.to_string())?;
        let recv = cx
            .stream
            .alloc_zeros::<u16>(world * tokens * HIDDEN)
            .map_err(|e| e.to_string())?;
        let mut counts = AllToAllVCounts::new(&cx.stream, world).map_err(|e| e.to_string())?;
        cx.stream
            .memcpy_htod(&send_counts, &mut counts.send_counts)
            .map_err(|e| e.to_string())?;
        cx.sync()?;
        Ok(Self {
            send,
            recv,
            counts,
            send_counts,
        })
    }

    /// Average bytes per peer this rank sends to the other ranks.
    fn bytes_per_peer(&self, rank: usize) -> u64 {
        let rows: u64 = self
            .send_counts
            .iter()
            .enumerate()
            .filter(|&(p, _)| p != rank)
            .map(|(_, &c)| c)
            .sum();
        rows * (HIDDEN * 2) as u64 / (self.send_counts.len() as u64 - 1)
    }
}

/// One batch size: route, upload, devcomm timed, devcomm verified, NCCL timed. Both are timed
/// on the host clock (stream synchronised before the start and after the end), because the
/// NCCL path waits on the GPU from the host in the middle. The record on rank 0.
fn a2av_point(
    cx: &Ctx,
    args: &BenchArgs,
    nccl: &NcclPair,
    tokens: usize,
) -> Result<Option<Record>, String> {
    let b = &mut Batch::new(cx, tokens)?;
    let mut nccl_counts = cx
        .stream
        .alloc_zeros::<u64>(cx.comm.world_size())
        .map_err(|e| e.to_string())?;
    verify_a2av(cx, b, tokens)?;
    let (warmup, iters) = (args.warmup, args.iters);
    let names = ["a2av-devcomm", "a2av-nccl"];
    let us = time_wall_each(cx, warmup, iters, &names, &mut |i| match i {
        0 => cx
            .comm
            .all_to_all_v(&b.send, &mut b.recv, &mut b.counts, HIDDEN, &cx.stream)
            .map_err(|e| e.to_string()),
        _ => nccl_a2av(cx, nccl, b, &mut nccl_counts),
    })?;
    let rank = cx.comm.rank();
    let r = record(
        cx,
        args,
        "all_to_all_v",
        b.bytes_per_peer(rank),
        (us[0], us[1]),
    );
    Ok((rank == 0).then(|| Record {
        reference: "NCCL count exchange + counts to host + grouped send/recv (host clock, both)"
            .into(),
        tokens: Some(tokens as u64),
        ..r
    }))
}

/// What a PyTorch user does when the counts are on the GPU: exchange them with NCCL, copy them
/// to the host and wait, compute the offsets, then exchange the rows with NCCL.
fn nccl_a2av(
    cx: &Ctx,
    nccl: &NcclPair,
    b: &mut Batch,
    recv_counts: &mut CudaSlice<u64>,
) -> Result<(), String> {
    let world = cx.comm.world_size();
    let one = packed(&vec![1; world], 1);
    nccl.all_to_all(
        &b.counts.send_counts.as_view(),
        &mut recv_counts.as_view_mut(),
        &one,
        &one,
    )?;
    let mut host = vec![0u64; 2 * world];
    cx.stream
        .memcpy_dtoh(&b.counts.send_counts, &mut host[..world])
        .map_err(|e| e.to_string())?;
    cx.stream
        .memcpy_dtoh(recv_counts, &mut host[world..])
        .map_err(|e| e.to_string())?;
    cx.stream.synchronize().map_err(|e| e.to_string())?;
    let row_bytes = HIDDEN * 2;
    let (sends, recvs) = (
        packed(&host[..world], row_bytes),
        packed(&host[world..], row_bytes),
    );
    // SAFETY: the views cover exactly the u16 buffers, as bytes; any byte is a valid u8.
    let (s, r) = unsafe {
        (
            b.send.transmute::<u8>(b.send.len() * 2),
            b.recv.transmute_mut::<u8>(b.recv.len() * 2),
        )
    };
    let (Some(s), Some(mut r)) = (s, r) else {
        return Err("cannot view the token buffers as bytes".into());
    };
    nccl.all_to_all(&s, &mut r, &sends, &recvs)
}

/// Poisons the receive buffer and counts, runs one devcomm all-to-all-v and checks what it
/// delivered.
fn verify_a2av(cx: &Ctx, b: &mut Batch, tokens: usize) -> Result<(), String> {
    let poison = vec![u64::MAX; cx.comm.world_size()];
    cx.stream
        .memset_zeros(&mut b.recv)
        .map_err(|e| e.to_string())?;
    cx.stream
        .memcpy_htod(&poison, &mut b.counts.recv_counts)
        .map_err(|e| e.to_string())?;
    cx.stream
        .memcpy_htod(&poison, &mut b.counts.recv_offsets)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    cx.comm
        .all_to_all_v(&b.send, &mut b.recv, &mut b.counts, HIDDEN, &cx.stream)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    check_a2av(cx, b, tokens)?;
    cx.host_barrier()
}

/// Checks devcomm's output counts, offsets and rows against every rank's routing.
fn check_a2av(cx: &Ctx, b: &Batch, tokens: usize) -> Result<(), String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let from: Vec<Vec<usize>> = (0..world)
        .map(|p| route(cx, p, tokens).swap_remove(rank))
        .collect();
    let want: Vec<u64> = from.iter().map(|t| t.len() as u64).collect();
    let want_offsets: Vec<u64> = packed(&want, 1).iter().map(|r| r.start as u64).collect();
    let got = cx
        .stream
        .clone_dtoh(&b.counts.recv_counts)
        .map_err(|e| e.to_string())?;
    let got_offsets = cx
        .stream
        .clone_dtoh(&b.counts.recv_offsets)
        .map_err(|e| e.to_string())?;
    let what = format!("all_to_all_v {tokens} tokens: rank {rank}");
    if got != want || got_offsets != want_offsets {
        return Err(format!(
            "{what} got counts {got:?} at {got_offsets:?}, expected {want:?} at {want_offsets:?}"
        ));
    }
    for (p, rows) in packed(&want, HIDDEN).into_iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let got = cx
            .stream
            .clone_dtoh(&b.recv.slice(rows))
            .map_err(|e| e.to_string())?;
        let expect: Vec<u16> = from[p]
            .iter()
            .flat_map(|&t| row(cx, p, rank, t, tokens))
            .collect();
        if let Some(i) = first_diff(&got, &expect) {
            return Err(format!(
                "{what}, rows from rank {p}: wrong element {} of row {}",
                i % HIDDEN,
                i / HIDDEN
            ));
        }
    }
    Ok(())
}

/// The tokens of rank `src`'s batch that go to each rank, in token order. Each token picks
/// `TOP_K` distinct experts at random; expert `e` lives on rank `e / (EXPERTS / world)`; a token
/// goes once to every rank holding one of its experts. Seeded, so any rank can route any batch.
fn route(cx: &Ctx, src: usize, tokens: usize) -> Vec<Vec<usize>> {
    let world = cx.comm.world_size();
    let per_rank = EXPERTS / world;
    let mut rng = StdRng::seed_from_u64(
        cx.seed ^ (src as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((tokens as u64) << 32),
    );
    let mut to = vec![Vec::new(); world];
    for t in 0..tokens {
        let mut ranks = 0u64;
        for e in rand::seq::index::sample(&mut rng, EXPERTS, TOP_K) {
            ranks |= 1 << (e / per_rank);
        }
        for (p, list) in to.iter_mut().enumerate() {
            if (ranks >> p) & 1 == 1 {
                list.push(t);
            }
        }
    }
    to
}

/// Token `token` of rank `src`'s batch as sent to rank `dst`: deterministic, so the receiver
/// can check it.
fn row(cx: &Ctx, src: usize, dst: usize, token: usize, tokens: usize) -> Vec<u16> {
    let tag = (1 << 63) | ((tokens as u64) << 40) | ((dst as u64) << 32) | token as u64;
    cx.data_of(src, tag, HIDDEN * 2)
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

/// The record of one point, on `bytes` per peer: bandwidth counts the bytes this rank sends to
/// the other ranks, `(world - 1) x bytes`.
fn record(cx: &Ctx, args: &BenchArgs, op: &str, bytes: u64, (d_us, n_us): (f64, f64)) -> Record {
    let world = cx.comm.world_size();
    let to_peers = ((world as u64 - 1) * bytes) as f64;
    Record {
        sms: cx
            .comm
            .tuning()
            .collective_shape((op != "all_to_all_v").then_some(bytes))
            .grid(world),
        ..Record::new(cx, args, op, bytes).timed(d_us, n_us, to_peers)
    }
}

/// Consecutive ranges of `counts[p] x scale` elements, in rank order.
pub(super) fn packed(counts: &[u64], scale: usize) -> Vec<Range<usize>> {
    let mut at = 0;
    counts
        .iter()
        .map(|&c| {
            let r = at..at + c as usize * scale;
            at = r.end;
            r
        })
        .collect()
}

/// The first index where `got` differs from `want` (or where one ends early).
fn first_diff<T: PartialEq>(got: &[T], want: &[T]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .or((got.len() != want.len()).then(|| got.len().min(want.len())))
}
