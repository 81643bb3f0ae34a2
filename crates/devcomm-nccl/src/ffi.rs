//! `nccl.h` (NCCL 2.28) types and values as this library exports them. `tests/abi.rs` compiles
//! the real header with the host C compiler and compares every size and value here with it.

use std::ffi::{c_char, c_int, c_uint};

/// The NCCL version this library is compatible with (`NCCL_VERSION_CODE` of 2.28.9).
pub const NCCL_VERSION_CODE: c_int = 22809;

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`.
pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`.
pub const SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`.
pub const REMOTE_ERROR: NcclResult = 6;
/// `ncclInProgress`.
pub const IN_PROGRESS: NcclResult = 7;
/// `ncclNumResults`.
pub const NUM_RESULTS: NcclResult = 8;

/// `ncclDataType_t`.
pub type NcclDataType = c_int;
/// `ncclInt8` / `ncclChar`.
pub const INT8: NcclDataType = 0;
/// `ncclUint8`.
pub const UINT8: NcclDataType = 1;
/// `ncclInt32` / `ncclInt`.
pub const INT32: NcclDataType = 2;
/// `ncclUint32`.
pub const UINT32: NcclDataType = 3;
/// `ncclInt64`.
pub const INT64: NcclDataType = 4;
/// `ncclUint64`.
pub const UINT64: NcclDataType = 5;
/// `ncclFloat16` / `ncclHalf`.
pub const FLOAT16: NcclDataType = 6;
/// `ncclFloat32` / `ncclFloat`.
pub const FLOAT32: NcclDataType = 7;
/// `ncclFloat64` / `ncclDouble`.
pub const FLOAT64: NcclDataType = 8;
/// `ncclBfloat16`.
pub const BFLOAT16: NcclDataType = 9;
/// `ncclFloat8e4m3`.
pub const FLOAT8E4M3: NcclDataType = 10;
/// `ncclFloat8e5m2`.
pub const FLOAT8E5M2: NcclDataType = 11;
/// `ncclNumTypes`.
pub const NUM_TYPES: NcclDataType = 12;

/// Bytes per element of `t`, or `None` for a value that is no NCCL type.
pub fn type_size(t: NcclDataType) -> Option<usize> {
    match t {
        INT8 | UINT8 | FLOAT8E4M3 | FLOAT8E5M2 => Some(1),
        FLOAT16 | BFLOAT16 => Some(2),
        INT32 | UINT32 | FLOAT32 => Some(4),
        INT64 | UINT64 | FLOAT64 => Some(8),
        _ => None,
    }
}

/// `ncclRedOp_t`.
pub type NcclRedOp = c_int;
/// `ncclSum`.
pub const SUM: NcclRedOp = 0;
/// `ncclProd`.
pub const PROD: NcclRedOp = 1;
/// `ncclMax`.
pub const MAX: NcclRedOp = 2;
/// `ncclMin`.
pub const MIN: NcclRedOp = 3;
/// `ncclAvg`.
pub const AVG: NcclRedOp = 4;
/// `ncclNumOps`: the first value of the operators `ncclRedOpCreatePreMulSum` makes.
pub const NUM_OPS: NcclRedOp = 5;

/// `ncclScalarResidence_t`.
pub type NcclScalarResidence = c_int;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    /// The id's bytes (`unique_id` gives their layout).
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for NcclUniqueId {
    // The bytes hold the store's secret token: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclUniqueId(..)")
    }
}

/// `NCCL_CONFIG_UNDEF_INT`.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// The `magic` of `NCCL_CONFIG_INITIALIZER`.
pub const CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;

/// `ncclConfig_t` (`struct ncclConfig_v22800`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclConfig {
    /// `sizeof(ncclConfig_t)` as the caller's header has it.
    pub size: usize,
    /// `0xcafebeef`.
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// Whether calls block (`0`: non-blocking communicator).
    pub blocking: c_int,
    /// CGA cluster size.
    pub cga_cluster_size: c_int,
    /// Fewest CTAs.
    pub min_ctas: c_int,
    /// Most CTAs.
    pub max_ctas: c_int,
    /// Network plugin name.
    pub net_name: *const c_char,
    /// Whether a split shares resources with its parent.
    pub split_share: c_int,
    /// Traffic class.
    pub traffic_class: c_int,
    /// Communicator name.
    pub comm_name: *const c_char,
    /// CollNet on or off.
    pub collnet_enable: c_int,
    /// CTA policy.
    pub cta_policy: c_int,
    /// Whether a shrink shares resources.
    pub shrink_share: c_int,
    /// NVLS CTAs.
    pub nvls_ctas: c_int,
    /// Channels per network peer.
    pub n_channels_per_net_peer: c_int,
    /// NVLink-centric scheduling.
    pub nvlink_centric_sched: c_int,
}

/// `cudaStream_t`.
pub type CudaStreamT = *mut std::ffi::c_void;
/// `ncclComm_t`: a pointer to this library's communicator (`comm::ShimComm`).
pub type NcclCommT = *mut std::ffi::c_void;
/// `ncclWindow_t`.
pub type NcclWindowT = *mut std::ffi::c_void;

/// `ncclGetErrorString`'s text for `r`, as NCCL words it.
pub fn error_string(r: NcclResult) -> &'static std::ffi::CStr {
    match r {
        SUCCESS => c"no error",
        UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        REMOTE_ERROR => c"remote process exited or there was a network error",
        IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}
