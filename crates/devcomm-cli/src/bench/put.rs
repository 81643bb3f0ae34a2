//! `devcomm bench --op put`: one GPU pushing into a peer's window by 16-byte stores and by TMA
//! bulk copies, and pulling by TMA, against the copy engine and NCCL send/recv.

use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};

use crate::bench::{nccl, time_us, BenchArgs, Record};
use crate::selftest::Ctx;

/// One `put` record: `bytes` moved on `blocks` in `t` us against a reference's `ref_us`.
fn put_record(
    cx: &Ctx,
    args: &BenchArgs,
    (bytes, blocks): (usize, u32),
    (t, ref_us, reference): (f64, f64, &str),
    config: String,
) -> Record {
    Record {
        sms: blocks,
        reference: reference.into(),
        config,
        ..Record::new(cx, args, "put", bytes as u64).timed(t, ref_us, bytes as f64)
    }
}

/// TMA copy shapes the `put` benchmark times: (blocks, warps per block, stages per warp, chunk
/// bytes). Shared memory per block stays under 200 KiB.
const TMA_CONFIGS: [(u32, u32, u32, u32); 8] = [
    (8, 1, 4, 32768),
    (16, 1, 4, 32768),
    (32, 1, 4, 32768),
    (132, 1, 4, 32768),
    (16, 4, 2, 16384),
    (32, 4, 2, 16384),
    (132, 4, 2, 16384),
    (132, 2, 4, 16384),
];

