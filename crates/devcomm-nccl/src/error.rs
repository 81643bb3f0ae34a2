//! NCCL result codes for devcomm's errors, and the last error's text (`ncclGetLastError`).

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::sync::Mutex;

use crate::ffi::{self, NcclResult};

/// A failure of an exported call: the result code NCCL would return and the message
/// `ncclGetLastError` gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The NCCL result code.
    pub code: NcclResult,
    /// What went wrong (call, rank, sizes).
    pub message: String,
}

impl Failure {
    /// A failure with code `code`.
    pub fn new(code: NcclResult, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `ncclInvalidArgument`.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ffi::INVALID_ARGUMENT, message)
    }

    /// `ncclInvalidUsage`.
    pub fn invalid_usage(message: impl Into<String>) -> Self {
        Self::new(ffi::INVALID_USAGE, message)
    }

    /// `ncclSystemError`.
    pub fn system(message: impl Into<String>) -> Self {
        Self::new(ffi::SYSTEM_ERROR, message)
    }

    /// A devcomm error of call `call`.
    pub fn from_devcomm(call: &str, e: &devcomm::Error) -> Self {
        Self::new(code_of(e), format!("{call}: {e}"))
    }
}

/// The NCCL result code of a devcomm error: bad arguments are the caller's
/// (`ncclInvalidArgument`), calls the ranks disagree on or a path devcomm lacks are misuse
/// (`ncclInvalidUsage`), a peer that did not answer or an aborted communicator is remote
/// (`ncclRemoteError`), CUDA failures are `ncclUnhandledCudaError`, and setup, store and
/// I/O failures are `ncclSystemError`.
pub fn code_of(e: &devcomm::Error) -> NcclResult {
    use devcomm::Error as E;
    match e {
        E::InvalidArgument { .. } | E::CountOverflow { .. } => ffi::INVALID_ARGUMENT,
        E::CallMismatch { .. }
        | E::ZeroCopyMismatch { .. }
        | E::CopyEngineMismatch { .. }
        | E::NoPath { .. }
        | E::NotImplemented { .. } => ffi::INVALID_USAGE,
        E::PeerTimeout { .. } | E::Aborted { .. } | E::Network { .. } => ffi::REMOTE_ERROR,
        E::Cuda { .. } => ffi::UNHANDLED_CUDA_ERROR,
        E::Bootstrap(devcomm_bootstrap::Error::Timeout { .. }) => ffi::REMOTE_ERROR,
        E::Bootstrap(_)
        | E::Setup { .. }
        | E::Io { .. }
        | E::LibraryNotLoaded { .. }
        | E::CapacityExceeded { .. }
        | E::PoolExhausted { .. } => ffi::SYSTEM_ERROR,
        _ => ffi::INTERNAL_ERROR,
    }
}

/// The last failure's message of any thread (NCCL keeps one per process too).
static LAST: Mutex<String> = Mutex::new(String::new());

thread_local! {
    /// The copy `ncclGetLastError` hands out on this thread: valid until its next call here.
    static HANDED_OUT: RefCell<CString> = RefCell::new(CString::default());
}

/// Whether warnings go to standard error as NCCL's do: `NCCL_DEBUG` set to WARN, INFO or
/// TRACE, or `DEVCOMM_NCCL_DEBUG=1` (a program loading this library sets up no Rust logger).
pub fn debug_enabled() -> bool {
    let nccl = std::env::var("NCCL_DEBUG")
        .unwrap_or_default()
        .to_ascii_uppercase();
    matches!(nccl.as_str(), "WARN" | "INFO" | "TRACE")
        || std::env::var("DEVCOMM_NCCL_DEBUG").is_ok_and(|v| v == "1")
}

/// A warning of this library: to the Rust log, and to standard error when
/// [`debug_enabled`].
pub fn warn(message: &str) {
    log::warn!("devcomm-nccl: {message}");
    if debug_enabled() {
        eprintln!("devcomm-nccl WARN {message}");
    }
}

/// Records `f` as the last error (and logs it) and returns its code.
pub fn record(f: &Failure) -> NcclResult {
    warn(&f.message);
    if let Ok(mut last) = LAST.lock() {
        *last = f.message.clone();
    }
    f.code
}

/// The code of `r`, recording a failure.
pub fn result(r: Result<(), Failure>) -> NcclResult {
    match r {
        Ok(()) => ffi::SUCCESS,
        Err(f) => record(&f),
    }
}

/// The last error's text, as `ncclGetLastError` returns it.
pub fn last_error_ptr() -> *const c_char {
    let text = LAST.lock().map(|s| s.clone()).unwrap_or_default();
    // No interior NUL in our messages; one from a foreign message is cut there.
    let text = CString::new(text).unwrap_or_else(|e| {
        let n = e.nul_position();
        CString::new(e.into_vec()[..n].to_vec()).unwrap_or_default()
    });
    HANDED_OUT.with(|h| {
        *h.borrow_mut() = text;
        h.borrow().as_ptr()
    })
}

/// Sets the last error's text to a message the real NCCL gave (its `ncclGetLastError`).
pub fn set_last(message: String) {
    if let Ok(mut last) = LAST.lock() {
        *last = message;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn devcomm_errors_map_to_nccl_codes() {
        let invalid = devcomm::Error::InvalidArgument {
            op: "all_reduce",
            reason: "count 3".into(),
        };
        assert_eq!(code_of(&invalid), ffi::INVALID_ARGUMENT);
        let aborted = devcomm::Error::Aborted {
            rank: 1,
            reason: "peer 2 timed out".into(),
        };
        assert_eq!(code_of(&aborted), ffi::REMOTE_ERROR);
        let timeout = devcomm::Error::PeerTimeout {
            op: devcomm::abi::DeviceOp::Barrier,
            rank: 0,
            peer: 3,
            slot: 0,
            expected: 1,
            seen: 0,
            elapsed: Duration::from_secs(1),
        };
        assert_eq!(code_of(&timeout), ffi::REMOTE_ERROR);
        let store_timeout = devcomm::Error::Bootstrap(devcomm_bootstrap::Error::Timeout {
            rank: 1,
            op: "get",
            key: "k".into(),
            timeout: Duration::from_secs(1),
            missing: "rank 0".into(),
        });
        assert_eq!(code_of(&store_timeout), ffi::REMOTE_ERROR);
        let no_path = devcomm::Error::NoPath {
            op: "send",
            rank: 0,
            peer: 1,
            kind: "net".into(),
        };
        assert_eq!(code_of(&no_path), ffi::INVALID_USAGE);
        let missing = devcomm::Error::NotImplemented { feature: "x" };
        assert_eq!(code_of(&missing), ffi::INVALID_USAGE);
        let io = devcomm::Error::Io {
            context: "cache".into(),
            source: std::io::Error::other("disk"),
        };
        assert_eq!(code_of(&io), ffi::SYSTEM_ERROR);
        let f = Failure::from_devcomm("ncclAllReduce", &invalid);
        assert_eq!(f.code, ffi::INVALID_ARGUMENT);
        assert!(f.message.starts_with("ncclAllReduce: ") && f.message.contains("count 3"));
    }

    #[test]
    fn the_last_error_is_what_the_last_failure_said() {
        let code = result(Err(Failure::invalid_usage("ncclSend: peer 9 of 2 ranks")));
        assert_eq!(code, ffi::INVALID_USAGE);
        // SAFETY: the pointer is this thread's copy, valid until its next call here.
        let text = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert_eq!(text.to_str().unwrap(), "ncclSend: peer 9 of 2 ranks");
        assert_eq!(result(Ok(())), ffi::SUCCESS);
    }
}
