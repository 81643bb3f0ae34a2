//! Tracing (docs/TRACING.md, DESIGN section 17): where the time of a call goes.
//!
//! - Host: every launch of a public call opens a [`CallScope`]: an NVTX range named
//!   `devcomm:<op>` with the bytes, peers and algorithm ([`nvtx`]; nothing without an attached
//!   tool), and with tracing on a host record of the call ([`HostCall`]).
//! - Device: with `DEVCOMM_TRACE=1` every kernel is compiled with `-DDC_TRACE=1`
//!   ([`crate::kernels::kernel_spec`]) and records per-block events into this rank's ring
//!   ([`ring`]); the ring's address is written into each module's `dc_trace_ring` global once
//!   after loading ([`DeviceTrace::attach`]). Before each traced call's kernels the call's id
//!   is written into the ring's header in stream order, so that every event names its call.
//! - Clock: at setup a small kernel reads `%globaltimer` between host timestamps
//!   ([`clock`]); the offset maps device times onto the host's `CLOCK_REALTIME`.
//! - Output: [`RankTrace`]s of every rank ([`crate::Comm::gather_trace`]) merge into one
//!   Chrome / Perfetto trace ([`chrome`]) and a per-operation summary ([`summary`]).

pub mod chrome;
pub mod clock;
pub mod nvtx;
pub mod ring;
pub mod summary;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream};
use serde::{Deserialize, Serialize};

use crate::cuda::{bind, memset_zero, stream_write, DeviceBuffer};
use crate::error::{CudaResultExt, Result};
use crate::jit::LoadedModule;
pub use ring::{Kind, RawEvent};

/// The name of the modules' global that holds the ring's address (`trace.cuh`).
const RING_GLOBAL: &str = "dc_trace_ring";

/// One public call as the host saw it (tracing on).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostCall {
    /// Its id (the `call` of its kernels' events); ids start at 1.
    pub call: u32,
    /// The operation, e.g. `all_reduce`.
    pub op: String,
    /// Bytes this rank contributes (its input).
    pub bytes: u64,
    /// The peers it moves data with.
    pub peers: Vec<usize>,
    /// The algorithm or protocol chosen (e.g. `two-shot`, `ll128`).
    pub algorithm: String,
    /// The stream it was launched on (its handle, as a number: the track of the call).
    pub stream: u64,
    /// Host `CLOCK_REALTIME` ns when the call began and when its launch returned.
    pub begin_ns: u64,
    /// See `begin_ns`.
    pub end_ns: u64,
}

/// One rank's trace: its host calls, its device events and its clock offset.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankTrace {
    /// The rank.
    pub rank: usize,
    /// `%globaltimer - CLOCK_REALTIME` in ns, measured when this trace's span began (at setup,
    /// or at the previous read) ([`clock`]).
    pub clock_offset_ns: i64,
    /// Round trip of the clock sample the offset came from (its uncertainty).
    pub clock_rtt_ns: u64,
    /// The GPU's `%globaltimer` when `clock_offset_ns` was measured.
    #[serde(default)]
    pub clock_gpu_ns: u64,
    /// The clock measured again at the read; the offset of an event in between is interpolated
    /// ([`RankTrace::host_ns`]). `None` when that measurement failed.
    #[serde(default)]
    pub clock_end: Option<clock::ClockPoint>,
    /// The host calls, in order.
    pub calls: Vec<HostCall>,
    /// The device events, as recorded.
    pub events: Vec<RawEvent>,
    /// Device events dropped because the ring was full.
    pub dropped: u64,
    /// Host calls dropped (more calls than the ring's capacity between two reads).
    pub dropped_calls: u64,
}

impl RankTrace {
    /// The host time (`CLOCK_REALTIME` ns) of the device time `gpu_ns`: minus the offset
    /// interpolated between the clock measurements before and after the events.
    pub fn host_ns(&self, gpu_ns: u64) -> i64 {
        let start = clock::ClockPoint {
            gpu_ns: self.clock_gpu_ns,
            offset_ns: self.clock_offset_ns,
            rtt_ns: self.clock_rtt_ns,
        };
        gpu_ns as i64 - clock::offset_at(start, self.clock_end, gpu_ns)
    }

    /// How fast the GPU clock ran ahead of the host's between the two clock measurements, in
    /// parts per million; `None` without a second one, or when they are less than a second
    /// apart (each is good to about a microsecond: over a shorter span the slope is mostly
    /// that error, though the offsets in between stay within it).
    pub fn clock_drift_ppm(&self) -> Option<f64> {
        const MIN_SPAN_NS: u64 = 1_000_000_000;
        let end = self.clock_end?;
        let span = end
            .gpu_ns
            .checked_sub(self.clock_gpu_ns)
            .filter(|&s| s >= MIN_SPAN_NS)?;
        Some((end.offset_ns - self.clock_offset_ns) as f64 * 1e6 / span as f64)
    }