/// `put` bandwidth from rank 0 into rank 1's window at several sizes and block counts, next to
/// the copy engine (cuMemcpyAsync into the same peer mapping) and NCCL send/recv.
pub(crate) fn run(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let comm = &cx.comm;
    let rank = comm.rank();
    let max = 1usize << 30;
    // SAFETY: everything below runs on one stream, synchronised before any buffer is dropped;
    // nothing needs cudarc's cross-stream events, which a graph capture cannot contain.
    unsafe { comm.context().disable_event_tracking() };
    let module = cx.foundation()?;
    let f = module
        .function("put_bandwidth")
        .map_err(|e| e.to_string())?;
    let tma = module
        .function("copy_bandwidth_tma")
        .map_err(|e| e.to_string())?;
    let win = comm.window::<u8>(max, 1).map_err(|e| e.to_string())?;
    let src_host = cx.data_of(rank, 9, 1 << 20);
    let mut src = cx
        .stream
        .alloc_zeros::<u8>(max)
        .map_err(|e| e.to_string())?;
    for chunk in 0..(max >> 20) {
        let mut view = src.slice_mut(chunk << 20..(chunk + 1) << 20);
        cx.stream
            .memcpy_htod(&src_host, &mut view)
            .map_err(|e| e.to_string())?;
    }
    let nccl = nccl::NcclPair::new(cx)?;
    let mut recv = cx
        .stream
        .alloc_zeros::<u8>(max)
        .map_err(|e| e.to_string())?;
    cx.sync()?;
    let handle = win.device_handle();
    let peer_ptr = win.get_nvlink_address(1).unwrap_or(0);
    let mut out = Vec::new();
    for bytes in [1usize << 20, 64 << 20, 1 << 30] {
        // Back-to-back launches per timed sample, as the baselines were timed: at 1 MiB a
        // single launch would mostly time the launch.
        let calls = ((64usize << 20) / bytes).clamp(1, 20);
        // NCCL send/recv between ranks 0 and 1 on the same buffers, and the copy engine.
        let nccl_us = nccl.time_send_recv(cx, &src, &mut recv, bytes, args.warmup, args.iters)?;
        let ce_us = if rank == 0 {
            let (sp, _g) = src.device_ptr(&cx.stream);
            time_us(
                &cx.stream,
                args.warmup,
                args.iters,
                || Ok(()),
                || {
                    for _ in 0..calls {
                        // SAFETY: `peer_ptr` is rank 1's window data mapped here and `sp`
                        // this rank's source, both of at least `bytes` and alive until the
                        // timing synchronises; rank 1 does not touch its window meanwhile.
                        unsafe {
                            devcomm::testing::memcpy_dtod_async(peer_ptr, sp, bytes, &cx.stream)
                        }
                        .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                },
            )? / calls as f64
        } else {
            f64::NAN
        };
        cx.host_barrier()?;
        for blocks in [4u32, 8, 16, 32, 132] {
            let (sp, _g) = src.device_ptr(&cx.stream);
            let peer = 1i32;
            let b = bytes as u64;
            let launches = || -> Result<(), String> {
                for _ in 0..calls {
                    let mut l = cx.stream.launch_builder(&f);
                    l.arg(&handle).arg(&peer).arg(&sp).arg(&b);
                    // SAFETY: put_bandwidth(DeviceWindow, int, const void*, u64); the window
                    // and src hold at least `bytes`.
                    unsafe {
                        l.launch(LaunchConfig {
                            grid_dim: (blocks, 1, 1),
                            block_dim: (512, 1, 1),
                            shared_mem_bytes: 0,
                        })
                    }
                    .map_err(|e| e.to_string())?;
                }
                Ok(())
            };
            let (us, graph_us) = if rank == 0 {
                let us = time_us(&cx.stream, args.warmup, args.iters, || Ok(()), launches)?
                    / calls as f64;
                // The same launches captured once and replayed: METHOD.md's remedy for launch
                // gaps between short kernels (at 1 MiB a put takes about 6 us).
                let graph = cx.capture(launches)?;
                let g_us = time_us(
                    &cx.stream,
                    args.warmup,
                    args.iters,
                    || Ok(()),
                    || graph.launch().map_err(|e| e.to_string()),
                )? / calls as f64;
                (us, g_us)
            } else {
                (f64::NAN, f64::NAN)
            };
            cx.host_barrier()?;
            if rank == 0 {
                for (launch, t) in [("stream", us), ("graph", graph_us)] {
                    for (reference, ref_us) in [
                        ("copy engine cuMemcpyAsync", ce_us),
                        ("NCCL send/recv", nccl_us),
                    ] {
                        out.push(put_record(
                            cx,
                            args,
                            (bytes, blocks),
                            (t, ref_us, reference),
                            format!("{calls} launches per sample, {launch}"),
                        ));
                    }
                }
            }
        }
        // Bulk copies by the Tensor Memory Accelerator (PERFORMANCE.md v11): pushed into the
        // peer's window, and pulled from it into a local buffer; on rank 0 only.
        if rank == 0 {
            for (blocks, warps, stages, chunk) in TMA_CONFIGS {
                for (dir, dst, srcp) in [
                    ("push", peer_ptr, src.device_ptr(&cx.stream).0),
                    ("pull", recv.device_ptr(&cx.stream).0, peer_ptr),
                ] {
                    let smem = warps * stages * (chunk + 8);
                    tma.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .map_err(|e| e.to_string())?;
                    let b = bytes as u64;
                    let launches = || -> Result<(), String> {
                        for _ in 0..calls {
                            let mut l = cx.stream.launch_builder(&tma);
                            l.arg(&dst).arg(&srcp).arg(&b).arg(&chunk).arg(&stages);
                            // SAFETY: copy_bandwidth_tma(void*, const void*, u64, u32, u32):
                            // both ranges hold `bytes`, a multiple of 16 as is `chunk`, and
                            // the shared memory is the kernel's layout.
                            unsafe {
                                l.launch(LaunchConfig {
                                    grid_dim: (blocks, 1, 1),
                                    block_dim: (32 * warps, 1, 1),
                                    shared_mem_bytes: smem,
                                })
                            }
                            .map_err(|e| e.to_string())?;
                        }
                        Ok(())
                    };
                    let t = time_us(&cx.stream, args.warmup, args.iters, || Ok(()), launches)?
                        / calls as f64;
                    out.push(put_record(
                        cx,
                        args,
                        (bytes, blocks),
                        (t, ce_us, "copy engine cuMemcpyAsync"),
                        format!(
                            "tma {dir} warps={warps} stages={stages} chunk={chunk}, {calls} launches per sample"
                        ),
                    ));
                }
            }
        }
        cx.host_barrier()?;
    }
    cx.sync()?;
    Ok(out)
}
