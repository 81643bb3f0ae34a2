//! The pure choices of the reductions in a job with network links (docs/NETWORK.md,
//! "Reductions with network peers"): the rounds a call is cut into so that each fits half of
//! the network scratch, each round's chunk per rank, and the operation code both ends of each
//! all-to-all compare. Every rank computes the same rounds from the same arguments.
//!
//! A round of an all-reduce covers elements `[base, base + len)` of the buffer: a reduce-scatter
//! step (an all-to-all of `world` chunks of `chunk` elements, the last ones padded), the local
//! reduction of this rank's chunk, and an all-gather step (an all-to-all-v that sends the
//! reduced chunk to every rank). A round of a reduce-scatter covers elements
//! `[base, base + len)` of every rank's shard, one of an all-gather `[base, base + len)` of the
//! input.

use super::plan::{plan, Collective, Shape, DEFAULT_MAX_BLOCKS};

/// Bytes per block of a local step of the network path.
const STEP_BLOCK_BYTES: u64 = 64 << 10;
use super::types::{DataType, ReduceOp};
use super::ReduceLimits;

/// One round of a reduction with network peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetRound {
    /// First element of the round (all-reduce: of the buffer; reduce-scatter: of each rank's
    /// shard; all-gather: of the input).
    pub base: u64,
    /// Elements of the round (all-reduce: of the buffer; otherwise of each rank's shard).
    pub len: u64,
    /// Elements each rank's chunk holds in the round's all-to-alls: all-reduce `len / world`
    /// rounded up to whole units (the last chunks are padding or short), otherwise `len`.
    pub chunk: u64,
    /// Whether the reduce-scatter step reads the caller's input directly; otherwise the round's
    /// input is staged into the scratch first (padding, or rounds of a strided shard). The
    /// all-gather steps always land in the scratch, and a local step writes the output.
    pub direct: bool,
}

impl NetRound {
    /// Elements of rank `q`'s chunk that hold data (all-reduce: the last chunks of a round may
    /// be short or empty).
    pub fn valid(&self, collective: Collective, q: u64) -> u64 {
        match collective {
            Collective::AllReduce => self.len.saturating_sub(q * self.chunk).min(self.chunk),
            _ => self.len,
        }
    }
}

/// How a call runs with network peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetPlan {
    /// The collective.
    pub collective: Collective,
    /// Elements as the call counts them (`Shape::count`).
    pub count: u64,
    /// Ranks.
    pub world: u64,
    /// Chunks are whole units of this many elements (16 bytes, or a row when hooked).
    pub unit: u64,
    /// Most elements of one rank's chunk in a round.
    pub max_chunk: u64,
    /// Rounds.
    pub rounds: u64,
}

impl NetPlan {
    /// Round `k` (< `rounds`).
    pub fn round(&self, k: u64) -> NetRound {
        let w = self.world;
        match self.collective {
            Collective::AllReduce => {
                let per_round = w * self.max_chunk;
                let base = k * per_round;
                let len = per_round.min(self.count - base);
                let chunk = len.div_ceil(w).div_ceil(self.unit) * self.unit;
                NetRound {
                    base,
                    len,
                    chunk,
                    direct: base + w * chunk <= self.count,
                }
            }
            _ => {
                let base = k * self.max_chunk;
                let len = self.max_chunk.min(self.count - base);
                NetRound {
                    base,
                    len,
                    chunk: len,
                    direct: self.rounds == 1,
                }
            }
        }
    }
}

