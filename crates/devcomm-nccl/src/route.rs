//! Which calls devcomm answers and which go to the real NCCL: a pure function of the call
//! (operation, type, reduction) and the job (a devcomm communicator, NVLink-only links, the
//! operations `DEVCOMM_NCCL_FORCE` sends to NCCL). Every input is alike on every rank of a
//! collective call, so every rank routes it alike.

use devcomm::{DataType, ReduceOp};

use crate::ffi::{self, NcclDataType, NcclRedOp};

/// The variable naming operations that always go to NCCL (`all`, or a comma list of
/// [`Op::name`]s), for comparisons.
pub const FORCE_ENV: &str = "DEVCOMM_NCCL_FORCE";

/// An operation of the NCCL API that devcomm may answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclAlltoAll`.
    AllToAll,
    /// `ncclSend`/`ncclRecv` (every one of a group, in `p2p_schedule`'s order).
    SendRecv,
    /// `ncclBroadcast`/`ncclBcast`: always NCCL.
    Broadcast,
    /// `ncclReduce`: always NCCL.
    Reduce,
    /// `ncclGather`/`ncclScatter`: always NCCL.
    GatherScatter,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 8] = [
        Op::AllReduce,
        Op::ReduceScatter,
        Op::AllGather,
        Op::AllToAll,
        Op::SendRecv,
        Op::Broadcast,
        Op::Reduce,
        Op::GatherScatter,
    ];

    /// The name `DEVCOMM_NCCL_FORCE` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::AllToAll => "all_to_all",
            Op::SendRecv => "send_recv",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::GatherScatter => "gather_scatter",
        }
    }
}

/// The operations forced to NCCL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forced(u16);

impl Forced {
    /// Parses `DEVCOMM_NCCL_FORCE`'s value; an unknown name is an error naming it.
    pub fn parse(value: &str) -> Result<Self, String> {
        let mut set = 0u16;
        for name in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if name == "all" {
                set = u16::MAX;
                continue;
            }
            let i = Op::ALL.iter().position(|o| o.name() == name).ok_or_else(|| {
                let names: Vec<_> = Op::ALL.iter().map(|o| o.name()).collect();
                format!(
                    "{FORCE_ENV}: unknown operation `{name}` (expected `all` or a comma list of {})",
                    names.join(", ")
                )
            })?;
            set |= 1 << i;
        }
        Ok(Self(set))
    }

    /// Whether `op` is forced to NCCL.
    pub fn has(self, op: Op) -> bool {
        let i = Op::ALL.iter().position(|o| *o == op).unwrap_or(0);
        self.0 & (1 << i) != 0
    }
}

/// What the job offers devcomm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// A devcomm communicator exists for this NCCL communicator.
    pub devcomm: bool,
    /// Every peer is reached over NVLink (devcomm's collectives on network peers are left to
    /// NCCL).
    pub nvlink_only: bool,
    /// Operations forced to NCCL.
    pub forced: Forced,
}

/// How devcomm carries out a call it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// A reduction (all-reduce, reduce-scatter) of `dtype` with `op`.
    Reduce {
        /// devcomm's type of the elements' bits.
        dtype: DataType,
        /// The operation.
        op: ReduceOp,
    },
    /// An all-gather moving elements as `dtype` (same size).
    Gather {
        /// devcomm's type of the same size.
        dtype: DataType,
    },
    /// An all-to-all or send/recv of elements of `elem_size` bytes (a copy).
    Copy {
        /// Bytes per element.
        elem_size: usize,
    },
}

/// Where a call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// devcomm answers it.
    Devcomm(Plan),
    /// The real NCCL answers it, for the reason given.
    Nccl(&'static str),
}

