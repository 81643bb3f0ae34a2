//! `devcomm bench --op ce`: what a message moved by the copy engine in chunks costs, against
//! one copy of the whole message. Rank 0 copies into (push) or out of (pull) rank 1's window,
//! and locally, in chunks of several sizes, on one or several streams, with and without the
//! stream memory operations a paced pipeline puts around each chunk (a wait on a word that is
//! already set, a write with a memory barrier). It places the per-chunk cost of the
//! copy-engine protocol (docs/PERFORMANCE.md, v9 and v15); the other ranks only meet the
//! barriers.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};

use super::{time_us, BenchArgs, Record};
use crate::selftest::Ctx;

/// Where the chunks go.
#[derive(Clone, Copy)]
enum Dir {
    Push,
    Pull,
    Local,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Push => "push",
            Dir::Pull => "pull",
            Dir::Local => "local",
        }
    }
}

/// One timed shape: chunks of `chunk` bytes over `streams` streams (chunk k on stream k %
/// streams), each chunk between a satisfied wait and a write when `ops`.
#[derive(Clone, Copy)]
struct Shape {
    chunk: usize,
    streams: usize,
    ops: bool,
}

const MIB: usize = 1 << 20;

pub(crate) fn run(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let comm = &cx.comm;
    let rank = comm.rank();
    let total = args.max_bytes.clamp(64 * MIB, 1 << 30);
    let e = |x: cudarc::driver::DriverError| x.to_string();
    let d = |x: devcomm::Error| x.to_string();
    // The window's signal words (device memory the stream memory operations accept, unlike
    // cudarc's stream-ordered allocations): word 0 stays 0 for the satisfied waits, words 1..
    // take the writes.
    let win = comm.window::<u8>(total, 8).map_err(d)?;
    let peer_ptr = win.get_nvlink_address(1).unwrap_or(0);
    let mut out = Vec::new();
    if rank == 0 {
        let src = cx.stream.alloc_zeros::<u8>(total).map_err(e)?;
        let dst = cx.stream.alloc_zeros::<u8>(total).map_err(e)?;
        let ctx = cx.stream.context();
        let extra: Vec<Arc<CudaStream>> = (0..3)
            .map(|_| ctx.new_stream().map_err(e))
            .collect::<Result<_, _>>()?;
        cx.sync()?;
        let (sp, _g1) = src.device_ptr(&cx.stream);
        let (dp, _g2) = dst.device_ptr(&cx.stream);
        let wp = win.signals_device_ptr();
        let mut shapes = vec![Shape {
            chunk: total,
            streams: 1,
            ops: false,
        }];
        for chunk in [4 * MIB, 16 * MIB, 32 * MIB, 64 * MIB] {
            for (streams, ops) in [(1, false), (1, true), (2, false), (2, true), (4, false)] {
                shapes.push(Shape {
                    chunk,
                    streams,
                    ops,
                });
            }
        }
        for dir in [Dir::Push, Dir::Pull, Dir::Local] {
            let (to, from) = match dir {
                Dir::Push => (peer_ptr, sp),
                Dir::Pull => (dp, peer_ptr),
                Dir::Local => (dp, sp),
            };
            let mut whole_us = f64::NAN;
            for s in &shapes {
                let enqueue = || -> Result<(), String> {
                    let all: Vec<&CudaStream> = std::iter::once(&*cx.stream)
                        .chain(extra.iter().map(|x| &**x))
                        .take(s.streams)
                        .collect();
                    for x in &all[1..] {
                        x.join(&cx.stream).map_err(e)?;
                    }
                    let chunks = total.div_ceil(s.chunk);
                    for k in 0..chunks {
                        let on = all[k % s.streams];
                        let off = k * s.chunk;
                        let len = (total - off).min(s.chunk);
                        // SAFETY: `wp` is the window's signal words (8 of them, alive with
                        // `win`), the wait is for >= 0 so it passes at once; `to`/`from` are
                        // this rank's buffers or the peer's window mapped here, each of
                        // `total` bytes and alive until the timing synchronises.
                        unsafe {
                            if s.ops {
                                devcomm::testing::stream_wait_geq(on, wp, 0).map_err(d)?;
                            }
                            devcomm::testing::memcpy_dtod_async(
                                to + off as u64,
                                from + off as u64,
                                len,
                                on,
                            )
                            .map_err(d)?;
                            if s.ops {
                                let word = wp + 8 * (1 + (k % 7) as u64);
                                devcomm::testing::stream_write(on, word, k as u64 + 2)
                                    .map_err(d)?;
                            }
                        }
                    }
                    for x in &all[1..] {
                        cx.stream.join(x).map_err(e)?;
                    }
                    Ok(())
                };
                let us = time_us(&cx.stream, args.warmup, args.iters, || Ok(()), enqueue)?;
                if s.chunk == total {
                    whole_us = us;
                }
                let config = format!(
                    "{} chunk={}MiB streams={} ops={}",
                    dir.name(),
                    s.chunk / MIB,
                    s.streams,
                    if s.ops { "wait+write" } else { "none" }
                );
                let reference = (whole_us, "one copy of the whole message, one stream");
                let record = ce_record(cx, args, total, (us, false, config), reference);
                // Progress as it goes: a stuck shape shows where it stopped.
                eprintln!(
                    "ce {:>9.1} us {:>6.1} GB/s  {}",
                    record.devcomm_us, record.devcomm_gbps, record.config
                );
                out.push(record);
            }
        }
        cx.sync()?;
    }
    cx.host_barrier()?;
    out.extend(two_gpus(cx, args, &win, total)?);
    drop(win);
    Ok(out)
}

