//! The reductions' argument rules: element types, operations, and when an output and an input
//! that share memory make an in-place call.

use devcomm::{DataType, ReduceOp};
use pyo3::prelude::*;

use crate::errors::invalid;
use crate::tensor::{DType, TensorDesc};

/// The reductions' element type of a tensor.
pub fn reduce_dtype(op: &str, d: &TensorDesc) -> PyResult<DataType> {
    Ok(match d.dtype {
        DType::F32 => DataType::F32,
        DType::F16 => DataType::F16,
        DType::BF16 => DataType::BF16,
        DType::F64 => DataType::F64,
        DType::I32 => DataType::I32,
        DType::I64 => DataType::I64,
        DType::U8 => DataType::U8,
        other => {
            return Err(invalid(
                op,
                format!(
                    "dtype {} is not reduced by devcomm (float32, float16, bfloat16, float64, \
                     int32, int64, uint8)",
                    other.name()
                ),
            ))
        }
    })
}

/// All-gather moves bytes: a type the reductions lack goes as one of their types of its size.
/// The type an all-gather moves a tensor's elements as, and how many of it make one element:
/// the tensor's own type where devcomm reduces it, else a copy type of the element's size
/// (`DataType::for_gather`: complex128, int16, bool, float8 ... all gather).
pub fn gather_dtype(op: &str, d: &TensorDesc) -> PyResult<(DataType, usize)> {
    reduce_dtype(op, d).map(|t| (t, 1)).or_else(|e| {
        let size = d.dtype.size();
        DataType::for_gather(size, size).ok_or(e)
    })
}

pub fn reduce_op(op: &str, name: &str) -> PyResult<ReduceOp> {
    ReduceOp::from_name(name).ok_or_else(|| {
        invalid(
            op,
            format!("reduction {name:?}: devcomm reduces with sum, avg, max or min"),
        )
    })
}

pub fn same_dtype(op: &str, a: &TensorDesc, b: &TensorDesc) -> PyResult<()> {
    if a.dtype != b.dtype {
        return Err(invalid(
            op,
            format!("out is {} but inp {}", a.dtype.name(), b.dtype.name()),
        ));
    }
    Ok(())
}

/// The other buffer's address for the raw call when `small` may be this rank's shard of
/// `big`: `big`'s address (in place) when `small` starts at `shard`, `small`'s when the two
/// do not overlap; an error for any other overlap.
/// The shape both sharded collectives need: `big` (named `big_name`) holds `world` times
/// `small`'s elements; then where the call reads or writes `small` ([`placement`] of this
/// `rank`'s shard).
pub fn sharded(
    op: &str,
    (big, big_name): (&TensorDesc, &str),
    (small, small_name): (&TensorDesc, &str),
    rank: u64,
    world: u64,
) -> PyResult<u64> {
    if big.numel() != world * small.numel() {
        return Err(invalid(
            op,
            format!(
                "{big_name} holds {} elements; world size {world} x {small_name}'s {} are needed",
                big.numel(),
                small.numel()
            ),
        ));
    }
    placement(op, big, small, big.ptr + rank * small.bytes())
}

fn placement(op: &str, big: &TensorDesc, small: &TensorDesc, shard: u64) -> PyResult<u64> {
    if small.ptr == shard && small.bytes() > 0 {
        return Ok(big.ptr);
    }
    let overlap = small.ptr < big.ptr + big.bytes() && big.ptr < small.ptr + small.bytes();
    if overlap && small.bytes() > 0 && big.bytes() > 0 {
        return Err(invalid(
            op,
            "out and inp overlap other than as this rank's shard (in place)",
        ));
    }
    Ok(small.ptr)
}
