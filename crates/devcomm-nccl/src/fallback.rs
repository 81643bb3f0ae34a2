//! The real NCCL, loaded by path (`dlopen`), which answers every call devcomm does not.
//!
//! Found as `DEVCOMM_NCCL_FALLBACK_LIB` names it, else as `libnccl.so.2` through the dynamic
//! linker's search (the copy a program under `LD_PRELOAD` already links is returned), else in
//! each folder of `LD_LIBRARY_PATH`: the first candidate that is not this library (its
//! `ncclGetVersion` is not ours) is used. Loaded once per process.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::ffi::{
    CudaStreamT, NcclCommT, NcclConfig, NcclDataType, NcclRedOp, NcclResult, NcclUniqueId,
    NcclWindowT,
};

/// The variable naming the real NCCL library to fall back to.
pub const LIB_ENV: &str = "DEVCOMM_NCCL_FALLBACK_LIB";

type Comm = NcclCommT;
type Stream = CudaStreamT;

macro_rules! nccl_table {
    ($( $field:ident = $sym:literal : fn($($arg:ty),*) -> $ret:ty; )*) => {
        /// The real NCCL's entry points (`None`: the library lacks the symbol).
        #[allow(missing_debug_implementations)]
        pub struct Nccl {
            /// Where the library was found.
            pub path: String,
            /// Its `ncclGetVersion`.
            pub version: c_int,
            _lib: libloading::Library,
            $(
                #[doc = concat!("`", $sym, "`.")]
                pub $field: Option<unsafe extern "C" fn($($arg),*) -> $ret>,
            )*
        }

        impl Nccl {
            /// Resolves every entry point of `lib`.
            fn resolve(lib: libloading::Library, path: String, version: c_int) -> Self {
                Nccl {
                    path,
                    version,
                    $(
                        // SAFETY: the symbol's type is nccl.h's prototype of that name.
                        $field: unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                                concat!($sym, "\0").as_bytes(),
                            )
                        }
                        .ok()
                        .map(|s| *s),
                    )*
                    _lib: lib,
                }
            }
        }
    };
}

nccl_table! {
    get_unique_id = "ncclGetUniqueId": fn(*mut NcclUniqueId) -> NcclResult;
    comm_init_rank = "ncclCommInitRank": fn(*mut Comm, c_int, NcclUniqueId, c_int) -> NcclResult;
    comm_init_rank_config = "ncclCommInitRankConfig":
        fn(*mut Comm, c_int, NcclUniqueId, c_int, *mut NcclConfig) -> NcclResult;
    comm_split = "ncclCommSplit": fn(Comm, c_int, c_int, *mut Comm, *mut NcclConfig) -> NcclResult;
    comm_finalize = "ncclCommFinalize": fn(Comm) -> NcclResult;
    comm_destroy = "ncclCommDestroy": fn(Comm) -> NcclResult;
    comm_abort = "ncclCommAbort": fn(Comm) -> NcclResult;
    comm_revoke = "ncclCommRevoke": fn(Comm, c_int) -> NcclResult;
    comm_get_async_error = "ncclCommGetAsyncError": fn(Comm, *mut NcclResult) -> NcclResult;
    get_last_error = "ncclGetLastError": fn(Comm) -> *const c_char;
    all_reduce = "ncclAllReduce":
        fn(*const c_void, *mut c_void, usize, NcclDataType, NcclRedOp, Comm, Stream) -> NcclResult;
    reduce_scatter = "ncclReduceScatter":
        fn(*const c_void, *mut c_void, usize, NcclDataType, NcclRedOp, Comm, Stream) -> NcclResult;
    all_gather = "ncclAllGather":
        fn(*const c_void, *mut c_void, usize, NcclDataType, Comm, Stream) -> NcclResult;
    all_to_all = "ncclAlltoAll":
        fn(*const c_void, *mut c_void, usize, NcclDataType, Comm, Stream) -> NcclResult;
    gather = "ncclGather":
        fn(*const c_void, *mut c_void, usize, NcclDataType, c_int, Comm, Stream) -> NcclResult;
    scatter = "ncclScatter":
        fn(*const c_void, *mut c_void, usize, NcclDataType, c_int, Comm, Stream) -> NcclResult;
    broadcast = "ncclBroadcast":
        fn(*const c_void, *mut c_void, usize, NcclDataType, c_int, Comm, Stream) -> NcclResult;
    reduce = "ncclReduce": fn(
        *const c_void, *mut c_void, usize, NcclDataType, NcclRedOp, c_int, Comm, Stream
    ) -> NcclResult;
    send = "ncclSend": fn(*const c_void, usize, NcclDataType, c_int, Comm, Stream) -> NcclResult;
    recv = "ncclRecv": fn(*mut c_void, usize, NcclDataType, c_int, Comm, Stream) -> NcclResult;
    group_start = "ncclGroupStart": fn() -> NcclResult;
    group_end = "ncclGroupEnd": fn() -> NcclResult;
    group_simulate_end = "ncclGroupSimulateEnd": fn(*mut c_void) -> NcclResult;
    comm_register = "ncclCommRegister": fn(Comm, *mut c_void, usize, *mut *mut c_void) -> NcclResult;
    comm_deregister = "ncclCommDeregister": fn(Comm, *mut c_void) -> NcclResult;
    comm_window_register = "ncclCommWindowRegister":
        fn(Comm, *mut c_void, usize, *mut NcclWindowT, c_int) -> NcclResult;
    comm_window_deregister = "ncclCommWindowDeregister": fn(Comm, NcclWindowT) -> NcclResult;
    mem_alloc = "ncclMemAlloc": fn(*mut *mut c_void, usize) -> NcclResult;
    mem_free = "ncclMemFree": fn(*mut c_void) -> NcclResult;
    red_op_create_pre_mul_sum = "ncclRedOpCreatePreMulSum":
        fn(*mut NcclRedOp, *mut c_void, NcclDataType, c_int, Comm) -> NcclResult;
    red_op_destroy = "ncclRedOpDestroy": fn(NcclRedOp, Comm) -> NcclResult;
}

