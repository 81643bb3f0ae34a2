//! The raw UCX (libucp) interface: constants, parameter structs and a table of function
//! pointers resolved from the library at run time (`dlopen`), in the spirit of cudarc's
//! dynamic loading. The only place in the crate that names a UCX symbol.
//!
//! Everything here is transcribed from the headers of UCX 1.22 (`ucp/api/ucp.h`,
//! `ucp/api/ucp_def.h`, `ucs/type/status.h`, `ucs/memory/memory_type.h`,
//! `ucs/type/thread_mode.h`) for x86-64 and aarch64 Linux (LP64). Structs keep their C field
//! order; `ucx_abi_test.rs` compiles a C file against the installed headers that
//! `_Static_assert`s every size, offset and constant below.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::error::net::{NetError, Result};

/// `ucs_status_t` (`ucs/type/status.h`): 0 is OK, 1 in progress, negative values are errors.
pub(crate) type UcsStatus = i8;
/// `UCS_OK`.
pub(crate) const UCS_OK: UcsStatus = 0;
/// `UCS_INPROGRESS`.
pub(crate) const UCS_INPROGRESS: UcsStatus = 1;
/// `UCS_ERR_CONNECTION_RESET`.
#[cfg(test)]
pub(crate) const UCS_ERR_CONNECTION_RESET: UcsStatus = -25;
/// `UCS_ERR_LAST` (`UCS_PTR_IS_ERR` treats addresses in `[UCS_ERR_LAST, 0)` as errors).
pub(crate) const UCS_ERR_LAST: isize = -100;

/// Opaque handles (`ucp_def.h`).
pub(crate) type UcpContext = *mut c_void;
/// `ucp_worker_h`.
pub(crate) type UcpWorker = *mut c_void;
/// `ucp_ep_h`.
pub(crate) type UcpEp = *mut c_void;
/// `ucp_mem_h`.
pub(crate) type UcpMem = *mut c_void;
/// `ucp_rkey_h`.
pub(crate) type UcpRkey = *mut c_void;
/// `ucp_config_t *`.
pub(crate) type UcpConfig = *mut c_void;
/// `ucp_address_t *` (an opaque byte blob of `address_length` bytes).
pub(crate) type UcpAddress = *mut c_void;
/// `ucs_status_ptr_t`: NULL (done), an error code cast to a pointer, or a request.
pub(crate) type UcsStatusPtr = *mut c_void;

/// `UCP_API_MAJOR` / `UCP_API_MINOR` of the headers transcribed here (`ucp_version.h`).
pub(crate) const UCP_API_MAJOR: c_uint = 1;
/// See [`UCP_API_MAJOR`].
pub(crate) const UCP_API_MINOR: c_uint = 22;

/// `ucp_params_field`.
pub(crate) const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
/// `ucp_params_field`.
pub(crate) const UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
/// `ucp_feature`.
pub(crate) const UCP_FEATURE_RMA: u64 = 1 << 1;

/// `ucp_worker_params_field`.
pub(crate) const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
/// `ucs_thread_mode_t`: the caller serialises every call on the worker.
pub(crate) const UCS_THREAD_MODE_SERIALIZED: c_int = 1;

/// `ucp_ep_params_field`.
pub(crate) const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
/// `ucp_ep_params_field`.
pub(crate) const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
/// `ucp_ep_params_field`.
pub(crate) const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
/// `ucp_err_handling_mode_t`: report a failed peer instead of hanging or aborting.
pub(crate) const UCP_ERR_HANDLING_MODE_PEER: c_int = 1;
/// `ucp_ep_close_flags_t`: close without waiting for the peer.
pub(crate) const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;

/// `ucp_mem_map_params_field`.
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
/// `ucp_mem_map_params_field`.
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;
/// `ucp_mem_map_params_field`.
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_PROT: u64 = 1 << 3;
/// `ucp_mem_map_params_field`.
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE: u64 = 1 << 4;
/// `UCP_MEM_MAP_PROT_LOCAL_READ`.
pub(crate) const UCP_MEM_MAP_PROT_LOCAL_READ: c_uint = 1 << 0;
/// `UCP_MEM_MAP_PROT_LOCAL_WRITE`.
pub(crate) const UCP_MEM_MAP_PROT_LOCAL_WRITE: c_uint = 1 << 1;
/// `UCP_MEM_MAP_PROT_REMOTE_READ`.
pub(crate) const UCP_MEM_MAP_PROT_REMOTE_READ: c_uint = 1 << 8;
/// `UCP_MEM_MAP_PROT_REMOTE_WRITE`.
pub(crate) const UCP_MEM_MAP_PROT_REMOTE_WRITE: c_uint = 1 << 9;
/// `ucs_memory_type_t`.
pub(crate) const UCS_MEMORY_TYPE_HOST: c_int = 0;
/// `ucs_memory_type_t`.
pub(crate) const UCS_MEMORY_TYPE_CUDA: c_int = 1;

