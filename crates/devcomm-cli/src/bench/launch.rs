//! `devcomm bench --op launch`: what one call costs the host, against what it costs the GPU.
//!
//! The small-message benchmarks time back-to-back calls, so their time per call is the larger
//! of the host's time to enqueue a call and the GPU's time to run it. This benchmark separates
//! the two: for each case it enqueues `CALLS` calls back to back and measures both the host's
//! wall time until the last call returned (host microseconds per call) and the CUDA events
//! around the calls (GPU microseconds per call). Cases: an empty kernel launched through
//! cudarc (the floor of any launch), devcomm's and NCCL's 8-byte send from rank 0 to rank 1,
//! and devcomm's and NCCL's all-to-all of 1 KiB per peer on every rank.

use std::cell::RefCell;
use std::time::Instant;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::bench::nccl::NcclPair;
use crate::bench::{in_turn, slowest_medians, BenchArgs, EventTimer, Record};
use crate::selftest::Ctx;

/// Calls per sample: few enough that no launch queue fills (a full queue would make the host
/// wait for the GPU).
const CALLS: usize = 100;

/// One case: its name, the ranks that take part, and one call on this rank.
type Case<'a> = (
    &'static str,
    usize,
    Box<dyn FnMut() -> Result<(), String> + 'a>,
);

pub(crate) fn run(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let (world, rank) = (cx.comm.world_size(), cx.comm.rank());
    let e = |x: cudarc::driver::DriverError| x.to_string();
    let nccl = NcclPair::new(cx)?;
    let module = cx.foundation()?;
    let empty = module
        .function("put_bandwidth")
        .map_err(|x| x.to_string())?;
    let win = cx.comm.window::<u8>(64, 1).map_err(|x| x.to_string())?;
    let handle = win.device_handle();
    let src: CudaSlice<u8> = cx.stream.alloc_zeros(world << 10).map_err(e)?;
    let dst: RefCell<CudaSlice<u8>> = RefCell::new(cx.stream.alloc_zeros(world << 10).map_err(e)?);
    let chunks: Vec<_> = (0..world).map(|p| p << 10..(p + 1) << 10).collect();
    let comm = &cx.comm;
    let stream = &cx.stream;
    let mut cases: Vec<Case<'_>> = vec![
        (
            "empty kernel",
            world,
            Box::new(|| {
                let (peer, zero, null) = (0i32, 0u64, 0u64);
                let mut l = stream.launch_builder(&empty);
                l.arg(&handle).arg(&peer).arg(&null).arg(&zero);
                // SAFETY: put_bandwidth(DeviceWindow, int, const void*, u64) with 0 bytes
                // touches no memory.
                unsafe { l.launch(LaunchConfig::for_num_elems(32)) }
                    .map(|_| ())
                    .map_err(|x| x.to_string())
            }),
        ),
        (
            "devcomm send 8 B",
            2,
            Box::new(|| {
                match rank {
                    0 => comm.send(&src.slice(..8), 1, stream),
                    _ => comm.recv(&mut dst.borrow_mut().slice_mut(..8), 0, stream),
                }
                .map_err(|x| x.to_string())
            }),
        ),
        (
            "nccl send 8 B",
            2,
            Box::new(|| {
                match rank {
                    0 => nccl.comm().send(&src.slice(..8), 1).map(|_| ()),
                    _ => nccl
                        .comm()
                        .recv(&mut dst.borrow_mut().slice_mut(..8), 0)
                        .map(|_| ()),
                }
                .map_err(|x| format!("NCCL: {x:?}"))
            }),
        ),
        (
            "devcomm all-to-all 1 KiB",
            world,
            Box::new(|| {
                comm.all_to_all(&src.slice(..), &mut dst.borrow_mut().slice_mut(..), stream)
                    .map_err(|x| x.to_string())
            }),
        ),
        (
            "nccl all-to-all 1 KiB",
            world,
            Box::new(|| {
                nccl.all_to_all(
                    &src.slice(..),
                    &mut dst.borrow_mut().slice_mut(..),
                    &chunks,
                    &chunks,
                )
            }),
        ),
    ];
    let timer = EventTimer::new(stream)?;
    let mut out = Vec::new();
    for (name, ranks, call) in cases.iter_mut() {
        let active = rank < *ranks;
        // in_turn keeps the GPU time of each sample (warm-up rounds included here, dropped
        // below for the host's), this closure the host's.
        let mut host = Vec::new();
        let gpu = in_turn(cx, active, args.warmup, args.iters, 1, &mut |_| {
            let mut wall = 0.0;
            let us = timer.time(stream, || {
                let t0 = Instant::now();
                for _ in 0..CALLS {
                    call()?;
                }
                wall = t0.elapsed().as_secs_f64() * 1e6;
                Ok(())
            })?;
            host.push(wall / CALLS as f64);
            Ok(us / CALLS as f64)
        })?;
        let host = host.split_off(host.len().min(args.warmup));
        let host_name = format!("launch-host-{name}");
        let gpu_name = format!("launch-gpu-{name}");
        let slowest = slowest_medians(
            cx,
            &[&host_name, &gpu_name],
            vec![host, gpu.into_iter().next().unwrap_or_default()],
        )?;
        let (h, g) = (slowest[0], slowest[1]);
        out.push(Record {
            world_size: *ranks,
            devcomm_us: h,
            nccl_us: g,
            ratio: g / h,
            reference: format!(
                "devcomm_us: host wall time per call while enqueueing {CALLS} calls back to \
                 back; nccl_us: CUDA-event time per call around them (slowest rank's medians)"
            ),
            ..Record::new(cx, args, &format!("launch: {name}"), 0)
        });
    }
    cx.sync()?;
    drop(cases);
    Ok(if rank == 0 { out } else { Vec::new() })
}
