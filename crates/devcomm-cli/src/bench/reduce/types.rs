//! What the reduction benchmark measures, as pure functions: the collectives, the command
//! line's element types, operators and references, their NCCL names, the sizes, and
//! nccl-tests' bandwidths.

use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t};
use devcomm::{DataType, ReduceOp};

/// The collective of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coll {
    AllReduce,
    ReduceScatter,
    AllGather,
}

impl Coll {
    /// The collective an `--op` names, if it names one.
    pub(crate) fn parse(op: &str) -> Option<Self> {
        match op {
            "all_reduce" => Some(Self::AllReduce),
            "reduce_scatter" => Some(Self::ReduceScatter),
            "all_gather" => Some(Self::AllGather),
            _ => None,
        }
    }

    /// The `--op` and record name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllGather => "all_gather",
        }
    }

    /// devcomm's name of the collective.
    pub(crate) fn devcomm(self) -> devcomm::reduce::Collective {
        match self {
            Self::AllReduce => devcomm::reduce::Collective::AllReduce,
            Self::ReduceScatter => devcomm::reduce::Collective::ReduceScatter,
            Self::AllGather => devcomm::reduce::Collective::AllGather,
        }
    }

    /// Whether the collective reduces (all-gather only moves).
    pub(crate) fn reduces(self) -> bool {
        self != Self::AllGather
    }

    /// nccl-tests' bus-bandwidth factor on `world` ranks: busbw = algbw x factor, the fraction
    /// of the data each rank's links must carry at best (all-reduce moves it twice).
    pub(crate) fn bus_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Self::AllReduce => 2.0 * (n - 1.0) / n,
            Self::ReduceScatter | Self::AllGather => (n - 1.0) / n,
        }
    }

    /// Elements of (input, output) per rank for a call whose count argument is `count`: the
    /// buffer for all-reduce, the output shard for reduce-scatter, the input shard for
    /// all-gather (as NCCL's count arguments).
    pub(crate) fn in_out(self, count: usize, world: usize) -> (usize, usize) {
        match self {
            Self::AllReduce => (count, count),
            Self::ReduceScatter => (count * world, count),
            Self::AllGather => (count, count * world),
        }
    }
}

/// What devcomm is timed against (`--reference`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reference {
    /// NCCL on the same buffers, and NCCL on symmetric window buffers.
    All,
    /// NCCL on the same buffers.
    Nccl,
    /// NCCL on buffers from `ncclMemAlloc` registered with `ncclCommWindowRegister`.
    NcclWindow,
    /// devcomm alone.
    None,
}

impl Reference {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(Self::All),
            "nccl" => Ok(Self::Nccl),
            "nccl-window" => Ok(Self::NcclWindow),
            "none" => Ok(Self::None),
            other => Err(format!(
                "unknown --reference {other:?} (all, nccl, nccl-window, none)"
            )),
        }
    }

    /// Whether NCCL is timed on the benchmark's own buffers.
    pub(crate) fn plain(self) -> bool {
        matches!(self, Self::All | Self::Nccl)
    }

    /// Whether NCCL is timed on registered window buffers.
    pub(crate) fn window(self) -> bool {
        matches!(self, Self::All | Self::NcclWindow)
    }
}

/// The element type `--dtype` names (devcomm's names, and NCCL's and PyTorch's usual ones).
pub(crate) fn parse_dtype(s: &str) -> Result<DataType, String> {
    let name = match s {
        "bfloat16" => "bf16",
        "half" | "float16" | "fp16" => "f16",
        "float" | "float32" | "fp32" => "f32",
        "double" | "float64" | "fp64" => "f64",
        "int32" | "int" => "i32",
        "int64" => "i64",
        "uint8" => "u8",
        other => other,
    };
    DataType::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = DataType::ALL.iter().map(|t| t.name()).collect();
        format!("unknown --dtype {s:?} ({})", names.join(", "))
    })
}

/// The operator `--redop` names.
pub(crate) fn parse_redop(s: &str) -> Result<ReduceOp, String> {
    let name = if s == "mean" { "avg" } else { s };
    ReduceOp::from_name(name).ok_or_else(|| format!("unknown --redop {s:?} (sum, avg, max, min)"))
}

