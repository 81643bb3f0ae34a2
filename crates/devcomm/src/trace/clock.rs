//! The offset between the GPU's `%globaltimer` and the host's `CLOCK_REALTIME`, measured when
//! tracing starts and again at every read of the trace: the two clocks drift apart by parts per
//! million (microseconds per second), so a device event is placed on the host clock by the
//! offset interpolated between the measurements before and after it ([`offset_at`]).
//!
//! One thread of a small kernel waits for the host's go word `i` in host-mapped memory, reads
//! `%globaltimer` and writes it back; the host notes its clock just before the go and just
//! after it sees the stamp. The GPU read lies inside that round trip, so `stamp - midpoint` is
//! the offset to within half of it; of `SAMPLES` round trips the shortest wins (a PCIe round
//! trip is a few microseconds; a sample stretched by an interrupt or a slow poll is dropped).
//! Every rank of a host reads the same `CLOCK_REALTIME`, so after this each rank's device
//! events land on one clock; across hosts the ranks are as aligned as their clocks
//! (NTP or PTP; docs/TRACING.md).

use std::time::{Duration, Instant};

use std::sync::Arc;

use cudarc::driver::{CudaContext, DeviceRepr, LaunchConfig};
use serde::{Deserialize, Serialize};

use super::now_ns;
use crate::cuda::HostMapped;
use crate::error::{CudaResultExt, Error, Result};
use crate::jit::{KernelSpec, LoadedModule};

/// Round trips measured.
const SAMPLES: usize = 32;
/// How long either side waits for the other before giving up.
const LIMIT: Duration = Duration::from_secs(5);

const SOURCE: &str = r#"#include "devcomm/ordering.cuh"
struct ClockArgs { dc_u64 go; dc_u64 stamp; dc_u64 n; dc_u64 limit_ns; };
extern "C" __global__ void dc_trace_clock(ClockArgs a) {
  volatile dc_u64* go = reinterpret_cast<volatile dc_u64*>(a.go);
  volatile dc_u64* stamp = reinterpret_cast<volatile dc_u64*>(a.stamp);
  const dc_u64 deadline = devcomm::globaltimer_ns() + a.limit_ns;
  for (dc_u64 i = 0; i < a.n; ++i) {
    while (go[i] == 0) {
      if (devcomm::globaltimer_ns() > deadline) return;
    }
    stamp[i] = devcomm::globaltimer_ns();
    __threadfence_system();
  }
}
"#;

/// The kernel's argument (`ClockArgs` above).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ClockArgs {
    go: u64,
    stamp: u64,
    n: u64,
    limit_ns: u64,
}

// SAFETY: four plain u64, laid out as the kernel's struct.
unsafe impl DeviceRepr for ClockArgs {}

/// The spec of the clock kernel.
pub fn spec() -> KernelSpec {
    KernelSpec::new("devcomm_trace_clock", SOURCE).name_expression("dc_trace_clock")
}

/// One sample: the host's clock before the go and after the stamp, and the stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Host ns before the go word was written.
    pub host_before: u64,
    /// Host ns after the stamp was seen.
    pub host_after: u64,
    /// The GPU's `%globaltimer` in between.
    pub gpu: u64,
}

/// One measurement of the GPU clock against the host's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockPoint {
    /// The GPU's `%globaltimer` when it was taken.
    pub gpu_ns: u64,
    /// `%globaltimer - CLOCK_REALTIME` then, in ns.
    pub offset_ns: i64,
    /// The round trip it came from: the offset is good to half of it.
    pub rtt_ns: u64,
}

/// The point of the sample with the shortest round trip: offset = gpu - the midpoint of the
/// host's two readings. `None` without samples.
pub fn best_offset(samples: &[Sample]) -> Option<ClockPoint> {
    samples
        .iter()
        .filter(|s| s.host_after >= s.host_before)
        .min_by_key(|s| s.host_after - s.host_before)
        .map(|s| {
            let mid =
                s.host_before / 2 + s.host_after / 2 + (s.host_before % 2 + s.host_after % 2) / 2;
            ClockPoint {
                gpu_ns: s.gpu,
                offset_ns: s.gpu as i64 - mid as i64,
                rtt_ns: s.host_after - s.host_before,
            }
        })
}

/// The offset at GPU time `t`: linear between `start` and a later point `end` (and beyond
/// them, the same line); `start`'s alone without `end` or when `end` is not later.
pub fn offset_at(start: ClockPoint, end: Option<ClockPoint>, t: u64) -> i64 {
    match end {
        Some(end) if end.gpu_ns > start.gpu_ns => {
            let span = i128::from(end.gpu_ns - start.gpu_ns);
            let drift = i128::from(end.offset_ns) - i128::from(start.offset_ns);
            let since = i128::from(t) - i128::from(start.gpu_ns);
            start.offset_ns + (drift * since / span) as i64
        }
        _ => start.offset_ns,
    }
}

