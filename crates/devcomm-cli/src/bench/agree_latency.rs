//! `devcomm bench --op agree_latency`: what the call agreement costs a host-launched small
//! send/recv (docs/PROTOCOL.md, "Agreement": budget 0.2 us at 8 B), measured in one process.
//!
//! Each rank builds three communicators of its own, in this order: A (as configured: the
//! agreement on), B (the agreement compiled out: `-DDC_AGREE=0` added to the send/recv
//! kernels' options) and C (as A). Ranks 0 and 1 exchange `--min-bytes` (at least 8) both
//! ways, each call launched and synchronised on its own, in `--iters` rounds; a round times
//! 200 calls on each communicator, starting with A, B and C in turn, after `--warmup` x 100
//! untimed calls on each. All three run in the same processes, on the same GPUs, interleaved in
//! time, so the process-to-process spread of separate runs (up to 1.2 us on 2 H200s) drops out,
//! and the agreement's cost is taken per round as (A + C) / 2 - B: a drift with the order in
//! which the communicators were built cancels (seen: the second of two communicators built
//! alike about 1 us slower per call on 2 H100s). C - A, two communicators built alike, is the
//! control: what the comparison cannot resolve. The record holds the medians per call of A and
//! C together (`devcomm_us`) and of B (`nccl_us`, see `reference`); `config` the medians of the
//! rounds' cost and control with their ranges. On one shared GPU (scripts/shared-gpu.sh 2)
//! the figures are marked not meaningful: nothing crosses NVLink.

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

/// One communicator of the comparison, its stream and its two buffers.
struct Side {
    comm: Comm,
    stream: Arc<CudaStream>,
    src: CudaSlice<u8>,
    dst: CudaSlice<u8>,
}

impl Side {
    fn new(Fresh { comm, stream }: Fresh, bytes: usize) -> Result<Self, String> {
        comm.bind_stream(&stream).map_err(|e| e.to_string())?;
        let rank = comm.rank() as u8;
        let src = stream
            .clone_htod(&vec![rank; bytes])
            .map_err(|e| e.to_string())?;
        let dst = stream.alloc_zeros::<u8>(bytes).map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())?;
        Ok(Self {
            comm,
            stream,
            src,
            dst,
        })
    }

    /// `calls` host-launched send/recv + synchronise with `peer`; microseconds per call.
    fn time(&mut self, peer: usize, calls: usize, out: &mut Vec<f64>) -> Result<(), String> {
        for i in 0..calls {
            let t = Instant::now();
            self.comm
                .sendrecv(&self.src, peer, &mut self.dst, peer, &self.stream)
                .and_then(|()| self.comm.synchronize(&self.stream))
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
    let base = cx.comm.config();
    if base.p2p_options.iter().any(|o| o == AGREE_OFF) {
        return Err(format!(
            "bench --op agree_latency compares the agreement on with a communicator of its own \
             built with {AGREE_OFF}: leave {AGREE_OFF} out of DEVCOMM_P2P_OPTIONS"
        ));
    }
    let mut off = base.clone();
    off.p2p_options.push(AGREE_OFF.into());
    let bytes = args.min_bytes.max(8);
    let mut n = 0;
    let mut sides = Vec::new();
    for config in [base.clone(), off, base.clone()] {
        let f = fresh_comm_with(cx, "agree_latency", &mut n, |b| b.config(config))?;
        sides.push(Side::new(f, bytes)?);
    }
    let rounds = args.iters.max(2);
    let mut all: [Vec<f64>; 3] = Default::default();
    let (mut cost, mut control) = (Vec::new(), Vec::new());
    cx.host_barrier()?;
    let rank = cx.comm.rank();
    if rank < 2 {
        let peer = 1 - rank;
        let mut scratch = Vec::new();
        for s in &mut sides {
            s.time(peer, args.warmup * 100, &mut scratch)?;
        }
        for r in 0..rounds {
            let mut m = [0.0; 3];
            for k in 0..3 {
                let i = (r + k) % 3;
                let mut v = Vec::new();
                sides[i].time(peer, CALLS_PER_ROUND, &mut v)?;
                all[i].extend_from_slice(&v);
                m[i] = median(&mut v);
            }
            cost.push((m[0] + m[2]) / 2.0 - m[1]);
            control.push(m[2] - m[0]);
        }
    }
    cx.host_barrier()?;
    if rank != 0 {
        return Ok(Vec::new());
    }
    let [a, b, c] = &mut all;
    let (ma, mb, mc) = (median(a), median(b), median(c));
    let mut on: Vec<f64> = a.iter().chain(c.iter()).copied().collect();
    let m_on = median(&mut on);
    let range = |v: &[f64]| (v[0], v[v.len() - 1]);
    let (d, dc) = (median(&mut cost), median(&mut control));
    let ((lo, hi), (clo, chi)) = (range(&cost), range(&control));
    println!(
        "agree_latency {bytes} B: A (on) {ma:.2} us, B (compiled out) {mb:.2} us, C (on) {mc:.2} \
         us per call; cost (A + C) / 2 - B per round: median {d:+.3} us, range {lo:+.3} .. \
         {hi:+.3}; control C - A: median {dc:+.3} us, range {clo:+.3} .. {chi:+.3}; {rounds} \
         rounds"
    );
    Ok(vec![Record {
        both_directions: true,
        devcomm_us: m_on,
        nccl_us: mb,
        ratio: mb / m_on,
        sms: 1,
        reference: format!(
            "ref_us = the same calls with the agreement compiled out ({AGREE_OFF}); three \
             communicators built on, off, on in the same processes, interleaved; host-launched \
             sendrecv + synchronise per call"
        ),
        config: format!(
            "cost (A + C) / 2 - B per round: median {d:+.3} us, range {lo:+.3} .. {hi:+.3}; \
             control C - A: median {dc:+.3} us, range {clo:+.3} .. {chi:+.3}; A {ma:.2} us, \
             C {mc:.2} us; {rounds} rounds of {CALLS_PER_ROUND} calls each"
        ),
        ..Record::new(cx, args, "agree_latency", bytes as u64)
    }])
}