/// NCCL's element type for `t` (every type devcomm reduces has one).
pub(crate) fn nccl_dtype(t: DataType) -> Result<ncclDataType_t, String> {
    Ok(match t {
        DataType::F32 => ncclDataType_t::ncclFloat32,
        DataType::F16 => ncclDataType_t::ncclFloat16,
        DataType::BF16 => ncclDataType_t::ncclBfloat16,
        DataType::F64 => ncclDataType_t::ncclFloat64,
        DataType::I32 => ncclDataType_t::ncclInt32,
        DataType::I64 => ncclDataType_t::ncclInt64,
        DataType::U8 => ncclDataType_t::ncclUint8,
        // DataType is non-exhaustive: a type added later needs its NCCL name here.
        other => return Err(format!("no NCCL element type for {other:?}")),
    })
}

/// NCCL's operator for `op`.
pub(crate) fn nccl_op(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
    }
}

/// One size of a run: `bytes` as nccl-tests counts it (the all-reduce buffer, the
/// reduce-scatter input, the all-gather output), and the call's count argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Size {
    pub(crate) bytes: usize,
    pub(crate) count: usize,
}

/// Smallest and largest nominal size: 8 B to 1 GiB.
pub(crate) const MIN_BYTES: usize = 8;
pub(crate) const MAX_BYTES: usize = 1 << 30;

/// The sizes of a run: every power of two from 8 B to 1 GiB within `[min, max]`, in elements
/// of `elem` bytes, rounded down to a multiple of `world` elements for reduce-scatter and
/// all-gather (as nccl-tests does), so `bytes` may fall below the power of two; sizes that
/// round to nothing are left out.
pub(crate) fn sizes(coll: Coll, elem: usize, world: usize, min: usize, max: usize) -> Vec<Size> {
    let mut out = Vec::new();
    let mut nominal = MIN_BYTES;
    while nominal <= max.min(MAX_BYTES) {
        if nominal >= min {
            let elems = nominal / elem;
            let count = match coll {
                Coll::AllReduce => elems,
                Coll::ReduceScatter | Coll::AllGather => elems / world,
            };
            let (input, output) = coll.in_out(count, world);
            if count > 0 {
                out.push(Size {
                    bytes: input.max(output) * elem,
                    count,
                });
            }
        }
        nominal *= 2;
    }
    out
}

/// nccl-tests' algorithm bandwidth, GB/s: `bytes` (its size) over the time.
pub(crate) fn algbw_gbps(bytes: usize, us: f64) -> f64 {
    bytes as f64 / us / 1e3
}