/// The process's real NCCL, or why there is none (every caller that needs it reports this).
pub fn get() -> Result<&'static Nccl, &'static str> {
    static LOADED: OnceLock<Result<Nccl, String>> = OnceLock::new();
    LOADED.get_or_init(load).as_ref().map_err(|e| e.as_str())
}

/// The paths tried, in order.
pub fn candidates(explicit: Option<&str>, ld_library_path: Option<&str>) -> Vec<String> {
    if let Some(p) = explicit.filter(|p| !p.trim().is_empty()) {
        return vec![p.to_string()];
    }
    let mut out = vec!["libnccl.so.2".to_string()];
    for dir in ld_library_path
        .unwrap_or("")
        .split(':')
        .filter(|d| !d.is_empty())
    {
        out.push(format!("{}/libnccl.so.2", dir.trim_end_matches('/')));
    }
    out
}

fn load() -> Result<Nccl, String> {
    let explicit = std::env::var(LIB_ENV).ok();
    let ld = std::env::var("LD_LIBRARY_PATH").ok();
    let ours = crate::api_comm::ncclGetVersion as extern "C" fn(*mut c_int) -> NcclResult as usize;
    let mut tried = Vec::new();
    for path in candidates(explicit.as_deref(), ld.as_deref()) {
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        let lib = match unsafe { libloading::Library::new(&path) } {
            Ok(l) => l,
            Err(e) => {
                tried.push(format!("{path}: {e}"));
                continue;
            }
        };
        // SAFETY: `ncclGetVersion` has this prototype in every NCCL.
        let get_version = unsafe {
            lib.get::<unsafe extern "C" fn(*mut c_int) -> NcclResult>(b"ncclGetVersion\0")
        };
        let Ok(get_version) = get_version else {
            tried.push(format!("{path}: no ncclGetVersion"));
            continue;
        };
        if *get_version as usize == ours {
            tried.push(format!("{path}: this library itself"));
            continue;
        }
        let mut version = 0;
        // SAFETY: writes one int.
        unsafe { get_version(&mut version) };
        log::info!("devcomm-nccl: falling back to NCCL {version} from {path}");
        return Ok(Nccl::resolve(lib, path, version));
    }
    Err(format!(
        "no real NCCL to fall back to (set {LIB_ENV} to libnccl.so.2's path); tried: {}",
        tried.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_wins_else_the_search_path_then_each_folder() {
        assert_eq!(
            candidates(Some("/x/libnccl.so.2"), Some("/a")),
            ["/x/libnccl.so.2"]
        );
        assert_eq!(
            candidates(None, Some("/a:/b/::/c")),
            [
                "libnccl.so.2",
                "/a/libnccl.so.2",
                "/b/libnccl.so.2",
                "/c/libnccl.so.2"
            ]
        );
        assert_eq!(candidates(Some(" "), None), ["libnccl.so.2"]);
    }
}
