//! `devcomm bench --op sendrecv [--both-directions]`: devcomm send/recv against NCCL
//! send/recv between ranks 0 and 1, in the same processes, on the same buffers, alternating.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use cudarc::nccl::result as nccl_result;
use devcomm::p2p::{
    pull_by_default, staged_config, sweep_configs, P2PConfig, Protocol, Transfer, ZcRoute,
};
use devcomm::Registration;

use crate::bench::nccl::NcclPair;
use crate::bench::{calls_per_sample, sendrecv_net, time_pair, time_ranks_each, BenchArgs, Record};
use crate::selftest::BenchDst;
use crate::selftest::Ctx;

/// Message sizes from 8 B to 1 GiB.
pub(crate) const SIZES: &[usize] = &[
    8,
    64,
    512,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
    16 << 20,
    64 << 20,
    256 << 20,
    1 << 30,
];

pub(crate) fn run(cx: &Ctx, args: &BenchArgs, both: bool) -> Result<Vec<Record>, String> {
    let comm = &cx.comm;
    let rank = comm.rank();
    let active = rank < 2;
    let peer = 1 - rank.min(1);
    let max = args.max_bytes.min(1 << 30);
    let sizes: Vec<usize> = SIZES
        .iter()
        .copied()
        .filter(|&s| s <= max && s >= args.min_bytes)
        .collect();
    // With a network peer (links forced) the records say it: no one may read a loopback
    // figure as a network one (bench/sendrecv_net.rs).
    let net = comm.topology().kind(peer) == devcomm::LinkKind::Net;
    if net {
        sendrecv_net::refuse_options(args.sweep, args.zero_copy, args.blocks.is_some())?;
    }
    let nccl = if sendrecv_net::wants_nccl(&args.reference)? {
        Some(NcclPair::new(cx)?)
    } else {
        None
    };
    let src_host = cx.data_of(rank, 1234, max);
    let src: CudaSlice<u8> = cx.stream.clone_htod(&src_host).map_err(|e| e.to_string())?;
    // Zero-copy: the destination is a registered cuMemAlloc buffer (NCCL receives into the
    // same one); otherwise an ordinary allocation.
    let mut dest = BenchDst::new(cx, max, args.zero_copy)?;
    let (registered, dst) = dest.parts();
    let expect = if active {
        cx.data_of(peer, 1234, max)
    } else {
        Vec::new()
    };
    cx.sync()?;
    let mut out = Vec::new();
    for &bytes in &sizes {
        // What a call without a configuration uses: the loaded tuning table's, else defaults.
        let library_default = comm.tuning().p2p_config(bytes as u64);
        let mut default = library_default;
        // The library's own defaults go in as no configuration at all, so that what a caller
        // without one gets is what is timed (a large message's layout is negotiated per launch:
        // docs/PROTOCOL.md, "Copy engine").
        let explicit = |c: P2PConfig| (c != library_default).then_some(c);
        if let Some(b) = args.blocks.filter(|_| default.protocol.is_staged()) {
            default.blocks = b;
        }
        let candidates = if args.sweep && registered.is_none() {
            sweep_configs(bytes as u64, comm.tuning().p2p_limits())
        } else {
            vec![default]
        };
        let calls = calls_per_sample(bytes);
        for &cfg in &candidates {
            // Poison, one call, verify every byte (large sizes only for the default in sweeps,
            // to bound the run's length).
            if !args.sweep || bytes <= 64 << 20 || cfg == default {
                let what = describe(&cfg, bytes, both, cx.comm.tuning().p2p_switches().pull);
                verify_call(
                    cx,
                    dst,
                    &expect,
                    bytes,
                    both,
                    &what,
                    &mut |dst| match registered {
                        Some(h) => zero_copy_call(cx, &src, h, bytes, peer, both),
                        None => devcomm_call(cx, &src, dst, bytes, peer, both, explicit(cfg)),
                    },
                )?;
            }
        }
        // Every candidate and NCCL (last) in turn.
        let mut names: Vec<&str> = vec!["devcomm"; candidates.len()];
        if nccl.is_some() {
            names.push("nccl");
        }
        let us = time_ranks_each(
            cx,
            2,
            args.warmup,
            args.iters,
            calls,
            &names,
            &mut |i| match (candidates.get(i), registered) {
                (None, _) => match &nccl {
                    Some(n) => nccl_call(n, &src, dst, bytes, peer, both, rank),
                    None => Err("no NCCL reference in this run".into()),
                },
                (Some(_), Some(h)) => zero_copy_call(cx, &src, h, bytes, peer, both),
                (Some(&cfg), None) => devcomm_call(cx, &src, dst, bytes, peer, both, explicit(cfg)),
            },
        )?;
        let n_us = us.get(candidates.len()).copied().unwrap_or(f64::NAN);
        if args.sweep && rank == 0 {
            for (cfg, t) in candidates.iter().zip(&us) {
                eprintln!(
                    "  {bytes} B {}: {t:.2} us",
                    describe(cfg, bytes, both, cx.comm.tuning().p2p_switches().pull)
                );
            }
        }
        let Some((d_us, cfg)) = candidates
            .iter()
            .zip(&us)
            .map(|(&c, &t)| (t, c))
            .min_by(|a, b| a.0.total_cmp(&b.0))
        else {
            continue;
        };
        // Registered destinations go by the route of their size (`Comm::send_registered`):
        // the ordinary path with the default configuration, SM blocks, or the copy engine,
        // whose sender runs one pacing warp (one block).
        let zc_route = registered
            .is_some()
            .then(|| comm.tuning().zero_copy_route(bytes as u64));
        // Both ways in one launch on both ranks, the defaults' copy-engine layout gives way to
        // the staged protocol in the negotiation.
        let negotiated_staged =
            both && cfg == library_default && cfg.protocol == Protocol::CopyEngine;
        let (cfg, label_prefix) = if negotiated_staged {
            (
                staged_config(bytes as u64, comm.tuning().p2p_limits()),
                "negotiated ",
            )
        } else {
            (cfg, "")
        };
        if rank == 0 {
            out.push(Record {
                both_directions: both,
                sms: match zc_route {
                    // One block per role of the network kernel.
                    _ if net => 1 + u32::from(both),
                    Some(ZcRoute::Blocks(b)) => b,
                    Some(ZcRoute::CopyEngine) => 1,
                    // A copy-engine side runs a pacing block beside its blocks.
                    Some(ZcRoute::Staged) | None if cfg.protocol == Protocol::CopyEngine => {
                        cfg.blocks + 1
                    }
                    Some(ZcRoute::Staged) | None => cfg.blocks,
                },
                reference: if net {
                    sendrecv_net::net_reference(nccl.is_some())
                } else if nccl.is_none() {
                    "none (devcomm alone)".into()
                } else if registered.is_some() {
                    "NCCL send/recv (into the same registered buffer)".into()
                } else {
                    "NCCL send/recv".into()
                },
                config: match zc_route {
                    _ if net => sendrecv_net::net_config(
                        comm.config().net_slot_kib,
                        comm.config().net_slots,
                    ),
                    Some(ZcRoute::Blocks(b)) => format!("zero-copy/{b}x512"),
                    Some(ZcRoute::CopyEngine) => "zero-copy/copy-engine".into(),
                    Some(ZcRoute::Staged) => format!(
                        "registered/{}",
                        describe(&cfg, bytes, both, cx.comm.tuning().p2p_switches().pull)
                    ),
                    None => format!(
                        "{label_prefix}{}",
                        describe(&cfg, bytes, both, cx.comm.tuning().p2p_switches().pull)
                    ),
                },
                meaningful: !net,
                ..Record::new(cx, args, "sendrecv", bytes as u64).timed(d_us, n_us, bytes as f64)
            });
        }
        cx.host_barrier()?;
    }
    Ok(out)
}

