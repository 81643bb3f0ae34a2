//! The one error type of the library; `net`: the network transport's errors and the wording
//! of the error records its proxy writes (pure, so that the cuda layer, which reads every
//! record, words them without the network layer).

pub mod net;

use std::time::Duration;

use crate::handles::DeviceOp;

/// Every failure devcomm reports. Messages carry the rank, peer, operation and sizes involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA driver call failed.
    #[error("rank {rank}: CUDA {call} failed: {source}")]
    Cuda {
        /// Rank of this process (-1 before the rank is known).
        rank: i32,
        /// The driver call, e.g. `cuMemCreate`.
        call: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A shared library devcomm needs could not be loaded (no driver on this machine, say).
    #[error("{library} could not be loaded: searched for {searched}")]
    LibraryNotLoaded {
        /// The library.
        library: &'static str,
        /// The file names tried and where the loader looked.
        searched: String,
    },
    /// NVRTC could not be loaded or failed outside of a compile error.
    #[error("NVRTC {call} failed: {message}")]
    Nvrtc {
        /// The NVRTC call.
        call: &'static str,
        /// What went wrong.
        message: String,
    },
    /// A kernel (or a user hook inside it) did not compile. `log` is the compiler's output.
    #[error("kernel `{kernel}` did not compile:\n{log}")]
    Compile {
        /// The kernel's name.
        kernel: String,
        /// The compiler's log, with line numbers of the source it was given.
        log: String,
    },
    /// The process group could not be formed or a store operation failed.
    #[error(transparent)]
    Bootstrap(#[from] devcomm_bootstrap::Error),
    /// A collective setup step failed on one or more ranks; every rank returns this error.
    #[error("setup step `{step}` failed on rank(s) {}", fmt_failures(.failures))]
    Setup {
        /// The step, e.g. `symmetric alloc: import`.
        step: String,
        /// `(rank, message)` for every rank that failed.
        failures: Vec<(usize, String)>,
    },
    /// A device wait gave up: the peer's signal did not come within the timeout.
    #[error(
        "rank {rank}: {op} timed out after {elapsed:?} waiting for peer {peer} \
         (slot {slot}: expected {expected}, saw {seen}); the communicator must be rebuilt"
    )]
    PeerTimeout {
        /// What the wait was for.
        op: DeviceOp,
        /// The rank that waited.
        rank: i32,
        /// The peer whose signal never came (-1 if not peer-specific).
        peer: i32,
        /// Signal slot index.
        slot: u64,
        /// Value waited for.
        expected: u64,
        /// Last value read.
        seen: u64,
        /// How long it waited.
        elapsed: Duration,
    },
    /// An earlier device error left the communicator unusable.
    #[error("rank {rank}: communicator aborted by an earlier error ({reason}); rebuild it")]
    Aborted {
        /// This rank.
        rank: i32,
        /// The first error.
        reason: String,
    },
    /// Device-resident all-to-all-v counts do not fit a buffer: the kernel wrote nothing out of
    /// bounds (a receiver drains its peers' data and discards it; a sender sends nothing for
    /// the bad range). Reported once; the communicator stays usable.
    #[error(
        "rank {rank}: all-to-all-v counts need {needed} rows but the {side} buffer holds          {capacity}{}", if *peer >= 0 { format!(" (peer {peer})") } else { String::new() }
    )]
    CountOverflow {
        /// The rank whose buffer is too small.
        rank: i32,
        /// `send` or `receive`.
        side: &'static str,
        /// For a send range, the peer it was meant for; -1 for the receive buffer.
        peer: i32,
        /// Rows the counts need (end of the range, or the total received).
        needed: u64,
        /// Rows the buffer holds.
        capacity: u64,
    },
    /// The two sides of a zero-copy send/recv disagree on the destination (registration,
    /// offset) or the size: the sender wrote nothing, both calls returned, and the
    /// communicator stays usable. Reported once, on each side.
    #[error(
        "rank {rank}: zero-copy call with peer {peer} does not match: {field} is {local} here \
         but {remote} on the other side (sender and receiver must name the same registration, \
         offset and size); nothing was written"
    )]
    ZeroCopyMismatch {
        /// The rank reporting.
        rank: i32,
        /// The other side.
        peer: i32,
        /// `registration`, `offset` or `bytes`; `call` when the sender refused it.
        field: &'static str,
        /// This side's value.
        local: u64,
        /// The other side's value (0 when the receiver learns of the refusal).
        remote: u64,
    },
    /// A copy-engine receive found another chunk in its slot than the one it expected: the two
    /// sides posted different messages, or the sender gave up on a wait and its released copies
    /// overwrote a slot being read. The destination's contents are undefined; the communicator
    /// is aborted.
    #[error(
        "rank {rank}: copy-engine recv from peer {peer}: {field} is {seen} in the slot, {expected} \
         expected (did both sides post the same message, of the same size, on their streams?); \
         the communicator must be rebuilt"
    )]
    CopyEngineMismatch {
        /// The receiving rank.
        rank: i32,
        /// The sender.
        peer: i32,
        /// `the chunk id` or `the message size`.
        field: &'static str,
        /// What the receiver expected.
        expected: u64,
        /// What the slot carried.
        seen: u64,
    },
    /// The two sides of a call differ (send/recv sizes, a zero-copy call against a staged one,
    /// or two different collectives): found on the device before anything was written into
    /// the destination. The ranks' per-call counters no longer agree, so the communicator is
    /// aborted and must be rebuilt.
    #[error(
        "rank {rank}: {what} with peer {peer} does not match: {field} is {local} here but \
         {remote} on peer {peer} (every rank must make the same calls in the same order); \
         nothing was written; the communicator is aborted and must be rebuilt"
    )]
    CallMismatch {
        /// The rank that found it.
        rank: i32,
        /// The other side.
        peer: i32,
        /// Which call: `send/recv`, or `collective`.
        what: &'static str,
        /// What differs, e.g. `the size in bytes`.
        field: &'static str,
        /// This side's value.
        local: u64,
        /// The peer's value.
        remote: u64,
    },
    /// The network transport failed (docs/NETWORK.md, "Failures"): a network peer died or
    /// its link broke, a descriptor queue stayed full, a flush was not completed, or the
    /// proxy refused a descriptor; or its setup failed. `message` is the network layer's
    /// text (`net::NetError`), naming the rank, the peer, the channel and the UCX status.
    #[error("{message}")]
    Network {
        /// The rank that reports it.
        rank: i32,
        /// The peer concerned (-1 for a setup error of several ranks).
        peer: i32,
        /// The network layer's error text.
        message: String,
    },
    /// An argument is invalid; nothing was launched or written.
    #[error("{op}: invalid argument: {reason}")]
    InvalidArgument {
        /// The operation called.
        op: &'static str,
        /// What is wrong, with the values involved.
        reason: String,
    },
    /// A transfer does not fit the staging or destination capacity; nothing was written.
    #[error("{op}: {bytes} bytes for peer {peer} exceed the capacity of {capacity} bytes")]
    CapacityExceeded {
        /// The operation.
        op: &'static str,
        /// The peer concerned.
        peer: usize,
        /// Bytes requested.
        bytes: u64,
        /// Bytes available.
        capacity: u64,
    },
    /// The communicator's memory pool has no free range for a request; nothing was allocated
    /// and nothing written. Grow the pool ([`crate::Comm::grow_pool`], collective) or set a
    /// larger first segment (`DEVCOMM_POOL_MIB`).
    #[error(
        "rank {rank}: devcomm memory pool exhausted: {requested} bytes requested ({rounded} \
         rounded); the pool holds {} segment(s) of {segments:?} bytes with {free} bytes free, \
         the largest free range {largest_free} bytes; grow it with grow_pool (collective) or \
         DEVCOMM_POOL_MIB",
        segments.len()
    )]
    PoolExhausted {
        /// This rank.
        rank: usize,
        /// Bytes asked for.
        requested: u64,
        /// Bytes the request needs once rounded up to the pool's 256-byte granule.
        rounded: u64,
        /// Each segment's size, in creation order.
        segments: Vec<u64>,
        /// Free bytes over all segments.
        free: u64,
        /// The largest free range (the largest request that would succeed).
        largest_free: u64,
    },
    /// A peer has no path this operation can use.
    #[error(
        "{op}: no NVLink path from rank {rank} to peer {peer} (link kind {kind}){}",
        no_path_note(kind)
    )]
    NoPath {
        /// The operation.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The unreachable peer.
        peer: usize,
        /// The peer's link kind.
        kind: String,
    },
    /// The feature is reserved and not built yet.
    #[error("{feature} is not implemented yet")]
    NotImplemented {
        /// What was asked for.
        feature: &'static str,
    },
    /// NCCL failed (benchmarks and references only).
    #[error("NCCL {call} failed: {message}")]
    Nccl {
        /// The NCCL call.
        call: &'static str,
        /// NCCL's error.
        message: String,
    },
    /// An I/O error (kernel cache, files).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// What a `NoPath` error adds for a link kind that has no transport for the operation.
fn no_path_note(kind: &str) -> &'static str {
    match kind {
        "net" => {
            "; network peers are not built yet for this operation (the communicator's calls \
             reach them: docs/NETWORK.md, \"Not built yet\")"
        }
        "shm" => "; same-host peers without peer access are not built yet",
        _ => "",
    }
}

fn fmt_failures(failures: &[(usize, String)]) -> String {
    failures
        .iter()
        .map(|(rank, msg)| format!("{rank} ({msg})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds the driver call's name (and the rank) to a `DriverError`.
pub(crate) trait CudaResultExt<T> {
    /// Maps the error to [`Error::Cuda`].
    fn cuda(self, rank: i32, call: &'static str) -> Result<T>;
}

impl<T> CudaResultExt<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn cuda(self, rank: i32, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Cuda { rank, call, source })
    }
}