/// `ucp_op_attr_t`.
pub(crate) const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;

/// `ucp_params_t`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct UcpParams {
    pub(crate) field_mask: u64,
    pub(crate) features: u64,
    pub(crate) request_size: usize,
    pub(crate) request_init: *mut c_void,
    pub(crate) request_cleanup: *mut c_void,
    pub(crate) tag_sender_mask: u64,
    pub(crate) mt_workers_shared: c_int,
    pub(crate) estimated_num_eps: usize,
    pub(crate) estimated_num_ppn: usize,
    pub(crate) name: *const c_char,
    pub(crate) node_local_id: usize,
}

/// `ucp_worker_params_t` (`cpu_mask` is `ucs_cpu_set_t`: 1024 bits).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct UcpWorkerParams {
    pub(crate) field_mask: u64,
    pub(crate) thread_mode: c_int,
    pub(crate) cpu_mask: [u64; 16],
    pub(crate) events: c_uint,
    pub(crate) user_data: *mut c_void,
    pub(crate) event_fd: c_int,
    pub(crate) flags: u64,
    pub(crate) name: *const c_char,
    pub(crate) am_alignment: usize,
    pub(crate) client_id: u64,
}

/// `ucp_err_handler_cb_t`.
pub(crate) type UcpErrHandlerCb =
    unsafe extern "C" fn(arg: *mut c_void, ep: UcpEp, status: UcsStatus);

/// `ucp_err_handler_t`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct UcpErrHandler {
    pub(crate) cb: Option<UcpErrHandlerCb>,
    pub(crate) arg: *mut c_void,
}

/// `ucs_sock_addr_t`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct UcsSockAddr {
    pub(crate) addr: *const c_void,
    pub(crate) addrlen: u32,
}

/// `ucp_ep_params_t`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct UcpEpParams {
    pub(crate) field_mask: u64,
    pub(crate) address: *const c_void,
    pub(crate) err_mode: c_int,
    pub(crate) err_handler: UcpErrHandler,
    pub(crate) user_data: *mut c_void,
    pub(crate) flags: c_uint,
    pub(crate) sockaddr: UcsSockAddr,
    pub(crate) conn_request: *mut c_void,
    pub(crate) name: *const c_char,
    pub(crate) local_sockaddr: UcsSockAddr,
}

/// `ucp_mem_map_params_t`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct UcpMemMapParams {
    pub(crate) field_mask: u64,
    pub(crate) address: *mut c_void,
    pub(crate) length: usize,
    pub(crate) flags: c_uint,
    pub(crate) prot: c_uint,
    pub(crate) memory_type: c_int,
    pub(crate) exported_memh_buffer: *const c_void,
}

/// `ucp_request_param_t` (the `cb` and `recv_info` unions are one pointer each).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct UcpRequestParam {
    pub(crate) op_attr_mask: u32,
    pub(crate) flags: u32,
    pub(crate) request: *mut c_void,
    pub(crate) cb: *mut c_void,
    pub(crate) datatype: u64,
    pub(crate) user_data: *mut c_void,
    pub(crate) reply_buffer: *mut c_void,
    pub(crate) memory_type: c_int,
    pub(crate) recv_info: *mut c_void,
    pub(crate) memh: UcpMem,
    pub(crate) remote_datatype: u64,
    pub(crate) remote: *const c_void,
    pub(crate) remote_count: usize,
}

macro_rules! zeroed_default {
    ($($t:ty),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                // SAFETY: a plain C struct of integers and raw pointers (and an Option of a
                // function pointer, for which all-zero is None): all-zero bits are valid and
                // are what UCX expects for fields outside the field mask.
                unsafe { std::mem::zeroed() }
            }
        }
    )*};
}
zeroed_default!(
    UcpParams,
    UcpWorkerParams,
    UcpEpParams,
    UcpMemMapParams,
    UcpRequestParam
);