/// Both GPUs' copy engines at once, on ranks 0 and 1 (the others only meet the barriers): the
/// message 0 -> 1 in chunks, pushed by rank 0's copy engine, pulled by rank 1's, or split
/// (even chunks pushed, odd ones pulled); `both`: the same in both directions at once, with
/// and without the stream memory operations of a paced pipeline around each copy ([`Case`]).
/// Chunk k lies at offset k * chunk in the source, the peer's window and the destination; the
/// data is not checked.
fn two_gpus(
    cx: &Ctx,
    args: &BenchArgs,
    win: &devcomm::Window<u8>,
    total: usize,
) -> Result<Vec<Record>, String> {
    let rank = cx.comm.rank();
    let e = |x: cudarc::driver::DriverError| x.to_string();
    let d = |x: devcomm::Error| x.to_string();
    let active = rank < 2;
    let src = cx.stream.alloc_zeros::<u8>(total).map_err(e)?;
    let dst = cx.stream.alloc_zeros::<u8>(total).map_err(e)?;
    cx.sync()?;
    let (sp, _g1) = src.device_ptr(&cx.stream);
    let (dp, _g2) = dst.device_ptr(&cx.stream);
    let peer_ptr = if active {
        win.get_nvlink_address(1 - rank).unwrap_or(0)
    } else {
        0
    };
    let pull_stream = cx.stream.context().new_stream().map_err(e)?;
    let wp = win.signals_device_ptr();
    let mut cases: Vec<Case> = Vec::new();
    for chunk in [16 * MIB, 32 * MIB, 64 * MIB] {
        for way in [Way::Push, Way::Split, Way::Pull] {
            for (both, ops) in [(false, false), (true, false), (true, true)] {
                cases.push(Case {
                    chunk,
                    way,
                    both,
                    ops,
                });
            }
        }
    }
    let labels: Vec<String> = cases.iter().map(Case::label).collect();
    let names: Vec<&str> = labels.iter().map(String::as_str).collect();
    let times = super::time_ranks_each(cx, 2, args.warmup, args.iters, 1, &names, &mut |i| {
        let c = cases[i];
        pull_stream.join(&cx.stream).map_err(e)?;
        let sends = rank == 0 || c.both;
        let receives = rank == 1 || c.both;
        for k in 0..total.div_ceil(c.chunk) {
            let off = k * c.chunk;
            let len = (total - off).min(c.chunk);
            let pushed = match c.way {
                Way::Push => true,
                Way::Split => k % 2 == 0,
                Way::Pull => false,
            };
            let (to, from, on) = if pushed {
                if !sends {
                    continue;
                }
                (peer_ptr, sp, &cx.stream) // push this rank's chunk k
            } else {
                if !receives {
                    continue;
                }
                // Pulls on a stream of their own, so that a rank that also pushes runs both.
                (dp, peer_ptr, &pull_stream) // pull the peer's chunk k
            };
            // SAFETY: `wp` is the window's signal words (8 of them, alive with `win`), the wait
            // is for >= 0 so it passes at once; `to`/`from` are this rank's buffers or the
            // peer's mapped here, each of `total` bytes and alive until the timing synchronises.
            unsafe {
                if c.ops {
                    devcomm::testing::stream_wait_geq(on, wp, 0).map_err(d)?;
                }
                devcomm::testing::memcpy_dtod_async(to + off as u64, from + off as u64, len, on)
                    .map_err(d)?;
                if c.ops {
                    let word = wp + 8 * (1 + (k % 7) as u64);
                    devcomm::testing::stream_write(on, word, k as u64 + 2).map_err(d)?;
                }
            }
        }
        cx.stream.join(&pull_stream).map_err(e)?;
        Ok(())
    })?;
    Ok(cases
        .iter()
        .zip(times)
        .map(|(c, us)| {
            let label = c.label();
            eprintln!(
                "ce2 {us:>9.1} us {:>6.1} GB/s  {label}",
                total as f64 / us / 1e3
            );
            ce_record(cx, args, total, (us, c.both, label), (f64::NAN, "none"))
        })
        .collect())
}

/// Who moves the chunks of a two-GPU case.
#[derive(Clone, Copy)]
enum Way {
    /// The sender's copy engine pushes every chunk.
    Push,
    /// The sender's pushes the even chunks, the receiver's pulls the odd ones.
    Split,
    /// The receiver's copy engine pulls every chunk.
    Pull,
}

/// One two-GPU case: chunks of `chunk` bytes moved `way`, 0 -> 1 or both ways at once, each
/// copy between a satisfied wait and a write when `ops`.
#[derive(Clone, Copy)]
struct Case {
    chunk: usize,
    way: Way,
    both: bool,
    ops: bool,
}

impl Case {
    fn label(&self) -> String {
        let way = match self.way {
            Way::Push => "push",
            Way::Split => "split",
            Way::Pull => "pull",
        };
        format!(
            "{}{way} chunk={}MiB{}",
            if self.both { "both " } else { "" },
            self.chunk / MIB,
            if self.ops { " ops=wait+write" } else { "" }
        )
    }
}

/// One `ce` record: `total` bytes in `us` (both directions or not, under `config`) against a
/// reference's time (NaN for none).
fn ce_record(
    cx: &Ctx,
    args: &BenchArgs,
    total: usize,
    (us, both, config): (f64, bool, String),
    (ref_us, reference): (f64, &str),
) -> Record {
    Record {
        both_directions: both,
        reference: reference.into(),
        config,
        ..Record::new(cx, args, "ce", total as u64).timed(us, ref_us, total as f64)
    }
}
