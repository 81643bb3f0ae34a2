//! Errors of the network transport.

use std::time::Duration;

use crate::handles::{DeviceOp, ErrorRecord};

/// Every failure of the network layer. Messages carry the rank, peer, operation and sizes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// libucp could not be loaded.
    #[error(
        "the UCX library {library} could not be loaded (tried: {}); run scripts/install-ucx.sh \
         and set DEVCOMM_UCX_LIB to the directory it prints (or put it on LD_LIBRARY_PATH), or \
         install a system UCX",
        tried.join("; ")
    )]
    LibraryMissing {
        /// The library looked for.
        library: &'static str,
        /// Each path tried, with the loader's reason.
        tried: Vec<String>,
    },
    /// libucp was loaded but lacks a symbol (too old a UCX).
    #[error("{path} lacks the symbol {symbol} (UCX 1.22 or newer is needed): {reason}")]
    LibrarySymbol {
        /// Where the library was loaded from.
        path: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },
    /// A UCX call failed.
    #[error("rank {rank}: UCX {call}{} failed: {message} (status {status})", peer_suffix(*peer))]
    Ucx {
        /// This rank.
        rank: i32,
        /// The peer concerned, -1 if none.
        peer: i32,
        /// The UCX function.
        call: &'static str,
        /// The `ucs_status_t` returned.
        status: i8,
        /// UCX's text for it.
        message: String,
    },
    /// A network peer failed (its process died, the link broke, or an operation to it did not
    /// complete in time); the communicator must be rebuilt.
    #[error(
        "rank {rank}: network peer {peer} failed during {op} (channel {channel}, descriptor \
         {seq}): {reason}; the communicator must be rebuilt"
    )]
    PeerFailed {
        /// This rank.
        rank: i32,
        /// The failed peer.
        peer: i32,
        /// What the proxy was doing.
        op: String,
        /// The queue's channel.
        channel: u64,
        /// Sequence number (1-based position) of the descriptor in its queue.
        seq: u64,
        /// UCX's description of the failure.
        reason: String,
    },
    /// A producer found its queue full for longer than the timeout: the proxy did not free an
    /// entry (it is stuck, or the communicator was aborted).
    #[error(
        "rank {rank}: network queue to peer {peer} (channel {channel}) stayed full for \
         {elapsed:?}: the producer needed {needed} descriptors consumed, the proxy had consumed \
         {consumed}; the communicator must be rebuilt"
    )]
    QueueFull {
        /// This rank.
        rank: i32,
        /// The queue's peer.
        peer: i32,
        /// The queue's channel.
        channel: u64,
        /// Descriptors the proxy had to have consumed for the next entry to be free.
        needed: u64,
        /// Descriptors the proxy had consumed when the producer gave up.
        consumed: u64,
        /// How long the producer waited.
        elapsed: Duration,
    },
    /// A flush did not complete within the timeout.
    #[error(
        "rank {rank}: flush of the network queue to peer {peer} (channel {channel}) waited \
         {elapsed:?} for descriptor {expected}, the proxy completed up to {seen}; the \
         communicator must be rebuilt"
    )]
    FlushTimeout {
        /// This rank.
        rank: i32,
        /// The queue's peer.
        peer: i32,
        /// The queue's channel.
        channel: u64,
        /// The flush descriptor waited for.
        expected: u64,
        /// The last completed flush.
        seen: u64,
        /// How long it waited.
        elapsed: Duration,
    },
    /// A descriptor names memory outside a registration, or an unknown registration; the
    /// proxy performed nothing for it and aborted the communicator.
    #[error("rank {rank}: bad network descriptor for peer {peer} (channel {channel}): {reason}")]
    BadDescriptor {
        /// This rank.
        rank: i32,
        /// The queue's peer.
        peer: i32,
        /// The queue's channel.
        channel: u64,
        /// What is wrong, with the values.
        reason: String,
    },
    /// A failure recorded by a device-side (or stand-in) wait that is not specific to the
    /// network, e.g. a signal that never came.
    #[error(transparent)]
    Device(#[from] crate::Error),
    /// The store failed during setup.
    #[error(transparent)]
    Bootstrap(#[from] devcomm_bootstrap::Error),
    /// A collective setup step failed on one or more ranks; every rank returns this error.
    #[error("network setup step `{step}` failed on rank(s) {}", failures.iter().map(|(r, m)| format!("{r}: {m}")).collect::<Vec<_>>().join("; "))]
    Setup {
        /// The step, e.g. `connect`.
        step: String,
        /// `(rank, message)` for every rank that failed.
        failures: Vec<(usize, String)>,
    },
    /// An argument is invalid; nothing was done.
    #[error("{op}: invalid argument: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong, with the values.
        reason: String,
    },
    /// The communicator was aborted by an earlier error.
    #[error("rank {rank}: network transport aborted by an earlier error ({reason}); rebuild it")]
    Aborted {
        /// This rank.
        rank: i32,
        /// The first error.
        reason: String,
    },
}

