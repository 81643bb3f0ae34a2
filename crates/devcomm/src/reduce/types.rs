//! Element types and reduction operations of the reductions (all-reduce, reduce-scatter,
//! all-gather), and the [`Reducible`] trait that ties a Rust element type to its [`DataType`].

use std::fmt;

/// The element type of a reduction's buffers.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32`.
    F32,
    /// IEEE half precision (`half::f16`); reduced in `f32`, rounded once at the end.
    F16,
    /// bfloat16 (`half::bf16`); reduced in `f32`, rounded once at the end.
    BF16,
    /// `f64`.
    F64,
    /// `i32` (sum wraps).
    I32,
    /// `i64` (sum wraps).
    I64,
    /// `u8` (sum wraps).
    U8,
}

impl DataType {
    /// Every type, in a fixed order (tests, self-tests, precompile).
    pub const ALL: [DataType; 7] = [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::F64,
        DataType::I32,
        DataType::I64,
        DataType::U8,
    ];

    /// The type's code in the kernels' launch arguments and the call agreement's descriptor
    /// (its index in [`DataType::ALL`]).
    pub(crate) const fn code(self) -> u32 {
        match self {
            DataType::F32 => 0,
            DataType::F16 => 1,
            DataType::BF16 => 2,
            DataType::F64 => 3,
            DataType::I32 => 4,
            DataType::I64 => 5,
            DataType::U8 => 6,
        }
    }

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 => 4,
            DataType::F16 | DataType::BF16 => 2,
            DataType::F64 | DataType::I64 => 8,
            DataType::U8 => 1,
        }
    }

    /// Short lower-case name (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::F64 => "f64",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::U8 => "u8",
        }
    }

    /// The device storage type in `cuda/devcomm/reduce.cuh`.
    pub(crate) const fn device_type(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F16 => "devcomm::red::F16",
            DataType::BF16 => "devcomm::red::BF16",
            DataType::F64 => "double",
            DataType::I32 => "int",
            DataType::I64 => "long long",
            DataType::U8 => "unsigned char",
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32 | DataType::F16 | DataType::BF16 | DataType::F64
        )
    }

    /// How an all-gather moves elements of `size` bytes aligned to `align` (a copy, so any
    /// type of the same size serves): as `(type, n)`, `n` elements of `type` per element, with
    /// the widest integer or 16-bit type that divides both; `None` for a zero-sized type.
    /// It depends only on the type, so every rank of a call chooses alike (the kernels' call
    /// agreement compares the type).
    pub fn for_gather(size: usize, align: usize) -> Option<(DataType, usize)> {
        if size == 0 {
            return None;
        }
        let fits = |width: usize| size % width == 0 && align % width == 0;
        let t = if fits(8) {
            DataType::I64
        } else if fits(4) {
            DataType::I32
        } else if fits(2) {
            DataType::F16
        } else {
            DataType::U8
        };
        Some((t, size / t.size_bytes()))
    }

    /// Parses a [`DataType::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The reduction operation. Element `i` of the result is `((x0 op x1) op x2) ... op x(n-1)`
/// over the ranks' element `i` in rank order, in the accumulation type (`f32` for `f16` and
/// `bf16`, the element type otherwise), rounded once at the end; see docs/COLLECTIVES.md,
/// "Reductions".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum; integer sums wrap (two's complement).
    Sum,
    /// The sum in rank order, then divided by the number of ranks in the accumulation type
    /// (integers: the wrapped sum divided by n, truncated toward zero).
    Avg,
    /// Maximum: a NaN (the first one in rank order) wins; otherwise the larger value, and the
    /// earlier rank's value between equal ones (`-0.0` and `0.0`).
    Max,
    /// Minimum, with the same NaN and equal-value rules as [`ReduceOp::Max`].
    Min,
}

impl ReduceOp {
    /// Every operation, in a fixed order.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

    /// Short lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

    /// The device code of the operation (`devcomm::red::Op` in `reduce.cuh`).
    pub(crate) const fn code(self) -> u32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Avg => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
        }
    }

    /// Parses a [`ReduceOp::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust element type the reductions accept: `f32`, `f64`, `half::f16`, `half::bf16`, `i32`,
/// `i64`, `u8`. Sealed: the device code exists for these only.
pub trait Reducible: cudarc::driver::DeviceRepr + Copy + 'static + sealed::Sealed {
    /// The matching [`DataType`].
    const DTYPE: DataType;
}

macro_rules! reducible {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Reducible for $t {
            const DTYPE: DataType = DataType::$d;
        }
        const _: () = assert!(std::mem::size_of::<$t>() == DataType::$d.size_bytes());
    )*};
}

reducible!(
    f32 => F32,
    f64 => F64,
    half::f16 => F16,
    half::bf16 => BF16,
    i32 => I32,
    i64 => I64,
    u8 => U8,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gather_moves_any_type_as_the_widest_copy_that_fits() {
        assert_eq!(DataType::for_gather(1, 1), Some((DataType::U8, 1)));
        assert_eq!(DataType::for_gather(2, 2), Some((DataType::F16, 1)));
        assert_eq!(DataType::for_gather(4, 4), Some((DataType::I32, 1)));
        assert_eq!(DataType::for_gather(8, 8), Some((DataType::I64, 1)));
        assert_eq!(DataType::for_gather(16, 16), Some((DataType::I64, 2)));
        // [f32; 4]: 16 bytes aligned to 4; [u8; 16]: aligned to 1; [u16; 3]: 6 bytes.
        assert_eq!(DataType::for_gather(16, 4), Some((DataType::I32, 4)));
        assert_eq!(DataType::for_gather(16, 1), Some((DataType::U8, 16)));
        assert_eq!(DataType::for_gather(6, 2), Some((DataType::F16, 3)));
        assert_eq!(DataType::for_gather(0, 1), None);
    }

    #[test]
    fn names_round_trip_and_sizes_match_rust() {
        for t in DataType::ALL {
            assert_eq!(DataType::from_name(t.name()), Some(t));
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_name(o.name()), Some(o));
        }
        assert_eq!(<half::bf16 as Reducible>::DTYPE.size_bytes(), 2);
        assert_eq!(<u8 as Reducible>::DTYPE, DataType::U8);
        assert!(DataType::from_name("f8").is_none());
    }
}
