//! `devcomm bench --op agree_latency`: what the call agreement costs a host-launched small
//! send/recv (docs/PROTOCOL.md, "Agreement": budget 0.2 us at 8 B), measured in one process.
//!
//! Each rank holds two communicators: the usual one (agreement on) and a second built with the
//! agreement compiled out (`-DDC_AGREE=0` added to the send/recv kernels' options). Ranks 0
//! and 1 exchange `--min-bytes` (at least 8) both ways, each call launched and synchronised
//! on its own, in `--iters` rounds; a round times 200 calls on each communicator, in an order
//! that alternates from round to round, after `--warmup` x 100 untimed calls on each. Both
//! variants thus run in the same processes, on the same GPUs, interleaved in time, so the
//! process-to-process spread that separate runs carry (up to 1.2 us on 2 H200s) drops out.
//! The record holds the median per call with the agreement on (`devcomm_us`) and off
//! (`nccl_us`, see `reference`), and `config` the median of the rounds' paired differences
//! with their range. `--reference same` builds the second communicator alike (an A/A control:
//! its paired difference is what the two communicators' setup alone shifts, to subtract from
//! the A/B's). On one shared GPU (scripts/shared-gpu.sh 2) the figures are marked not
//! meaningful: nothing crosses NVLink.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream};
use devcomm::Comm;

use super::{BenchArgs, Record};
use crate::selftest::{fresh_comm_with, Ctx, Fresh};

/// The option that compiles the agreement out (crates/devcomm/cuda/devcomm/agree.cuh).
const AGREE_OFF: &str = "-DDC_AGREE=0";
/// Timed calls per communicator per round.
const CALLS_PER_ROUND: usize = 200;

/// One side of the comparison: a communicator, its stream and its two buffers.
struct Side<'a> {
    comm: &'a Comm,
    stream: &'a Arc<CudaStream>,
    src: CudaSlice<u8>,
    dst: CudaSlice<u8>,
}

impl<'a> Side<'a> {
    fn new(comm: &'a Comm, stream: &'a Arc<CudaStream>, bytes: usize) -> Result<Self, String> {
        let rank = comm.rank() as u8;
        Ok(Self {
            comm,
            stream,
            src: stream
                .clone_htod(&vec![rank; bytes])
                .map_err(|e| e.to_string())?,
            dst: stream.alloc_zeros::<u8>(bytes).map_err(|e| e.to_string())?,
        })
    }

    /// `calls` host-launched send/recv + synchronise with `peer`; microseconds per call.
    fn time(&mut self, peer: usize, calls: usize, out: &mut Vec<f64>) -> Result<(), String> {
        for i in 0..calls {
            let t = Instant::now();
            self.comm
                .sendrecv(&self.src, peer, &mut self.dst, peer, self.stream)
                .and_then(|()| self.comm.synchronize(self.stream))
                .map_err(|e| format!("call {i}: {e}"))?;
            out.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(())
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn run(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let comm = &cx.comm;
    if comm.config().p2p_options.iter().any(|o| o == AGREE_OFF) {
        return Err(format!(
            "bench --op agree_latency compares the agreement on with a communicator of its own \
             built with {AGREE_OFF}: leave {AGREE_OFF} out of DEVCOMM_P2P_OPTIONS"
        ));
    }
    let control = match args.reference.as_str() {
        "all" => false,
        "same" => true,
        other => {
            return Err(format!(
                "bench --op agree_latency --reference {other}: `all` (agreement compiled out \
                 in the second communicator) or `same` (built alike: an A/A control)"
            ))
        }
    };
    let mut off_config = comm.config().clone();
    if !control {
        off_config.p2p_options.push(AGREE_OFF.into());
    }
    let second = if control {
        "the same settings (A/A control)"
    } else {
        "the agreement compiled out"
    };
    let mut n = 0;
    let Fresh {
        comm: off_comm,
        stream: off_stream,
    } = fresh_comm_with(cx, "agree_latency", &mut n, |b| b.config(off_config))?;
    off_comm
        .bind_stream(&off_stream)
        .map_err(|e| e.to_string())?;
    let bytes = args.min_bytes.max(8);
    let mut on = Side::new(comm, &cx.stream, bytes)?;
    let mut off = Side::new(&off_comm, &off_stream, bytes)?;
    let rounds = args.iters.max(2);
    let (mut all_on, mut all_off, mut diffs) = (Vec::new(), Vec::new(), Vec::new());
    cx.sync()?;
    off_stream.synchronize().map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    let rank = comm.rank();
    if rank < 2 {
        let peer = 1 - rank;
        let mut scratch = Vec::new();
        on.time(peer, args.warmup * 100, &mut scratch)?;
        off.time(peer, args.warmup * 100, &mut scratch)?;
        for r in 0..rounds {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            if r % 2 == 0 {
                on.time(peer, CALLS_PER_ROUND, &mut a)?;
                off.time(peer, CALLS_PER_ROUND, &mut b)?;
            } else {
                off.time(peer, CALLS_PER_ROUND, &mut b)?;
                on.time(peer, CALLS_PER_ROUND, &mut a)?;
            }
            all_on.extend_from_slice(&a);
            all_off.extend_from_slice(&b);
            diffs.push(median(&mut a) - median(&mut b));
        }
    }
    cx.host_barrier()?;
    if rank != 0 {
        return Ok(Vec::new());
    }
    let (m_on, m_off) = (median(&mut all_on), median(&mut all_off));
    let d = median(&mut diffs);
    let (lo, hi) = (diffs[0], diffs[diffs.len() - 1]);
    println!(
        "agree_latency {bytes} B: first communicator {m_on:.2} us, second ({second}) {m_off:.2} us per call \
         (medians of {} calls each); paired difference per round: median {d:+.3} us, range \
         {lo:+.3} .. {hi:+.3} us over {rounds} rounds",
        all_on.len()
    );
    Ok(vec![Record {
        both_directions: true,
        devcomm_us: m_on,
        nccl_us: m_off,
        ratio: m_off / m_on,
        sms: 1,
        reference: format!(
            "ref_us = the same calls on a second communicator in the same processes with \
             {second}, interleaved; host-launched sendrecv + synchronise per call"
        ),
        config: format!(
            "paired difference first - second per round: median {d:+.3} us, range {lo:+.3} .. \
             {hi:+.3} us, {rounds} rounds of {CALLS_PER_ROUND} calls each"
        ),
        ..Record::new(cx, args, "agree_latency", bytes as u64)
    }])
}