fn peer_suffix(peer: i32) -> String {
    if peer >= 0 {
        format!(" (peer {peer})")
    } else {
        String::new()
    }
}

/// The network layer's result type.
pub type Result<T, E = NetError> = std::result::Result<T, E>;

impl NetError {
    /// The rank and peer the error names (-1 where it names none).
    pub fn rank_and_peer(&self) -> (i32, i32) {
        match self {
            Self::Ucx { rank, peer, .. }
            | Self::PeerFailed { rank, peer, .. }
            | Self::QueueFull { rank, peer, .. }
            | Self::FlushTimeout { rank, peer, .. }
            | Self::BadDescriptor { rank, peer, .. } => (*rank, *peer),
            Self::Aborted { rank, .. } => (*rank, -1),
            _ => (-1, -1),
        }
    }
}

/// The library's error for a network failure: a wrapped device or store error is returned as
/// itself, every other one as [`crate::Error::Network`] with its text.
impl From<NetError> for crate::Error {
    fn from(e: NetError) -> Self {
        match e {
            NetError::Device(inner) => inner,
            NetError::Bootstrap(b) => crate::Error::Bootstrap(b),
            other => {
                let (rank, peer) = other.rank_and_peer();
                crate::Error::Network {
                    rank,
                    peer,
                    message: other.to_string(),
                }
            }
        }
    }
}

/// `ErrorRecord::op` codes of the network layer (`kOpNet*` in `handles.cuh`, `DeviceOp::Net*`). `slot` holds the
/// channel.
pub mod op {
    /// A producer waited for a free queue entry (a credit) and gave up; `expected` = entries
    /// the proxy had to have consumed, `seen` = entries it had consumed.
    pub const QUEUE_FULL: u32 = 20;
    /// The proxy found the peer failed; `expected` = the descriptor's seq, `seen` = the UCX
    /// status (as `i8`, sign-extended).
    pub const PEER_FAILED: u32 = 21;
    /// A producer's flush waited too long; `expected` = the flush's seq, `seen` = the last
    /// completed flush.
    pub const FLUSH_TIMEOUT: u32 = 22;
    /// The proxy refused a descriptor (unknown registration, range outside it, unknown op);
    /// `expected` = its seq, `seen` = its op and signal-op words.
    pub const BAD_DESCRIPTOR: u32 = 23;
}

/// The UCX status the proxy stores in `seen` for an operation that did not complete within
/// its timeout (`UCS_ERR_TIMED_OUT`).
pub const STATUS_TIMED_OUT: i8 = -20;

/// Converts a written record into the error the host reports (pure).
pub fn from_record(r: &ErrorRecord) -> NetError {
    match r.op {
        op::QUEUE_FULL => NetError::QueueFull {
            rank: r.rank,
            peer: r.peer,
            channel: r.slot,
            needed: r.expected,
            consumed: r.seen,
            elapsed: Duration::from_nanos(r.elapsed_ns),
        },
        op::PEER_FAILED => NetError::PeerFailed {
            rank: r.rank,
            peer: r.peer,
            op: "the network proxy's operations".to_owned(),
            channel: r.slot,
            seq: r.expected,
            reason: status_text(r.seen as i64 as i8),
        },
        op::FLUSH_TIMEOUT => NetError::FlushTimeout {
            rank: r.rank,
            peer: r.peer,
            channel: r.slot,
            expected: r.expected,
            seen: r.seen,
            elapsed: Duration::from_nanos(r.elapsed_ns),
        },
        op::BAD_DESCRIPTOR => NetError::BadDescriptor {
            rank: r.rank,
            peer: r.peer,
            channel: r.slot,
            reason: format!(
                "descriptor {} (op word {:#x}) names memory outside its registration or an \
                 unknown registration or op",
                r.expected, r.seen
            ),
        },
        _ => NetError::Device(crate::Error::PeerTimeout {
            op: DeviceOp::from_code(r.op),
            rank: r.rank,
            peer: r.peer,
            slot: r.slot,
            expected: r.expected,
            seen: r.seen,
            elapsed: Duration::from_nanos(r.elapsed_ns),
        }),
    }
}

/// Text for the UCX statuses the proxy records (kept here so that reading a record needs no
/// loaded library).
pub fn status_text(status: i8) -> String {
    let what = match status {
        -25 => "connection reset by the remote peer (UCS_ERR_CONNECTION_RESET)",
        -80 => "endpoint timeout (UCS_ERR_ENDPOINT_TIMEOUT)",
        -6 => "destination unreachable (UCS_ERR_UNREACHABLE)",
        -3 => "input/output error (UCS_ERR_IO_ERROR)",
        -16 => "request canceled (UCS_ERR_CANCELED)",
        STATUS_TIMED_OUT => "the operation did not complete within the proxy's timeout",
        _ => return format!("UCX status {status}"),
    };
    what.to_owned()
}