/// devcomm's reduction of NCCL type `t` with operator `op`, or why there is none. Signed and
/// unsigned integers of one width share their wrapping sum's bits, so `int8`, `uint32` and
/// `uint64` sums run as `u8`, `i32` and `i64`; their max, min and avg differ and go to NCCL.
pub fn reduction(t: NcclDataType, op: NcclRedOp) -> Result<(DataType, ReduceOp), &'static str> {
    let op = match op {
        ffi::SUM => ReduceOp::Sum,
        ffi::MAX => ReduceOp::Max,
        ffi::MIN => ReduceOp::Min,
        ffi::AVG => ReduceOp::Avg,
        ffi::PROD => return Err("devcomm has no product reduction"),
        _ => return Err("a custom reduction operator (ncclRedOpCreatePreMulSum)"),
    };
    let native = match t {
        ffi::FLOAT32 => Some(DataType::F32),
        ffi::FLOAT16 => Some(DataType::F16),
        ffi::BFLOAT16 => Some(DataType::BF16),
        ffi::FLOAT64 => Some(DataType::F64),
        ffi::INT32 => Some(DataType::I32),
        ffi::INT64 => Some(DataType::I64),
        ffi::UINT8 => Some(DataType::U8),
        _ => None,
    };
    if let Some(d) = native {
        return Ok((d, op));
    }
    let same_bits = match t {
        ffi::INT8 => Some(DataType::U8),
        ffi::UINT32 => Some(DataType::I32),
        ffi::UINT64 => Some(DataType::I64),
        _ => None,
    };
    match (same_bits, op) {
        (Some(d), ReduceOp::Sum) => Ok((d, op)),
        (Some(_), _) => {
            Err("devcomm reduces this integer type's sum only (max, min, avg need its signedness)")
        }
        (None, _) if t == ffi::FLOAT8E4M3 || t == ffi::FLOAT8E5M2 => {
            Err("devcomm has no fp8 reduction")
        }
        (None, _) => Err("not an NCCL data type"),
    }
}