/// nccl-tests' bus bandwidth, GB/s.
pub(crate) fn busbw_gbps(coll: Coll, world: usize, bytes: usize, us: f64) -> f64 {
    algbw_gbps(bytes, us) * coll.bus_factor(world)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_are_nccl_tests() {
        assert_eq!(Coll::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Coll::AllReduce.bus_factor(8), 1.75);
        assert_eq!(Coll::ReduceScatter.bus_factor(4), 0.75);
        assert_eq!(Coll::AllGather.bus_factor(8), 0.875);
        // 1 GiB all-reduced in 5 ms on 8 ranks: algbw 214.7 GB/s, busbw 375.8 GB/s.
        let (bytes, us) = (1usize << 30, 5000.0);
        assert!((algbw_gbps(bytes, us) - 214.748_364_8).abs() < 1e-6);
        let bus = busbw_gbps(Coll::AllReduce, 8, bytes, us);
        assert!((bus - 214.748_364_8 * 1.75).abs() < 1e-6);
        assert!((busbw_gbps(Coll::AllGather, 4, 4000, 1.0) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn sizes_run_from_8_bytes_to_1_gib() {
        let all = sizes(Coll::AllReduce, 2, 8, 0, usize::MAX);
        assert_eq!(all.len(), 28);
        assert_eq!(all[0], Size { bytes: 8, count: 4 });
        assert_eq!(
            all[27],
            Size {
                bytes: 1 << 30,
                count: 1 << 29
            }
        );
        let some = sizes(Coll::AllReduce, 4, 2, 1000, 1 << 20);
        assert_eq!(some.first().map(|s| s.bytes), Some(1024));
        assert_eq!(some.last().map(|s| s.bytes), Some(1 << 20));
        assert!(sizes(Coll::AllReduce, 8, 2, 0, 4).is_empty());
    }

    #[test]
    fn sharded_sizes_round_down_to_whole_shards() {
        // bf16 on 8 ranks: 8 B is 4 elements, less than one per rank: left out; 16 B is one
        // element per rank.
        let rs = sizes(Coll::ReduceScatter, 2, 8, 0, 64);
        assert_eq!(
            rs,
            vec![
                Size {
                    bytes: 16,
                    count: 1
                },
                Size {
                    bytes: 32,
                    count: 2
                },
                Size {
                    bytes: 64,
                    count: 4
                }
            ]
        );
        // 3 ranks: 64 B of f32 is 16 elements, 5 per rank, 60 B in all.
        let ag = sizes(Coll::AllGather, 4, 3, 64, 64);
        assert_eq!(
            ag,
            vec![Size {
                bytes: 60,
                count: 5
            }]
        );
        assert_eq!(Coll::AllGather.in_out(5, 3), (5, 15));
        assert_eq!(Coll::ReduceScatter.in_out(5, 3), (15, 5));
        assert_eq!(Coll::AllReduce.in_out(5, 3), (5, 5));
    }

    #[test]
    fn dtypes_and_ops_parse_and_map_to_nccl() {
        assert_eq!(parse_dtype("bf16"), Ok(DataType::BF16));
        assert_eq!(parse_dtype("bfloat16"), Ok(DataType::BF16));
        assert_eq!(parse_dtype("fp16"), Ok(DataType::F16));
        assert_eq!(parse_dtype("float"), Ok(DataType::F32));
        assert_eq!(parse_dtype("u8"), Ok(DataType::U8));
        let e = parse_dtype("f8").unwrap_err();
        assert!(e.contains("bf16") && e.contains("u8"), "{e}");
        for t in DataType::ALL {
            assert_eq!(parse_dtype(t.name()), Ok(t));
            assert!(nccl_dtype(t).is_ok(), "{t}");
        }
        assert_eq!(nccl_dtype(DataType::BF16), Ok(ncclDataType_t::ncclBfloat16));
        assert_eq!(nccl_dtype(DataType::F16), Ok(ncclDataType_t::ncclFloat16));
        assert_eq!(nccl_dtype(DataType::I64), Ok(ncclDataType_t::ncclInt64));
        assert_eq!(nccl_dtype(DataType::U8), Ok(ncclDataType_t::ncclUint8));
        assert_eq!(parse_redop("mean"), Ok(ReduceOp::Avg));
        assert!(parse_redop("prod").is_err());
        let pairs = [
            ("sum", ncclRedOp_t::ncclSum),
            ("avg", ncclRedOp_t::ncclAvg),
            ("max", ncclRedOp_t::ncclMax),
            ("min", ncclRedOp_t::ncclMin),
        ];
        for (name, nccl) in pairs {
            assert_eq!(parse_redop(name).map(nccl_op), Ok(nccl), "{name}");
        }
    }

    #[test]
    fn ops_and_references_parse() {
        for c in [Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather] {
            assert_eq!(Coll::parse(c.name()), Some(c));
        }
        assert_eq!(Coll::parse("all_to_all"), None);
        assert!(!Coll::AllGather.reduces() && Coll::ReduceScatter.reduces());
        assert_eq!(Reference::parse("none"), Ok(Reference::None));
        let all = Reference::parse("all").unwrap();
        assert!(all.plain() && all.window());
        let window = Reference::parse("nccl-window").unwrap();
        assert!(!window.plain() && window.window());
        assert!(!Reference::None.plain() && !Reference::None.window());
        assert!(Reference::parse("nccl_window").is_err());
    }
}
