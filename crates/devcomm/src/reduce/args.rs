//! Host checks of a reduction's buffers: lengths, alignment, and the aliasing rules of in-place
//! and out-of-place calls. Pure, so every rule has a unit test.

use super::plan::Collective;
use crate::collective::overlap;

/// A call's buffers as the kernel takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub input: u64,
    pub output: u64,
    /// All-reduce: elements; reduce-scatter: output elements; all-gather: input elements.
    pub count: u64,
}

/// Why a call's buffers were refused, and whether a peer may have accepted the same layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub reason: String,
    /// The buffers overlap at exactly another rank's shard (a reduce-scatter output inside the
    /// input, an all-gather input inside the output): the in-place layout of that rank, which
    /// it accepts if it passes the same buffers. The refusing rank must then take part in the
    /// call (refused, writing nothing), or that rank would wait for it until the device
    /// timeout.
    pub a_peer_may_accept: bool,
}

impl Refusal {
    fn local(reason: String) -> Self {
        Self {
            reason,
            a_peer_may_accept: false,
        }
    }
}

/// Resolves the raw form of a call: `count` as the method names it (all-reduce: elements;
/// reduce-scatter: output elements; all-gather: input elements); in place when
/// `input == output` (reduce-scatter: the input is `output`'s `world x count` elements and
/// the result goes to this rank's shard of it; all-gather: this rank's shard of `output` is the
/// input). Out of place, the buffers must not overlap, except in the one place-preserving way:
/// a reduce-scatter output that is exactly this rank's shard of the input, an all-gather input
/// that is exactly this rank's shard of the output.
pub(crate) fn resolve(
    collective: Collective,
    rank: usize,
    world: usize,
    input: u64,
    output: u64,
    count: u64,
    elem_bytes: u64,
) -> Result<Resolved, Refusal> {
    let w = world as u64;
    let bytes = count
        .checked_mul(elem_bytes)
        .filter(|b| b.checked_mul(w).is_some())
        .ok_or_else(|| {
            Refusal::local(format!(
                "{count} elements of {elem_bytes} bytes x {world} overflow"
            ))
        })?;
    let whole = bytes * w;
    if count > 0 && (input == 0 || output == 0) {
        return Err(Refusal::local("a buffer is a null pointer".into()));
    }
    for (name, p) in [("input", input), ("output", output)] {
        if p % elem_bytes != 0 {
            return Err(Refusal::local(format!(
                "{name} {p:#x} is not aligned to its {elem_bytes}-byte elements"
            )));
        }
    }
    let own = rank as u64 * bytes;
    let (in_bytes, out_bytes) = match collective {
        Collective::AllReduce => (bytes, bytes),
        Collective::ReduceScatter => (whole, bytes),
        Collective::AllGather => (bytes, whole),
    };
    let (input, output) = match collective {
        _ if input != output => (input, output),
        Collective::AllReduce => (input, output),
        Collective::ReduceScatter => (input, output + own),
        Collective::AllGather => (input + own, output),
    };
    let allowed = match collective {
        Collective::AllReduce => input == output,
        Collective::ReduceScatter => output == input + own,
        Collective::AllGather => input == output + own,
    };
    if !allowed && overlap(input, in_bytes, output, out_bytes) {
        // Another rank's shard: that rank's in-place layout (see `Refusal`).
        let shard_of = |inner: u64, outer: u64| {
            inner > outer && bytes > 0 && (inner - outer) % bytes == 0 && (inner - outer) < whole
        };
        let a_peer_may_accept = match collective {
            Collective::AllReduce => false,
            Collective::ReduceScatter => shard_of(output, input),
            Collective::AllGather => shard_of(input, output),
        };
        return Err(Refusal {
            reason: format!(
                "input [{input:#x}, +{in_bytes}) and output [{output:#x}, +{out_bytes}) \
                 overlap; only the in-place layouts may: the same buffer (the `_in_place` \
                 method or input == output), or this rank's own shard"
            ),
            a_peer_may_accept,
        });
    }
    Ok(Resolved {
        input,
        output,
        count,
    })
}

/// The count of a call on typed buffers of `in_len` and `out_len` elements, or why the lengths
/// do not fit the collective.
pub(crate) fn count_of(
    collective: Collective,
    world: usize,
    in_len: usize,
    out_len: usize,
) -> Result<u64, String> {
    let w = world.max(1);
    let ok = match collective {
        Collective::AllReduce => in_len == out_len,
        Collective::ReduceScatter => Some(in_len) == out_len.checked_mul(w),
        Collective::AllGather => Some(out_len) == in_len.checked_mul(w),
    };
    if !ok {
        let want = match collective {
            Collective::AllReduce => "equal lengths",
            Collective::ReduceScatter => "input = world size x output",
            Collective::AllGather => "output = world size x input",
        };
        return Err(format!(
            "input holds {in_len} and output {out_len} elements; {want} is needed (world size \
             {world})"
        ));
    }
    Ok(match collective {
        Collective::AllReduce | Collective::AllGather => in_len as u64,
        Collective::ReduceScatter => out_len as u64,
    })
}

