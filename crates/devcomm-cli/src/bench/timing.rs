//! The timing harness every benchmark shares: CUDA events around what a closure enqueues,
//! candidates timed in turn after host barriers, medians, the slowest rank's median.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::bench::nccl;
use crate::selftest::Ctx;

/// Two timing events (cudarc's default disables timing) that time what one closure enqueues.
pub(crate) struct EventTimer {
    start: cudarc::driver::CudaEvent,
    end: cudarc::driver::CudaEvent,
}

impl EventTimer {
    pub(crate) fn new(stream: &CudaStream) -> Result<Self, String> {
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = || {
            stream
                .context()
                .new_event(timing)
                .map_err(|e| e.to_string())
        };
        Ok(Self {
            start: event()?,
            end: event()?,
        })
    }

    /// Microseconds between the events around what `f` enqueues on `stream`, after waiting for
    /// it.
    pub(crate) fn time(
        &self,
        stream: &CudaStream,
        f: impl FnOnce() -> Result<(), String>,
    ) -> Result<f64, String> {
        let e = |x: cudarc::driver::DriverError| x.to_string();
        self.start.record(stream).map_err(e)?;
        f()?;
        self.end.record(stream).map_err(e)?;
        self.end.synchronize().map_err(e)?;
        Ok(f64::from(self.start.elapsed_ms(&self.end).map_err(e)?) * 1e3)
    }
}