    /// The trace as bytes (for the store): the length of a JSON of everything but the events,
    /// that JSON, then the events as the ring lays them out.
    pub fn to_bytes(&self) -> Vec<u8> {
        let head = RankTrace {
            events: Vec::new(),
            ..self.clone()
        };
        // Serialising plain data to JSON cannot fail.
        let json = serde_json::to_vec(&head).unwrap_or_default();
        let mut out = Vec::with_capacity(8 + json.len() + 32 * self.events.len());
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&json);
        for e in &self.events {
            for w in ring::encode_event(e) {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        out
    }

    /// The trace as JSON (for the Python package: a dict of these fields).
    pub fn to_json(&self) -> String {
        // Serialising plain data to JSON cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The trace of [`RankTrace::to_bytes`]; an error names what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, String> {
        let len = bytes
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
            .ok_or("a rank's trace shorter than its header")?;
        let json = bytes
            .get(8..8usize.saturating_add(len))
            .ok_or("a rank's trace shorter than its JSON")?;
        let mut trace: RankTrace =
            serde_json::from_slice(json).map_err(|e| format!("a rank's trace: {e}"))?;
        let rest = &bytes[8 + len..];
        if rest.len() % 32 != 0 {
            return Err(format!(
                "a rank's events are {} bytes, not whole records",
                rest.len()
            ));
        }
        trace.events = rest.chunks_exact(32).map(ring::decode_event).collect();
        Ok(trace)
    }
}

/// Host `CLOCK_REALTIME` in ns.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A rank's trace state (tracing on): the ring in device memory and the host calls.
pub(crate) struct DeviceTrace {
    ctx: Arc<CudaContext>,
    rank: usize,
    ring: DeviceBuffer,
    capacity: u64,
    next_call: AtomicU32,
    /// The clock kernel, to measure the clock again at every read.
    clock_kernel: Arc<LoadedModule>,
    /// The last clock measurement (setup, then every read).
    clock: Mutex<clock::ClockPoint>,
    calls: Mutex<(Vec<HostCall>, u64)>,
}

impl std::fmt::Debug for DeviceTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTrace")
            .field("rank", &self.rank)
            .field("ring", &self.ring)
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// Offset of the header's `call` word (and `rank` above it, one 64-bit word).
const CALL_WORD: u64 = 16;

impl DeviceTrace {
    /// Allocates a ring of `capacity` events on `ctx`'s device and measures the clock offset.
    /// `clock_kernel`: the module of `KernelKind::TraceClock` on `ctx`'s device.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        rank: usize,
        capacity: u32,
        clock_kernel: Arc<LoadedModule>,
    ) -> Result<Self> {
        let bytes = ring::HEADER_BYTES + capacity as usize * std::mem::size_of::<RawEvent>();
        let trace = Self {
            ctx: ctx.clone(),
            rank,
            ring: DeviceBuffer::zeroed(ctx, bytes)?,
            capacity: capacity as u64,
            next_call: AtomicU32::new(1),
            clock: Mutex::new(clock::measure(ctx, &clock_kernel, rank)?),
            clock_kernel,
            calls: Mutex::new((Vec::new(), 0)),
        };
        trace.clear()?;
        Ok(trace)
    }

    /// Writes the ring's address into `module`'s `dc_trace_ring` (a module without traced
    /// kernels has no such global: nothing to do).
    pub(crate) fn attach(&self, module: &LoadedModule) -> Result<()> {
        bind(&self.ctx)?;
        let stream = self.ctx.default_stream();
        let rank = self.rank as i32;
        let mut global = match module.module().get_global(RING_GLOBAL, &stream) {
            Ok(g) => g,
            Err(e) if crate::cuda::is_not_found(&e) => return Ok(()),
            Err(e) => return Err(e).cuda(rank, "cuModuleGetGlobal (dc_trace_ring)"),
        };
        let address = self.ring.ptr().to_le_bytes();
        stream
            .memcpy_htod(&address[..], &mut global)
            .and_then(|()| stream.synchronize())
            .cuda(rank, "writing the trace ring's address")
    }

    /// Starts a call on `stream`: its id, written into the ring's header in stream order
    /// (with the rank, the other half of that 64-bit word).
    fn begin_call(&self, stream: &CudaStream) -> u32 {
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        let word = (self.rank as u64) << 32 | call as u64;
        if let Err(e) = stream_write(stream, self.ring.ptr() + CALL_WORD, word) {
            // The events then carry the previous id; the trace is still readable.
            log::warn!("rank {}: writing the trace's call id: {e}", self.rank);
        }
        call
    }