/// The libucp entry points devcomm uses, resolved once per process.
#[derive(Debug)]
pub(crate) struct UcpApi {
    pub(crate) config_read:
        unsafe extern "C" fn(*const c_char, *const c_char, *mut UcpConfig) -> UcsStatus,
    pub(crate) config_release: unsafe extern "C" fn(UcpConfig),
    pub(crate) init_version: unsafe extern "C" fn(
        c_uint,
        c_uint,
        *const UcpParams,
        UcpConfig,
        *mut UcpContext,
    ) -> UcsStatus,
    pub(crate) cleanup: unsafe extern "C" fn(UcpContext),
    pub(crate) get_version: unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint),
    pub(crate) worker_create:
        unsafe extern "C" fn(UcpContext, *const UcpWorkerParams, *mut UcpWorker) -> UcsStatus,
    pub(crate) worker_destroy: unsafe extern "C" fn(UcpWorker),
    pub(crate) worker_get_address:
        unsafe extern "C" fn(UcpWorker, *mut UcpAddress, *mut usize) -> UcsStatus,
    pub(crate) worker_release_address: unsafe extern "C" fn(UcpWorker, UcpAddress),
    pub(crate) worker_progress: unsafe extern "C" fn(UcpWorker) -> c_uint,
    pub(crate) ep_create:
        unsafe extern "C" fn(UcpWorker, *const UcpEpParams, *mut UcpEp) -> UcsStatus,
    pub(crate) ep_close_nbx: unsafe extern "C" fn(UcpEp, *const UcpRequestParam) -> UcsStatusPtr,
    pub(crate) ep_flush_nbx: unsafe extern "C" fn(UcpEp, *const UcpRequestParam) -> UcsStatusPtr,
    pub(crate) mem_map:
        unsafe extern "C" fn(UcpContext, *const UcpMemMapParams, *mut UcpMem) -> UcsStatus,
    pub(crate) mem_unmap: unsafe extern "C" fn(UcpContext, UcpMem) -> UcsStatus,
    pub(crate) rkey_pack:
        unsafe extern "C" fn(UcpContext, UcpMem, *mut *mut c_void, *mut usize) -> UcsStatus,
    pub(crate) rkey_buffer_release: unsafe extern "C" fn(*mut c_void),
    pub(crate) ep_rkey_unpack:
        unsafe extern "C" fn(UcpEp, *const c_void, *mut UcpRkey) -> UcsStatus,
    pub(crate) rkey_destroy: unsafe extern "C" fn(UcpRkey),
    pub(crate) put_nbx: unsafe extern "C" fn(
        UcpEp,
        *const c_void,
        usize,
        u64,
        UcpRkey,
        *const UcpRequestParam,
    ) -> UcsStatusPtr,
    pub(crate) request_check_status: unsafe extern "C" fn(*mut c_void) -> UcsStatus,
    pub(crate) request_free: unsafe extern "C" fn(*mut c_void),
    pub(crate) status_string: unsafe extern "C" fn(UcsStatus) -> *const c_char,
    /// Where the library was loaded from.
    pub(crate) path: PathBuf,
    _lib: Library,
}

/// The library file looked for (the SONAME of UCX 1.x).
pub(crate) const UCP_SONAME: &str = "libucp.so.0";

/// Candidate paths for libucp: from `DEVCOMM_UCX_LIB` when it is set (a file, or a directory
/// that holds the library; nothing else is tried, so a wrong setting is an error, not a silent
/// fallback), else the bare soname (the loader's own search: `LD_LIBRARY_PATH`, the system
/// cache). Pure, for unit tests.
pub(crate) fn candidates(env_lib: Option<&str>) -> Vec<PathBuf> {
    match env_lib.filter(|v| !v.is_empty()) {
        Some(v) if v.ends_with(".so") || v.contains(".so.") => vec![PathBuf::from(v)],
        Some(v) => {
            let dir = Path::new(v);
            vec![dir.join(UCP_SONAME), dir.join("libucp.so")]
        }
        None => vec![PathBuf::from(UCP_SONAME)],
    }
}

impl UcpApi {
    /// Loads libucp from the first candidate that opens (see [`candidates`]).
    pub(crate) fn load(env_lib: Option<&str>) -> Result<Self> {
        Self::load_paths(&candidates(env_lib))
    }

    /// Loads libucp from the first of `paths` that opens.
    pub(crate) fn load_paths(paths: &[PathBuf]) -> Result<Self> {
        let mut tried = Vec::new();
        for path in paths.iter().cloned() {
            // SAFETY: loading UCX runs its constructors (ucs global init), which are
            // designed to run in any process; nothing else is executed.
            match unsafe { Library::new(&path) } {
                Ok(lib) => return Self::resolve(lib, path),
                Err(e) => tried.push(format!("{}: {}", path.display(), with_source(&e))),
            }
        }
        Err(NetError::LibraryMissing {
            library: UCP_SONAME,
            tried,
        })
    }