/// Median of event-timed runs of `f` on `stream`, in microseconds. Each run is preceded by
/// `before` (untimed; e.g. a host barrier so that ranks start together).
pub(crate) fn time_us(
    stream: &Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    mut before: impl FnMut() -> Result<(), String>,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let timer = EventTimer::new(stream)?;
    let mut samples = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        before()?;
        let us = timer.time(stream, &mut f)?;
        if i >= warmup {
            samples.push(us);
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Median host wall-clock times of several candidates, timed in turn as in
/// [`time_ranks_each`]: `f(i)` runs candidate `i` (named `names[i]`), then the stream is
/// synchronised; each sample starts on an idle stream after a host barrier. Every rank returns
/// the slowest rank's median per candidate. For calls that wait on the GPU from the host
/// inside, where only this times them the way a user sees them.
pub(crate) fn time_wall_each(
    cx: &Ctx,
    warmup: usize,
    iters: usize,
    names: &[&str],
    f: &mut dyn FnMut(usize) -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let sync = || cx.stream.synchronize().map_err(|e| e.to_string());
    let samples = in_turn(cx, true, warmup, iters, names.len(), &mut |i| {
        sync()?;
        let t0 = std::time::Instant::now();
        f(i)?;
        sync()?;
        Ok(t0.elapsed().as_secs_f64() * 1e6)
    })?;
    slowest_medians(cx, names, samples)
}

/// Median times of several candidates between CUDA events, one call a sample, started on
/// every rank together: after a host barrier, a device barrier on the stream (untimed), then
/// the start event, `f(i)` (candidate `i`, named `names[i]`) and the end event. For calls that
/// wait on the GPU from the host inside: the stream idles meanwhile, which the events count.
/// The device barrier leaves out the skew with which the ranks leave the host barrier (tens of
/// microseconds at times, which host-clocked single calls count in full). Every rank returns
/// the slowest rank's median per candidate.
pub(crate) fn time_from_barrier_each(
    cx: &Ctx,
    warmup: usize,
    iters: usize,
    names: &[&str],
    f: &mut dyn FnMut(usize) -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let timer = EventTimer::new(&cx.stream)?;
    let samples = in_turn(cx, true, warmup, iters, names.len(), &mut |i| {
        cx.comm.barrier(&cx.stream).map_err(|e| e.to_string())?;
        timer.time(&cx.stream, || f(i))
    })?;
    slowest_medians(cx, names, samples)
}

/// Runs `sample(i)` for every candidate `i < n` in each of `warmup + iters` rounds, after a
/// host barrier each time, forward in even rounds and backward in odd ones: drift during the
/// run (clocks, neighbours on the machine) then falls on every candidate alike, and none
/// always follows the same other. Ranks that do not `time` only meet the barriers. Returns
/// the timed rounds' samples per candidate (empty where not timed).
pub(crate) fn in_turn(
    cx: &Ctx,
    time: bool,
    warmup: usize,
    iters: usize,
    n: usize,
    sample: &mut dyn FnMut(usize) -> Result<f64, String>,
) -> Result<Vec<Vec<f64>>, String> {
    let mut samples = vec![Vec::with_capacity(iters); n];
    for round in 0..warmup + iters {
        for k in 0..n {
            let i = if round % 2 == 0 { k } else { n - 1 - k };
            cx.host_barrier()?;
            if time {
                let s = sample(i)?;
                if round >= warmup {
                    samples[i].push(s);
                }
            }
        }
    }
    Ok(samples)
}

/// Each candidate's median (0 where this rank has no samples), then the slowest rank's.
pub(crate) fn slowest_medians(
    cx: &Ctx,
    names: &[&str],
    mut samples: Vec<Vec<f64>>,
) -> Result<Vec<f64>, String> {
    cx.sync()?;
    let mut out = Vec::with_capacity(names.len());
    for (name, s) in names.iter().zip(&mut samples) {
        s.sort_by(f64::total_cmp);
        let us = s.get(s.len() / 2).copied().unwrap_or(0.0);
        out.push(nccl::max_over_ranks(cx, name, us)?);
    }
    Ok(out)
}

/// Per-call median time of `calls` back-to-back calls of `f` on ranks 0 and 1 (each sample
/// starts after a host barrier); the other ranks only meet the barriers. Every rank returns
/// the slower of ranks 0 and 1.
pub(crate) fn time_pair(
    cx: &Ctx,
    warmup: usize,
    iters: usize,
    calls: usize,
    what: &str,
    f: &mut dyn FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    time_ranks(cx, 2, warmup, iters, calls, what, f)
}

/// [`time_pair`] on ranks `0..ranks` (every rank for collectives): the slowest rank's median.
pub(crate) fn time_ranks(
    cx: &Ctx,
    ranks: usize,
    warmup: usize,
    iters: usize,
    calls: usize,
    what: &str,
    f: &mut dyn FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    Ok(time_ranks_each(cx, ranks, warmup, iters, calls, &[what], &mut |_| f())?[0])
}

/// Per-call median times of several candidates on ranks `0..ranks`, timed in turn (see
/// `in_turn`): `f(i)` makes one call of candidate `i` (named `names[i]`); a sample is
/// `calls` back-to-back calls between two CUDA events. Every rank returns the slowest rank's
/// median per candidate.
pub(crate) fn time_ranks_each(
    cx: &Ctx,
    ranks: usize,
    warmup: usize,
    iters: usize,
    calls: usize,
    names: &[&str],
    f: &mut dyn FnMut(usize) -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let timer = EventTimer::new(&cx.stream)?;
    let active = cx.comm.rank() < ranks;
    let samples = in_turn(cx, active, warmup, iters, names.len(), &mut |i| {
        let us = timer.time(&cx.stream, || {
            for _ in 0..calls {
                f(i)?;
            }
            Ok(())
        })?;
        Ok(us / calls as f64)
    })?;
    slowest_medians(cx, names, samples)
}

/// Back-to-back calls per timed sample: enough that one sample lasts well over the launch gap.
pub(crate) fn calls_per_sample(bytes: usize) -> usize {
    ((64usize << 20) / bytes.max(1)).clamp(1, 50)
}

/// The smallest free device memory over the ranks, less `headroom` (room for what NCCL
/// allocates lazily).
pub(crate) fn min_free_bytes(cx: &Ctx, headroom: usize) -> Result<usize, String> {
    let (free, _) = cx
        .comm
        .context()
        .mem_get_info()
        .map_err(|e| e.to_string())?;
    // The minimum is the negated maximum of the negated values.
    let min = -nccl::max_over_ranks(cx, "free-bytes", -(free as f64))?;
    Ok((min as usize).saturating_sub(headroom))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_per_sample_is_between_1_and_50() {
        assert_eq!(calls_per_sample(0), 50);
        assert_eq!(calls_per_sample(8), 50);
        assert_eq!(calls_per_sample(2 << 20), 32);
        assert_eq!(calls_per_sample(64 << 20), 1);
        assert_eq!(calls_per_sample(1 << 30), 1);
    }
}