    fn end_call(&self, call: HostCall) {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if (calls.0.len() as u64) < self.capacity {
            calls.0.push(call);
        } else {
            calls.1 += 1;
        }
    }

    /// Reads and clears the ring and the host calls. The caller has synchronised every stream
    /// that ran traced kernels (events of kernels still running may be missing or partial).
    pub(crate) fn take(&self) -> Result<RankTrace> {
        let mut header = vec![0u8; ring::HEADER_BYTES];
        self.ring.read(0, &mut header)?;
        let (head, _) = ring::decode(&header);
        let n = head.claimed.min(self.capacity) as usize;
        let mut image = vec![0u8; ring::HEADER_BYTES + n * std::mem::size_of::<RawEvent>()];
        self.ring.read(0, &mut image)?;
        let (head, events) = ring::decode(&image);
        self.clear()?;
        let (calls, dropped_calls) = {
            let mut c = self.calls.lock().unwrap_or_else(|p| p.into_inner());
            (std::mem::take(&mut c.0), std::mem::replace(&mut c.1, 0))
        };
        // The clock again: the span from the last measurement to this one brackets the events.
        let end = clock::measure(&self.ctx, &self.clock_kernel, self.rank)
            .inspect_err(|e| log::warn!("rank {}: measuring the GPU clock again: {e}", self.rank))
            .ok();
        let start = {
            let mut last = self.clock.lock().unwrap_or_else(|p| p.into_inner());
            let start = *last;
            if let Some(end) = end {
                *last = end;
            }
            start
        };
        Ok(RankTrace {
            rank: self.rank,
            clock_offset_ns: start.offset_ns,
            clock_rtt_ns: start.rtt_ns,
            clock_gpu_ns: start.gpu_ns,
            clock_end: end,
            calls,
            events,
            dropped: ring::dropped(head.claimed, head.capacity),
            dropped_calls,
        })
    }

    /// Zeroes the ring (every record's kind 0) and writes its header.
    fn clear(&self) -> Result<()> {
        // SAFETY: the ring is this value's allocation; no kernel records into it now (the
        // caller synchronised the device, or none was launched yet).
        unsafe { memset_zero(&self.ctx, self.ring.ptr(), self.ring.bytes()) }?;
        let mut header = [0u8; 24];
        header[8..16].copy_from_slice(&self.capacity.to_le_bytes());
        header[20..24].copy_from_slice(&(self.rank as u32).to_le_bytes());
        self.ring.write(0, &header)?;
        // The memset and copy may still run when these return; a kernel on a non-blocking
        // stream must not record into the ring before they have.
        crate::cuda::synchronize(&self.ctx)
    }
}

/// What a launch says about its call, for its NVTX range and host record (built only when a
/// profiler is attached or tracing is on).
#[derive(Debug, Clone)]
pub(crate) struct CallInfo {
    pub(crate) op: &'static str,
    pub(crate) bytes: u64,
    pub(crate) peers: Vec<usize>,
    pub(crate) algorithm: String,
}

/// One call's host side, from its launch's start to its end (drop): the NVTX range and,
/// tracing on, the host record.
pub(crate) struct CallScope<'t> {
    nvtx: bool,
    record: Option<(&'t DeviceTrace, HostCall)>,
}

impl<'t> CallScope<'t> {
    /// Opens the scope of a call launched on `stream`; `info` is called only when a profiler
    /// is attached or tracing is on (otherwise the scope costs two loads).
    pub(crate) fn open(
        trace: Option<&'t DeviceTrace>,
        stream: &CudaStream,
        info: impl FnOnce() -> CallInfo,
    ) -> Self {
        if trace.is_none() && !nvtx::enabled() {
            return Self {
                nvtx: false,
                record: None,
            };
        }
        let begin_ns = now_ns();
        let info = info();
        let nvtx = nvtx::push(|| {
            format!(
                "devcomm:{} bytes={} peers={:?} algorithm={}",
                info.op, info.bytes, info.peers, info.algorithm
            )
        });
        let record = trace.map(|t| {
            let call = t.begin_call(stream);
            let host = HostCall {
                call,
                op: info.op.to_owned(),
                bytes: info.bytes,
                peers: info.peers,
                algorithm: info.algorithm,
                stream: stream.cu_stream() as u64,
                begin_ns,
                end_ns: begin_ns,
            };
            (t, host)
        });
        Self { nvtx, record }
    }
}

impl Drop for CallScope<'_> {
    fn drop(&mut self) {
        if let Some((t, mut call)) = self.record.take() {
            call.end_ns = now_ns();
            t.end_call(call);
        }
        if self.nvtx {
            nvtx::pop();
        }
    }
}

#[cfg(test)]
mod tests;