/// Poisons `dst`, makes one call through `call` and checks every received byte against
/// `expect` (rank 1 receives one way; both ranks both ways). Every rank calls it: ranks 0 and 1
/// make the call, the others only meet its host barrier.
pub(crate) fn verify_call(
    cx: &Ctx,
    dst: &mut CudaSlice<u8>,
    expect: &[u8],
    bytes: usize,
    both: bool,
    what: &str,
    call: &mut dyn FnMut(&mut CudaSlice<u8>) -> Result<(), String>,
) -> Result<(), String> {
    let rank = cx.comm.rank();
    if rank >= 2 {
        return cx.host_barrier();
    }
    cx.stream.memset_zeros(dst).map_err(|e| e.to_string())?;
    cx.sync()?;
    cx.host_barrier()?;
    call(dst)?;
    cx.sync()?;
    let got = cx
        .stream
        .clone_dtoh(&dst.slice(..bytes))
        .map_err(|e| e.to_string())?;
    let receives = both || rank == 1;
    if receives && got != expect[..bytes] {
        let i = got
            .iter()
            .zip(expect)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        return Err(format!(
            "sendrecv {bytes} B with {what}: wrong byte at {i} on rank {rank}"
        ));
    }
    Ok(())
}

/// One zero-copy call: rank 0 sends (and rank 1 receives) into offset 0 of the registration.
fn zero_copy_call(
    cx: &Ctx,
    src: &CudaSlice<u8>,
    reg: &Registration<'_>,
    bytes: usize,
    peer: usize,
    both: bool,
) -> Result<(), String> {
    let at = reg.range(0, bytes as u64);
    let src = src.slice(..bytes);
    let r = match (both, cx.comm.rank()) {
        (true, _) => cx
            .comm
            .sendrecv_registered(&src, peer, at, at, peer, &cx.stream),
        (false, 0) => cx.comm.send_registered(&src, peer, at, &cx.stream),
        (false, _) => cx.comm.recv_registered(at, peer, &cx.stream),
    };
    r.map_err(|e| e.to_string())
}

