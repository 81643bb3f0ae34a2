//! `devcomm bench --op latency`: one-way signal latency between ranks 0 and 1.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::bench::{BenchArgs, Record};
use crate::selftest::Ctx;

/// One-way signal latency from a ping-pong inside one kernel between ranks 0 and 1.
pub(crate) fn run(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let comm = &cx.comm;
    let module = cx.foundation()?;
    let f = module.function("pingpong").map_err(|e| e.to_string())?;
    let win = comm.window::<u64>(8, 1).map_err(|e| e.to_string())?;
    let elapsed = cx.stream.alloc_zeros::<u64>(1).map_err(|e| e.to_string())?;
    let iters = 10_000u64;
    let mut base = 0u64;
    let mut samples = Vec::new();
    for rep in 0..(args.warmup + args.iters) {
        cx.host_barrier()?;
        if comm.rank() < 2 {
            let peer = (1 - comm.rank()) as i32;
            let handle = win.device_handle();
            let mut l = cx.stream.launch_builder(&f);
            l.arg(&handle)
                .arg(&peer)
                .arg(&iters)
                .arg(&base)
                .arg(&elapsed);
            // SAFETY: pingpong(DeviceWindow, int, u64, u64, u64*); elapsed has one element.
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(|e| e.to_string())?;
            cx.sync()?;
            let ns = cx.stream.clone_dtoh(&elapsed).map_err(|e| e.to_string())?[0];
            if rep >= args.warmup && comm.rank() == 0 {
                samples.push(ns as f64 / (2 * iters) as f64 / 1e3);
            }
        }
        base += iters;
    }
    if comm.rank() != 0 {
        return Ok(Vec::new());
    }
    samples.sort_by(f64::total_cmp);
    let us = samples[samples.len() / 2];
    Ok(vec![Record {
        sms: 1,
        reference: "none (one-way time = ping-pong round trip / 2)".into(),
        devcomm_us: us,
        ..Record::new(cx, args, "signal_latency", 8)
    }])
}