/// Measures the clock point of `ctx`'s GPU (see the module's doc) with `module`,
/// the clock kernel's (`KernelKind::TraceClock`, loaded by the caller through the one load
/// path); `rank` names the rank in an error.
pub(crate) fn measure(
    ctx: &Arc<CudaContext>,
    module: &LoadedModule,
    rank: usize,
) -> Result<ClockPoint> {
    let failed = |reason: String| Error::Setup {
        step: "trace: measuring the GPU clock".into(),
        failures: vec![(rank, reason)],
    };
    let func = module.function("dc_trace_clock")?;
    let words = HostMapped::new(ctx, 2 * SAMPLES * 8)?;
    let go = words.host_ptr().cast::<u64>();
    // SAFETY: `words` holds 2 * SAMPLES words; the second half holds the stamps.
    let stamp = unsafe { go.add(SAMPLES) };
    // A stream of devcomm's own: the user's context stays in cudarc's single-stream mode.
    let stream = crate::cuda::InternalStream::new(ctx)?;
    let args = ClockArgs {
        go: words.device_ptr(),
        stamp: words.device_ptr() + (SAMPLES * 8) as u64,
        n: SAMPLES as u64,
        limit_ns: LIMIT.as_nanos() as u64,
    };
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel takes one ClockArgs; `words` outlives it (synchronised below).
    unsafe { crate::cuda::launch_struct(&stream, &func, cfg, &args, false) }
        .cuda(-1, "cuLaunchKernel (trace clock)")?;
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let host_before = now_ns();
        // SAFETY: word i of the go half; the kernel only reads it.
        unsafe { std::ptr::write_volatile(go.add(i), 1) };
        let deadline = Instant::now() + LIMIT;
        let gpu = loop {
            // SAFETY: word i of the stamp half, written by the kernel.
            let g = unsafe { std::ptr::read_volatile(stamp.add(i)) };
            if g != 0 {
                break g;
            }
            if Instant::now() > deadline {
                // Let the kernel end before `words` is freed.
                for j in i..SAMPLES {
                    // SAFETY: as above.
                    unsafe { std::ptr::write_volatile(go.add(j), 1) };
                }
                let _ = stream.synchronize();
                return Err(failed(format!(
                    "no reply from the clock kernel within {LIMIT:?}"
                )));
            }
            std::hint::spin_loop();
        };
        samples.push(Sample {
            host_before,
            host_after: now_ns(),
            gpu,
        });
    }
    stream
        .synchronize()
        .cuda(-1, "cuStreamSynchronize (trace clock)")?;
    best_offset(&samples).ok_or_else(|| failed("no sample".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shortest_round_trip_gives_the_offset() {
        let samples = [
            Sample {
                host_before: 1_000,
                host_after: 9_000,
                gpu: 50_000,
            },
            Sample {
                host_before: 20_000,
                host_after: 21_000,
                gpu: 70_400,
            },
            Sample {
                host_before: 30_000,
                host_after: 35_000,
                gpu: 80_000,
            },
        ];
        // Midpoint 20_500, stamp 70_400: the GPU clock runs 49_900 ns ahead, +- 500.
        let point = ClockPoint {
            gpu_ns: 70_400,
            offset_ns: 49_900,
            rtt_ns: 1_000,
        };
        assert_eq!(best_offset(&samples), Some(point));
        assert_eq!(best_offset(&[]), None);
        // A GPU clock behind the host's gives a negative offset.
        let behind = [Sample {
            host_before: 1_000_001,
            host_after: 1_000_003,
            gpu: 10,
        }];
        let offset = best_offset(&behind).map(|p| (p.offset_ns, p.rtt_ns));
        assert_eq!(offset, Some((10 - 1_000_002, 2)));
    }

    #[test]
    fn the_offset_between_two_points_is_interpolated() {
        let start = ClockPoint {
            gpu_ns: 1_000_000_000,
            offset_ns: -300_000,
            rtt_ns: 2_000,
        };
        // 10 s later the GPU clock is 50 us further ahead (5 ppm).
        let end = ClockPoint {
            gpu_ns: 11_000_000_000,
            offset_ns: -250_000,
            ..start
        };
        assert_eq!(offset_at(start, Some(end), start.gpu_ns), -300_000);
        assert_eq!(offset_at(start, Some(end), end.gpu_ns), -250_000);
        assert_eq!(offset_at(start, Some(end), 6_000_000_000), -275_000);
        // Before the start and after the end: the same line.
        assert_eq!(offset_at(start, Some(end), 0), -305_000);
        assert_eq!(offset_at(start, Some(end), 21_000_000_000), -200_000);
        // No later point, or one not later: the start's offset.
        assert_eq!(offset_at(start, None, 6_000_000_000), -300_000);
        assert_eq!(offset_at(start, Some(start), 6_000_000_000), -300_000);
        // A drift the other way.
        let back = ClockPoint {
            offset_ns: -350_000,
            ..end
        };
        assert_eq!(offset_at(start, Some(back), 6_000_000_000), -325_000);
    }
}