/// One-way send/recv replayed from CUDA graphs: each graph holds a run of back-to-back calls
/// (devcomm's, or NCCL's send/recv), captured once and replayed per timed sample.
pub(crate) fn run_graph(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let comm = &cx.comm;
    let rank = comm.rank();
    let active = rank < 2;
    let peer = 1 - rank.min(1);
    // SAFETY: everything below runs on one stream, which is synchronised before any buffer is
    // dropped; nothing needs cudarc's cross-stream events, which cannot be waited on inside a
    // capture.
    unsafe { comm.context().disable_event_tracking() };
    let max = 64usize << 10;
    let src: CudaSlice<u8> = cx
        .stream
        .clone_htod(&cx.data_of(rank, 4321, max))
        .map_err(|e| e.to_string())?;
    let mut dst: CudaSlice<u8> = cx.stream.alloc_zeros(max).map_err(|e| e.to_string())?;
    let expect = cx.data_of(peer, 4321, max);
    let nccl = NcclPair::new(cx)?;
    cx.sync()?;
    let calls = 50;
    let mut out = Vec::new();
    for bytes in [8usize, 64, 512, 4096, 65536] {
        let cfg = comm.tuning().p2p_config(bytes as u64);
        let capture = |which: &str,
                       dst: &mut CudaSlice<u8>|
         -> Result<Option<cudarc::driver::CudaGraph>, String> {
            if !active {
                return Ok(None);
            }
            cx.capture(|| {
                for _ in 0..calls {
                    if which == "devcomm" {
                        devcomm_call(cx, &src, dst, bytes, peer, false, Some(cfg))?;
                    } else {
                        nccl_call(&nccl, &src, dst, bytes, peer, false, rank)?;
                    }
                }
                Ok::<(), String>(())
            })
            .map(Some)
            .map_err(|e| format!("{which}: {e}"))
        };
        // One plain call of each first: kernels are loaded and NCCL connects outside capture.
        if active {
            devcomm_call(cx, &src, &mut dst, bytes, peer, false, Some(cfg))?;
            nccl_call(&nccl, &src, &mut dst, bytes, peer, false, rank)?;
        }
        cx.sync()?;
        cx.host_barrier()?;
        let dgraph = capture("devcomm", &mut dst)?;
        let ngraph = capture("nccl", &mut dst)?;
        cx.host_barrier()?;
        // Poison, replay devcomm's graph once, verify.
        if let Some(g) = &dgraph {
            cx.stream
                .memset_zeros(&mut dst)
                .map_err(|e| e.to_string())?;
            cx.sync()?;
            cx.host_barrier()?;
            g.launch().map_err(|e| e.to_string())?;
            cx.sync()?;
            let got = cx
                .stream
                .clone_dtoh(&dst.slice(..bytes))
                .map_err(|e| e.to_string())?;
            if rank == 1 && got != expect[..bytes] {
                return Err(format!(
                    "graph-replayed sendrecv of {bytes} B delivered wrong bytes"
                ));
            }
        } else {
            cx.host_barrier()?;
        }
        let replay = |g: &Option<cudarc::driver::CudaGraph>, what: &str| -> Result<f64, String> {
            // Each sample is one replay of `calls` captured calls.
            let per_replay = time_pair(cx, args.warmup, args.iters, 1, what, &mut || match g {
                Some(g) => g.launch().map_err(|e| e.to_string()),
                None => Ok(()),
            })?;
            Ok(per_replay / calls as f64)
        };
        let d_us = replay(&dgraph, "graph-devcomm")?;
        let n_us = replay(&ngraph, "graph-nccl")?;
        if rank == 0 {
            out.push(Record {
                sms: cfg.blocks,
                reference: "NCCL send/recv, graph-replayed".into(),
                config: describe(&cfg, bytes, false, cx.comm.tuning().p2p_switches().pull),
                ..Record::new(cx, args, "sendrecv_graph", bytes as u64).timed(
                    d_us,
                    n_us,
                    bytes as f64,
                )
            });
        }
        drop(dgraph);
        drop(ngraph);
        cx.sync()?;
        cx.host_barrier()?;
    }
    Ok(out)
}