/// The plan of a call with network peers, whose scratch halves hold `half_bytes` each. The
/// call's arguments are first checked as the NVLink planner checks them (element size, world,
/// rows of a hooked call), so both paths refuse the same calls with the same words.
pub fn net_plan(s: &Shape, limits: &ReduceLimits, half_bytes: u64) -> Result<NetPlan, String> {
    plan(s, limits)?;
    let es = s.elem_bytes;
    let w = s.world as u64;
    let unit = match s.row_len {
        Some(row) => lcm(row, 16 / es),
        None => 16 / es,
    };
    let max_chunk = half_bytes / w / es / unit * unit;
    if max_chunk == 0 {
        return Err(format!(
            "a chunk of {unit} elements of {es} bytes for each of {w} ranks does not fit half \
             of the network scratch ({half_bytes} bytes; DEVCOMM_NET_REDUCE_SCRATCH_MIB)"
        ));
    }
    let per_round = match s.collective {
        Collective::AllReduce => w * max_chunk,
        _ => max_chunk,
    };
    Ok(NetPlan {
        collective: s.collective,
        count: s.count,
        world: w,
        unit,
        max_chunk,
        rounds: s.count.div_ceil(per_round),
    })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// Blocks of a local step over `bytes` (one per 64 KiB, at most `MAX_BLOCKS`, at most the SMs).
pub fn step_blocks(bytes: u64, sm_count: u32) -> u32 {
    bytes
        .div_ceil(STEP_BLOCK_BYTES)
        .clamp(1, u64::from(DEFAULT_MAX_BLOCKS.min(sm_count.max(1)))) as u32
}

/// The all-to-alls of a reduction with network peers, and the barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetStep {
    /// The reduce-scatter step of an all-reduce (`ReduceOp`), or a reduce-scatter.
    Scatter(Collective, ReduceOp),
    /// The all-gather step of an all-reduce, or an all-gather.
    Gather(Collective),
    /// `Comm::barrier`.
    Barrier,
}