/// The count of an in-place call on one buffer of `len` elements.
pub(crate) fn in_place_count(
    collective: Collective,
    world: usize,
    len: usize,
) -> Result<u64, String> {
    let w = world.max(1);
    match collective {
        Collective::AllReduce => Ok(len as u64),
        _ if len % w != 0 => Err(format!(
            "the buffer holds {len} elements, not a multiple of the world size {world}"
        )),
        _ => Ok((len / w) as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Collective::*;

    const A: u64 = 0x1000_0000;
    const B: u64 = 0x2000_0000;

    #[test]
    fn out_of_place_buffers_pass_through() {
        let r = resolve(AllReduce, 1, 2, A, B, 100, 4).unwrap();
        assert_eq!((r.input, r.output, r.count), (A, B, 100));
        let r = resolve(AllGather, 1, 3, A, B, 7, 2).unwrap();
        assert_eq!((r.input, r.output), (A, B));
    }

    #[test]
    fn in_place_means_the_own_shard() {
        // Reduce-scatter in place: the result goes to this rank's shard.
        let r = resolve(ReduceScatter, 2, 3, A, A, 10, 4).unwrap();
        assert_eq!((r.input, r.output), (A, A + 80));
        // All-gather in place: the input is this rank's shard.
        let r = resolve(AllGather, 1, 4, B, B, 8, 8).unwrap();
        assert_eq!((r.input, r.output), (B + 64, B));
        // The same layouts given explicitly are accepted too.
        assert!(resolve(ReduceScatter, 2, 3, A, A + 80, 10, 4).is_ok());
        assert!(resolve(AllGather, 1, 4, B + 64, B, 8, 8).is_ok());
        assert!(resolve(AllReduce, 0, 2, A, A, 10, 4).is_ok());
    }

    #[test]
    fn partial_overlap_is_refused() {
        let e = resolve(AllReduce, 0, 2, A, A + 4, 10, 4).unwrap_err();
        assert!(e.reason.contains("overlap"), "{e:?}");
        assert!(!e.a_peer_may_accept);
        assert!(resolve(ReduceScatter, 1, 3, A, A + 4, 10, 4).is_err());
        assert!(resolve(AllGather, 0, 2, B + 8, B, 10, 4).is_err());
        // Adjacent is fine.
        assert!(resolve(AllReduce, 0, 2, A, A + 40, 10, 4).is_ok());
    }

    /// Every layout in which one buffer starts at a shard boundary of the other, on every rank
    /// of worlds of 2 to 5: accepted only as the rank's own in-place layout; refused
    /// otherwise, and flagged as one a peer may accept exactly when it is another rank's
    /// shard (that rank's in-place layout), so the refusing rank takes part in the call.
    #[test]
    fn every_shard_overlap_is_the_owners_or_refused_and_flagged() {
        let n = 10u64;
        for world in 2..=5usize {
            let bytes = n * 4;
            for rank in 0..world {
                for k in 0..world as u64 {
                    // Reduce-scatter: output at shard k of the input.
                    let rs = resolve(ReduceScatter, rank, world, A, A + k * bytes, n, 4);
                    // All-gather: input at shard k of the output.
                    let ag = resolve(AllGather, rank, world, B + k * bytes, B, n, 4);
                    for (what, r) in [("rs", rs), ("ag", ag)] {
                        if k == 0 || k == rank as u64 {
                            // k == 0 is input == output: the in-place form on every rank.
                            assert!(r.is_ok(), "{what} world {world} rank {rank} k {k}: {r:?}");
                        } else {
                            let e = r.expect_err("another rank's shard");
                            assert!(e.a_peer_may_accept, "{what} {world} {rank} {k}: {e:?}");
                        }
                    }
                }
                // Overlaps off a shard boundary are refused everywhere alike, unflagged.
                let e = resolve(ReduceScatter, rank, world, A, A + 4, n, 4).unwrap_err();
                assert!(!e.a_peer_may_accept, "{e:?}");
                let e = resolve(AllGather, rank, world, B + bytes + 4, B, n, 4).unwrap_err();
                assert!(!e.a_peer_may_accept, "{e:?}");
                // The output past the input's end is no overlap.
                assert!(resolve(
                    ReduceScatter,
                    rank,
                    world,
                    A,
                    A + world as u64 * bytes,
                    n,
                    4
                )
                .is_ok());
            }
        }
    }

    #[test]
    fn null_and_misaligned_buffers_are_refused() {
        assert!(resolve(AllReduce, 0, 2, 0, B, 10, 4)
            .unwrap_err()
            .reason
            .contains("null"));
        assert!(resolve(AllReduce, 0, 2, A + 2, B, 10, 4)
            .unwrap_err()
            .reason
            .contains("aligned"));
        assert!(resolve(AllReduce, 0, 2, A, B, u64::MAX / 2, 4).is_err());
        // Zero elements: nothing is read, a null pointer is fine.
        assert!(resolve(AllReduce, 0, 2, 0, 0, 0, 4).is_ok());
    }

    #[test]
    fn lengths_must_fit_the_collective() {
        assert_eq!(count_of(AllReduce, 3, 10, 10).unwrap(), 10);
        assert!(count_of(AllReduce, 3, 10, 11).is_err());
        assert_eq!(count_of(ReduceScatter, 3, 30, 10).unwrap(), 10);
        let e = count_of(ReduceScatter, 3, 31, 10).unwrap_err();
        assert!(e.contains("world size x output"), "{e}");
        assert_eq!(count_of(AllGather, 4, 5, 20).unwrap(), 5);
        assert!(count_of(AllGather, 4, 5, 21).is_err());
        assert_eq!(in_place_count(ReduceScatter, 3, 30).unwrap(), 10);
        assert!(in_place_count(AllGather, 3, 31).is_err());
        assert_eq!(in_place_count(AllReduce, 3, 31).unwrap(), 31);
    }
}