/// A configuration as the records name it: `ll`, `ll128`, `push`, `pull` or `ce`, then blocks x
/// threads and the chunk. For [`Protocol::Bulk`], the staging the sender picks for this call.
pub(crate) fn describe(c: &P2PConfig, bytes: usize, both: bool, pull: Option<bool>) -> String {
    let staged = |what: &str| format!("{what}/{}x{}/{}K", c.blocks, c.threads, c.chunk_bytes >> 10);
    match c.protocol {
        Protocol::LowLatency => format!("ll/{}x{}", c.blocks, c.threads),
        Protocol::LowLatency128 => format!("ll128/{}x{}", c.blocks, c.threads),
        Protocol::Push => staged("push"),
        Protocol::Pull => staged("pull"),
        Protocol::Bulk if pull_by_default(bytes as u64, both, pull) => staged("pull"),
        Protocol::Bulk => staged("push"),
        // Each side's copy engine, blocks x threads (filling the outbox at the sender, copying
        // out of the inbox at the receiver) and a pacing block.
        Protocol::CopyEngine if c.chunk_bytes >= 1 << 20 => {
            format!("ce/{}x{}/{}M", c.blocks, c.threads, c.chunk_bytes >> 20)
        }
        Protocol::CopyEngine => staged("ce"),
    }
}

pub(crate) fn devcomm_call(
    cx: &Ctx,
    src: &CudaSlice<u8>,
    dst: &mut CudaSlice<u8>,
    bytes: usize,
    peer: usize,
    both: bool,
    config: Option<P2PConfig>,
) -> Result<(), String> {
    let rank = cx.comm.rank();
    let (sp, _s) = src.device_ptr(&cx.stream);
    let (dp, _d) = dst.device_ptr_mut(&cx.stream);
    let t = |ptr| Transfer {
        ptr,
        bytes: bytes as u64,
        peer,
        config,
    };
    let (send, recv) = match (both, rank) {
        (true, _) => (Some(t(sp)), Some(t(dp))),
        (false, 0) => (Some(t(sp)), None),
        (false, _) => (None, Some(t(dp))),
    };
    // SAFETY: src and dst are this rank's allocations of at least `bytes`, alive until the
    // stream is synchronised by the caller; nothing else writes dst meanwhile.
    unsafe { cx.comm.sendrecv_raw(send, recv, &cx.stream) }.map_err(|e| e.to_string())
}

pub(crate) fn nccl_call(
    nccl: &NcclPair,
    src: &CudaSlice<u8>,
    dst: &mut CudaSlice<u8>,
    bytes: usize,
    peer: usize,
    both: bool,
    rank: usize,
) -> Result<(), String> {
    let c = nccl.comm();
    let err = |e| format!("NCCL: {e:?}");
    if both {
        nccl_result::group_start().map_err(err)?;
        c.send(&src.slice(..bytes), peer as i32).map_err(err)?;
        c.recv(&mut dst.slice_mut(..bytes), peer as i32)
            .map_err(err)?;
        nccl_result::group_end().map_err(err)?;
    } else if rank == 0 {
        c.send(&src.slice(..bytes), peer as i32).map_err(err)?;
    } else {
        c.recv(&mut dst.slice_mut(..bytes), peer as i32)
            .map_err(err)?;
    }
    Ok(())
}