/// The operation code the collective kernel's two ends compare for a step
/// (`CollLaunch::op`): the all-to-all family's own codes are 1 to 3; the low 4 bits of a step
/// (what NVLink agreements carry) are 4 + op (the reduce-scatter step of an all-reduce with
/// sum, avg, max, min), 8 + op (a reduce-scatter), 12 (the all-gather step of an all-reduce),
/// 13 (an all-gather), 14 (a barrier); bits 8 to 11 add the element type + 1 and bit 12 a
/// hooked call, which network chunk headers carry and compare too.
pub fn step_code(step: NetStep, dtype: Option<DataType>, hooked: bool) -> u32 {
    let low = match step {
        NetStep::Scatter(Collective::AllReduce, op) => 4 + op.code(),
        NetStep::Scatter(_, op) => 8 + op.code(),
        NetStep::Gather(Collective::AllReduce) => 12,
        NetStep::Gather(_) => 13,
        NetStep::Barrier => 14,
    };
    let dtype = dtype.map_or(0, |d| d.code() + 1);
    low | (dtype << 8) | (u32::from(hooked) << 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(c: Collective, count: u64, es: u64, world: usize, row: Option<u64>) -> Shape {
        Shape {
            collective: c,
            count,
            elem_bytes: es,
            world,
            row_len: row,
        }
    }

    fn lim(world: usize) -> ReduceLimits {
        ReduceLimits::for_world(world)
    }

    /// Every element of the call is in exactly one round, in order, and each round's chunks
    /// fit half of the scratch.
    fn covers(p: &NetPlan, es: u64, half: u64) {
        let mut next = 0;
        for k in 0..p.rounds {
            let r = p.round(k);
            assert_eq!(r.base, next, "round {k} of {p:?}");
            assert!(r.len > 0, "empty round {k} of {p:?}");
            assert!(
                r.chunk * p.world * es <= half,
                "round {k} of {p:?} overflows"
            );
            // Whole units, except the remainder of the last round of a sharded call.
            if p.collective == Collective::AllReduce || k + 1 < p.rounds {
                assert_eq!(r.chunk % p.unit, 0, "round {k} of {p:?}");
            }
            let valid: u64 = (0..p.world).map(|q| r.valid(p.collective, q)).sum();
            match p.collective {
                Collective::AllReduce => assert_eq!(valid, r.len, "{r:?}"),
                _ => assert_eq!(valid, r.len * p.world),
            }
            next += r.len;
        }
        assert_eq!(next, p.count, "{p:?}");
    }

    #[test]
    fn rounds_cover_every_element_once() {
        for world in [2usize, 3, 4, 8] {
            for c in [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::AllGather,
            ] {
                for es in [1u64, 2, 4, 8] {
                    for half in [4096u64, 1 << 20, 32 << 20] {
                        for count in [1u64, 3, 1000, 4097, 1 << 20, (1 << 22) + 5] {
                            let s = shape(c, count, es, world, None);
                            let p = net_plan(&s, &lim(world), half).unwrap();
                            covers(&p, es, half);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn one_round_reads_the_callers_input_when_no_padding_is_needed() {
        // 4 ranks, 1024 f32: chunks of 256, nothing padded.
        let p = net_plan(
            &shape(Collective::AllReduce, 1024, 4, 4, None),
            &lim(4),
            1 << 20,
        )
        .unwrap();
        assert_eq!(p.rounds, 1);
        let r = p.round(0);
        assert_eq!((r.chunk, r.direct), (256, true));
        // 1001 f32: chunks of 252 (whole 16-byte units), the last one short: staged.
        let p = net_plan(
            &shape(Collective::AllReduce, 1001, 4, 4, None),
            &lim(4),
            1 << 20,
        )
        .unwrap();
        let r = p.round(0);
        assert_eq!((r.chunk, r.direct), (252, false));
        assert_eq!(r.valid(Collective::AllReduce, 3), 1001 - 3 * 252);
        // Several rounds of a reduce-scatter are strided in the input: staged.
        let p = net_plan(
            &shape(Collective::ReduceScatter, 1 << 20, 4, 4, None),
            &lim(4),
            1 << 20,
        )
        .unwrap();
        assert!(p.rounds > 1 && !p.round(0).direct);
    }

    #[test]
    fn hooked_chunks_hold_whole_rows() {
        for row in [1u64, 3, 100, 4096] {
            let s = shape(Collective::AllReduce, row * 37, 4, 4, Some(row));
            let p = net_plan(&s, &lim(4), 1 << 20).unwrap();
            covers(&p, 4, 1 << 20);
            for k in 0..p.rounds {
                let r = p.round(k);
                for q in 0..4 {
                    assert_eq!(r.valid(Collective::AllReduce, q) % row, 0, "{r:?}");
                }
            }
        }
    }

    #[test]
    fn refusals_name_the_cause() {
        // The NVLink planner's checks come first.
        let e = net_plan(
            &shape(Collective::AllReduce, 10, 4, 2, Some(3)),
            &lim(2),
            1 << 20,
        )
        .unwrap_err();
        assert!(e.contains("does not divide"), "{e}");
        // A row larger than half of the scratch per rank.
        let e = net_plan(
            &shape(Collective::AllReduce, 1 << 20, 4, 4, Some(1 << 20)),
            &lim(4),
            1 << 20,
        )
        .unwrap_err();
        assert!(e.contains("DEVCOMM_NET_REDUCE_SCRATCH_MIB"), "{e}");
    }

    #[test]
    fn step_codes_differ_where_the_calls_differ() {
        use Collective::*;
        let mut codes = Vec::new();
        for op in ReduceOp::ALL {
            codes.push(step_code(NetStep::Scatter(AllReduce, op), None, false));
            codes.push(step_code(NetStep::Scatter(ReduceScatter, op), None, false));
        }
        codes.push(step_code(NetStep::Gather(AllReduce), None, false));
        codes.push(step_code(NetStep::Gather(AllGather), None, false));
        codes.push(step_code(NetStep::Barrier, None, false));
        let mut low: Vec<u32> = codes.iter().map(|c| c & 15).collect();
        low.sort_unstable();
        low.dedup();
        assert_eq!(
            low.len(),
            codes.len(),
            "the NVLink agreement's 4 bits tell them apart"
        );
        // Never one of the all-to-all family's codes (1 to 3) nor 0.
        assert!(low.iter().all(|&c| c >= 4));
        // The element type and the hook reach the network header.
        let a = step_code(NetStep::Gather(AllGather), Some(DataType::F32), false);
        let b = step_code(NetStep::Gather(AllGather), Some(DataType::I32), false);
        let h = step_code(NetStep::Gather(AllGather), Some(DataType::F32), true);
        assert!(a != b && a != h && b != h);
        assert_eq!(a & 15, b & 15);
    }
}