    fn resolve(lib: Library, path: PathBuf) -> Result<Self> {
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol is declared in ucp.h (or ucs/type/status.h) of UCX 1.22
                // with exactly the signature of the field it is stored in; the Library is
                // kept alive in the same struct, so the pointer outlives no mapping.
                let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) };
                match s {
                    Ok(s) => *s,
                    Err(e) => {
                        return Err(NetError::LibrarySymbol {
                            path: path.display().to_string(),
                            symbol: $name,
                            reason: with_source(&e),
                        })
                    }
                }
            }};
        }
        Ok(Self {
            config_read: sym!("ucp_config_read"),
            config_release: sym!("ucp_config_release"),
            init_version: sym!("ucp_init_version"),
            cleanup: sym!("ucp_cleanup"),
            get_version: sym!("ucp_get_version"),
            worker_create: sym!("ucp_worker_create"),
            worker_destroy: sym!("ucp_worker_destroy"),
            worker_get_address: sym!("ucp_worker_get_address"),
            worker_release_address: sym!("ucp_worker_release_address"),
            worker_progress: sym!("ucp_worker_progress"),
            ep_create: sym!("ucp_ep_create"),
            ep_close_nbx: sym!("ucp_ep_close_nbx"),
            ep_flush_nbx: sym!("ucp_ep_flush_nbx"),
            mem_map: sym!("ucp_mem_map"),
            mem_unmap: sym!("ucp_mem_unmap"),
            rkey_pack: sym!("ucp_rkey_pack"),
            rkey_buffer_release: sym!("ucp_rkey_buffer_release"),
            ep_rkey_unpack: sym!("ucp_ep_rkey_unpack"),
            rkey_destroy: sym!("ucp_rkey_destroy"),
            put_nbx: sym!("ucp_put_nbx"),
            request_check_status: sym!("ucp_request_check_status"),
            request_free: sym!("ucp_request_free"),
            status_string: sym!("ucs_status_string"),
            path,
            _lib: lib,
        })
    }

    /// UCX's text for a status code.
    pub(crate) fn describe(&self, status: UcsStatus) -> String {
        // SAFETY: ucs_status_string accepts any value and returns a static C string.
        let p = unsafe { (self.status_string)(status) };
        if p.is_null() {
            return format!("UCX status {status}");
        }
        // SAFETY: non-null, NUL-terminated, static storage.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The version of the loaded library as (major, minor, release).
    pub(crate) fn version(&self) -> (u32, u32, u32) {
        let (mut a, mut b, mut c) = (0, 0, 0);
        // SAFETY: three valid out-pointers.
        unsafe { (self.get_version)(&mut a, &mut b, &mut c) };
        (a, b, c)
    }
}

/// An error's message followed by its source's (libloading keeps `dlerror()` in the source).
fn with_source(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

/// Splits a `ucs_status_ptr_t` the way `UCS_PTR_IS_ERR` / `UCS_PTR_STATUS` do: `Ok(None)`
/// for NULL (completed at once), `Ok(Some(request))`, or `Err(status)`.
pub(crate) fn status_ptr(p: UcsStatusPtr) -> std::result::Result<Option<*mut c_void>, UcsStatus> {
    let v = p as isize;
    if p.is_null() {
        Ok(None)
    } else if (UCS_ERR_LAST..0).contains(&v) {
        Err(v as UcsStatus)
    } else {
        Ok(Some(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_the_variable_only() {
        let c = candidates(Some("/opt/ucx/lib"));
        assert_eq!(
            c,
            vec![
                PathBuf::from("/opt/ucx/lib/libucp.so.0"),
                PathBuf::from("/opt/ucx/lib/libucp.so")
            ]
        );
        let f = candidates(Some("/x/libucp.so.0"));
        assert_eq!(f, vec![PathBuf::from("/x/libucp.so.0")]);
        assert_eq!(candidates(None), vec![PathBuf::from(UCP_SONAME)]);
        assert_eq!(candidates(Some("")), vec![PathBuf::from(UCP_SONAME)]);
    }

    #[test]
    fn status_pointers_decode_like_the_macros() {
        assert_eq!(status_ptr(std::ptr::null_mut()), Ok(None));
        let err = (-25isize) as UcsStatusPtr;
        assert_eq!(status_ptr(err), Err(UCS_ERR_CONNECTION_RESET));
        let req = 0x7f00_0000_1000usize as UcsStatusPtr;
        assert_eq!(status_ptr(req), Ok(Some(req)));
    }

    #[test]
    fn missing_library_names_what_was_tried() {
        let e = UcpApi::load(Some("/nonexistent/devcomm-ucx")).expect_err("no UCX there");
        let msg = e.to_string();
        assert!(
            msg.contains("libucp.so.0") && msg.contains("/nonexistent/devcomm-ucx"),
            "{msg}"
        );
    }
}
