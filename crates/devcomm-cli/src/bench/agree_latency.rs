//! `devcomm bench --op agree_latency`: what the call agreement costs a host-launched small
//! send/recv (docs/PROTOCOL.md, "Agreement": budget 0.2 us at 8 B), measured on one
//! communicator, call by call.
//!
//! Each rank builds one communicator of its own whose send/recv kernels carry the per-call
//! switch of the agreement (`-DDC_AGREE_SWITCH=1`, `devcomm::testing::set_agreement_off`): a
//! call with the switch off runs the agreement's code as every build does, one with it on
//! skips it as `-DDC_AGREE=0` would. Ranks 0 and 1 exchange `--min-bytes` (at least 8) both
//! ways, each call launched and synchronised on its own, in `--iters` rounds of 200 calls in
//! the pattern on, off, off, on (both ranks switch for the same calls), after `--warmup` x 100
//! untimed calls. On and off thus share the communicator, its memory and the moment, so
//! neither the spread between processes (up to 1.2 us on 2 H200s) nor the one between
//! communicators built one after the other (up to 1 us on 2 H100s) enters the difference.
//!
//! Per round: cost = median(on) - median(off); control = median of the on calls that end a
//! group of four - median of those that start one (the same code at two places of the
//! pattern: what the comparison cannot resolve). The record holds the medians per call with
//! (`devcomm_us`) and without (`nccl_us`, see `reference`) the agreement, and in `config` the
//! medians of the rounds' cost and control with their ranges. On one shared GPU
//! (scripts/shared-gpu.sh 2) the figures are marked not meaningful: nothing crosses NVLink.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream};
use devcomm::testing::{agreement_timing, set_agreement_off, AGREE_SWITCH};
use devcomm::Comm;

use super::{BenchArgs, Record};
use crate::selftest::{fresh_comm_with, Ctx, Fresh};

/// The option that compiles the agreement out (crates/devcomm/cuda/devcomm/agree.cuh).
const AGREE_OFF: &str = "-DDC_AGREE=0";
/// Timed calls per round (a multiple of the pattern's length).
const CALLS_PER_ROUND: usize = 200;
/// Per group of four calls: whether the agreement is on.
const PATTERN: [bool; 4] = [true, false, false, true];
/// The option that makes the low-latency roles add up their phase times (agree.cuh).
const TIMING: &str = "-DDC_AGREE_TIMING=1";

/// The phases `-DDC_AGREE_TIMING=1` adds up (agree.cuh), as "on/off" mean ns per call.
fn phases(t: &[u64; 16]) -> String {
    let names = [
        "sender past its barrier",
        "sender's lines stored",
        "receiver's lines seen",
        "receiver's end",
    ];
    let mean = |base: usize, w: usize| t[base + w] as f64 / t[base].max(1) as f64;
    let parts: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{n} {:.0}/{:.0}", mean(0, i + 1), mean(8, i + 1)))
        .collect();
    format!(
        "phase means in ns from each role's start, with/without the agreement ({} and {} \
         calls): {}",
        t[0],
        t[8],
        parts.join(", ")
    )
}

/// The communicator of the comparison, its stream and its two buffers.
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

    /// One host-launched send/recv + synchronise with `peer`, the agreement `on` or not;
    /// microseconds.
    fn call(&mut self, peer: usize, on: bool) -> Result<f64, String> {
        set_agreement_off(&self.comm, !on).map_err(|e| e.to_string())?;
        let t = Instant::now();
        self.comm
            .sendrecv(&self.src, peer, &mut self.dst, peer, &self.stream)
            .and_then(|()| self.comm.synchronize(&self.stream))
            .map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_secs_f64() * 1e6)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn run(cx: &Ctx, args: &BenchArgs) -> Result<Vec<Record>, String> {
    let mut config = cx.comm.config().clone();
    if config.p2p_options.iter().any(|o| o == AGREE_OFF) {
        return Err(format!(
            "bench --op agree_latency switches the agreement per call: leave {AGREE_OFF} out of \
             DEVCOMM_P2P_OPTIONS"
        ));
    }
    if !config.p2p_options.iter().any(|o| o == AGREE_SWITCH) {
        config.p2p_options.push(AGREE_SWITCH.into());
    }
    let bytes = args.min_bytes.max(8);
    let mut n = 0;
    let f = fresh_comm_with(cx, "agree_latency", &mut n, |b| b.config(config))?;
    let mut side = Side::new(f, bytes)?;
    let rounds = args.iters.max(2);
    let (mut on_all, mut off_all) = (Vec::new(), Vec::new());
    let (mut cost, mut control) = (Vec::new(), Vec::new());
    cx.host_barrier()?;
    let rank = cx.comm.rank();
    if rank < 2 {
        let peer = 1 - rank;
        for i in 0..args.warmup * 100 {
            side.call(peer, PATTERN[i % 4])
                .map_err(|e| format!("warm-up call {i}: {e}"))?;
        }
        for r in 0..rounds {
            let (mut on, mut off, mut first, mut last) = (vec![], vec![], vec![], vec![]);
            for i in 0..CALLS_PER_ROUND {
                let k = i % PATTERN.len();
                let us = side
                    .call(peer, PATTERN[k])
                    .map_err(|e| format!("round {r}, call {i}: {e}"))?;
                match k {
                    0 => first.push(us),
                    3 => last.push(us),
                    _ => off.push(us),
                }
                if PATTERN[k] {
                    on.push(us);
                }
            }
            on_all.extend_from_slice(&on);
            off_all.extend_from_slice(&off);
            cost.push(median(&mut on) - median(&mut off));
            control.push(median(&mut last) - median(&mut first));
        }
    }
    set_agreement_off(&side.comm, false).map_err(|e| e.to_string())?;
    let timed = side.comm.config().p2p_options.iter().any(|o| o == TIMING);
    let timing = if timed && rank < 2 {
        let t = agreement_timing(&side.comm).map_err(|e| e.to_string())?;
        let p = phases(&t);
        println!("agree_latency rank {rank}: {p}");
        format!("; rank {rank}'s {p}")
    } else {
        String::new()
    };
    cx.host_barrier()?;
    if rank != 0 {
        return Ok(Vec::new());
    }
    let (m_on, m_off) = (median(&mut on_all), median(&mut off_all));
    let range = |v: &[f64]| (v[0], v[v.len() - 1]);
    let (d, dc) = (median(&mut cost), median(&mut control));
    let ((lo, hi), (clo, chi)) = (range(&cost), range(&control));
    println!(
        "agree_latency {bytes} B: with the agreement {m_on:.2} us, without {m_off:.2} us per \
         call; cost per round: median {d:+.3} us, range {lo:+.3} .. {hi:+.3}; control: median \
         {dc:+.3} us, range {clo:+.3} .. {chi:+.3}; {rounds} rounds"
    );
    Ok(vec![Record {
        both_directions: true,
        devcomm_us: m_on,
        nccl_us: m_off,
        ratio: m_off / m_on,
        sms: 1,
        reference: format!(
            "ref_us = the same calls without the agreement, switched per call on one \
             communicator ({AGREE_SWITCH}; pattern on, off, off, on); host-launched sendrecv + \
             synchronise per call"
        ),
        config: format!(
            "cost median(on) - median(off) per round: median {d:+.3} us, range {lo:+.3} .. \
             {hi:+.3}; control (on calls ending a group of four - those starting one): median \
             {dc:+.3} us, range {clo:+.3} .. {chi:+.3}; {rounds} rounds of {CALLS_PER_ROUND} \
             calls each{timing}"
        ),
        ..Record::new(cx, args, "agree_latency", bytes as u64)
    }])
}