/// Where call `op` on elements of type `t` (reduction `redop` for reductions) goes.
pub fn route(op: Op, t: NcclDataType, redop: Option<NcclRedOp>, job: Job) -> Route {
    if !job.devcomm {
        return Route::Nccl("this communicator has no devcomm communicator");
    }
    if job.forced.has(op) {
        return Route::Nccl("forced to NCCL by DEVCOMM_NCCL_FORCE");
    }
    if !job.nvlink_only {
        return Route::Nccl("the job has peers beyond NVLink");
    }
    let Some(size) = ffi::type_size(t) else {
        return Route::Nccl("not an NCCL data type");
    };
    match op {
        Op::AllReduce | Op::ReduceScatter => match reduction(t, redop.unwrap_or(ffi::SUM)) {
            Ok((dtype, op)) => Route::Devcomm(Plan::Reduce { dtype, op }),
            Err(why) => Route::Nccl(why),
        },
        Op::AllGather => match DataType::for_gather(size, size) {
            Some((dtype, 1)) => Route::Devcomm(Plan::Gather { dtype }),
            _ => Route::Nccl("no devcomm type of this size"),
        },
        Op::AllToAll | Op::SendRecv => Route::Devcomm(Plan::Copy { elem_size: size }),
        Op::Broadcast => Route::Nccl("devcomm has no broadcast"),
        Op::Reduce => Route::Nccl("devcomm has no rooted reduce"),
        Op::GatherScatter => Route::Nccl("devcomm has no rooted gather or scatter"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::*;

    const JOB: Job = Job {
        devcomm: true,
        nvlink_only: true,
        forced: Forced(0),
    };

    fn reduce(d: DataType, op: ReduceOp) -> Route {
        Route::Devcomm(Plan::Reduce { dtype: d, op })
    }

    #[test]
    fn reductions_route_by_type_and_operator() {
        use DataType as D;
        use ReduceOp as R;
        let table: &[(NcclDataType, NcclRedOp, Option<Route>)] = &[
            (FLOAT32, SUM, Some(reduce(D::F32, R::Sum))),
            (FLOAT32, AVG, Some(reduce(D::F32, R::Avg))),
            (FLOAT16, MAX, Some(reduce(D::F16, R::Max))),
            (BFLOAT16, MIN, Some(reduce(D::BF16, R::Min))),
            (FLOAT64, SUM, Some(reduce(D::F64, R::Sum))),
            (INT32, MAX, Some(reduce(D::I32, R::Max))),
            (INT64, AVG, Some(reduce(D::I64, R::Avg))),
            (UINT8, MIN, Some(reduce(D::U8, R::Min))),
            (INT8, SUM, Some(reduce(D::U8, R::Sum))),
            (UINT32, SUM, Some(reduce(D::I32, R::Sum))),
            (UINT64, SUM, Some(reduce(D::I64, R::Sum))),
            (INT8, MAX, None),
            (UINT32, AVG, None),
            (UINT64, MIN, None),
            (FLOAT32, PROD, None),
            (INT32, PROD, None),
            (FLOAT32, NUM_OPS, None),
            (FLOAT8E4M3, SUM, None),
            (FLOAT8E5M2, MAX, None),
            (NUM_TYPES, SUM, None),
        ];
        for &(t, redop, want) in table {
            for op in [Op::AllReduce, Op::ReduceScatter] {
                let got = route(op, t, Some(redop), JOB);
                match want {
                    Some(w) => assert_eq!(got, w, "{op:?} type {t} op {redop}"),
                    None => assert!(
                        matches!(got, Route::Nccl(_)),
                        "{op:?} type {t} op {redop}: {got:?}"
                    ),
                }
            }
        }
    }

    #[test]
    fn copies_take_every_type_and_rooted_calls_go_to_nccl() {
        for t in 0..NUM_TYPES {
            let size = type_size(t).unwrap();
            match route(Op::AllGather, t, None, JOB) {
                Route::Devcomm(Plan::Gather { dtype }) => assert_eq!(dtype.size_bytes(), size),
                other => panic!("all_gather of type {t}: {other:?}"),
            }
            for op in [Op::AllToAll, Op::SendRecv] {
                assert_eq!(
                    route(op, t, None, JOB),
                    Route::Devcomm(Plan::Copy { elem_size: size })
                );
            }
            for op in [Op::Broadcast, Op::Reduce, Op::GatherScatter] {
                assert!(matches!(route(op, t, Some(SUM), JOB), Route::Nccl(_)));
            }
        }
        assert!(matches!(
            route(Op::AllGather, 12, None, JOB),
            Route::Nccl(_)
        ));
    }

    #[test]
    fn the_job_and_the_force_variable_send_calls_to_nccl() {
        let no_devcomm = Job {
            devcomm: false,
            ..JOB
        };
        let net = Job {
            nvlink_only: false,
            ..JOB
        };
        for job in [no_devcomm, net] {
            for op in Op::ALL {
                assert!(matches!(route(op, FLOAT32, Some(SUM), job), Route::Nccl(_)));
            }
        }
        let forced = Job {
            forced: Forced::parse("all_reduce, all_gather").unwrap(),
            ..JOB
        };
        assert!(matches!(
            route(Op::AllReduce, FLOAT32, Some(SUM), forced),
            Route::Nccl(_)
        ));
        assert!(matches!(
            route(Op::AllGather, FLOAT32, None, forced),
            Route::Nccl(_)
        ));
        assert!(matches!(
            route(Op::ReduceScatter, FLOAT32, Some(SUM), forced),
            Route::Devcomm(_)
        ));
        let all = Job {
            forced: Forced::parse("all").unwrap(),
            ..JOB
        };
        for op in Op::ALL {
            assert!(matches!(route(op, FLOAT32, Some(SUM), all), Route::Nccl(_)));
        }
        assert_eq!(Forced::parse("").unwrap(), Forced::default());
        let e = Forced::parse("all_reduce,allreduce").unwrap_err();
        assert!(e.contains("`allreduce`") && e.contains("send_recv"), "{e}");
    }
}
