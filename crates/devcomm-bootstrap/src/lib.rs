//! Process-group bootstrap for devcomm (layer 2): who am I, a TCP key-value store hosted by
//! rank 0, file-descriptor passing between local ranks, and the `devcomm launch` launcher.
//!
//! CONTRACT (owned by the bootstrap module; other crates code against these signatures):
//! every blocking call takes a timeout and fails with an error naming what is missing.
//!
//! # Pieces
//!
//! - [`RankInfo`]: rank, world size, local rank, master address and job token, read from the
//!   torchrun-style environment ([`RankInfo::from_env`]) or built in code ([`RankInfo::new`]).
//! - [`Store`]: a client of the job's key-value store. Rank 0's [`Store::connect`] also starts
//!   the store server (a background thread per connection, bounded as described below); every
//!   rank, rank 0 included, then talks to it over TCP, with the protocol described below.
//! - [`limits`]: the named limits (frame sizes, deadlines, connection caps, the launcher's
//!   line piece) and [`StoreLimits`] for [`Store::connect_with`].
//! - [`Store::exchange_fds`]: passing file descriptors between the ranks of one host over
//!   abstract-namespace Unix sockets with `SCM_RIGHTS`, with credential checks.
//! - [`Store::host_fresh`] / [`Store::join_address`]: a store of a group that meets through
//!   another channel (torchrun's or torch.distributed's store): rank 0 hosts it on an
//!   ephemeral port with a fresh token and publishes its [`StoreAddress`] there.
//! - [`launcher`]: `devcomm launch -n N -- CMD`: starts N ranks with the variables set, prefixes
//!   their output with the rank and stops them all when one fails.
//!
//! # Store protocol
//!
//! Every message is a frame: a little-endian `u32` byte count, then that many bytes. The first
//! byte of a frame is an opcode; fields follow (integers little-endian, strings and byte strings
//! as a `u32` length and the bytes). The first request on a connection is `Hello` (a magic
//! number, protocol version, rank, world size, optional job token); the server answers `Ok`, or
//! an error reply and closes the connection when the token does not match (the client reports
//! [`Error::BadToken`]). After that the client sends one request at a time and reads one reply:
//! `Set`, `Get` (several keys; the server waits until all are present, up to the timeout the
//! client sent, and answers with the values or with the list of keys still missing), `Add`
//! (checked: an overflow is refused, never wrapped) and `Wait`. Clients bound each read by the
//! operation's timeout plus a margin, so a vanished server is an error, never a hang.
//!
//! # Store admission and limits
//!
//! Until its hello is accepted, a connection may send one frame of at most
//! [`limits::MAX_HELLO_FRAME`] bytes, which must arrive whole within one deadline
//! ([`limits::HELLO_DEADLINE`]); a longer length prefix is refused before anything is
//! allocated. At most [`limits::MAX_PENDING_AUTH`] connections wait for their hello at once; a
//! newcomer beyond that drops the oldest waiting one, so silent connections cannot lock real
//! ranks out and the server's threads and fds stay bounded. The token is compared in constant
//! time, and each rank joins once (a second client claiming a rank that joined is refused),
//! so the store holds at most `MAX_PENDING_AUTH + world size` connections.
//!
//! Rank 0 binds the address `MASTER_ADDR` names and nothing else: a `MASTER_ADDR` that is not
//! an address of this host is an [`Error::Env`] for rank 0, and an address beyond loopback
//! (including `0.0.0.0`) requires a job token. After the hello, frames are limited to
//! [`StoreLimits::max_frame`] (default [`limits::DEFAULT_MAX_FRAME`]): a larger request is
//! refused before it is sent (or, from a client with a larger limit, drained by the server and
//! refused), a reply that would be larger (an all-gather of big blobs) is refused by the
//! server, and a reply larger than a client's own limit is drained by the client; each is an
//! [`Error::Protocol`] that names the sizes, and the connection stays usable. See
//! docs/SECURITY.md for the threat model.
//!
//! # fd passing protocol
//!
//! At connect, each rank listens on the abstract Unix socket
//! `devcomm-<hash of master address, port and job token>-<rank>` and publishes its pid under
//! `__devcomm/pid/<rank>`. To send, a rank connects to the peer's socket, checks that the
//! listener belongs to the pid the peer published (and to our uid), and sends one message: a
//! header (magic, sender rank, tag) with the fd attached as `SCM_RIGHTS`. Abstract sockets have
//! no permission check, so the receiver checks `SO_PEERCRED` of each connection right after
//! accepting it: another uid is dropped at once; a process that is not one of the expected
//! senders gets [`limits::FD_STRANGER_GRACE`] to send a message, which must then pass the
//! check against the pid its claimed sender published, and is dropped otherwise. Connections
//! are read side by side without blocking, so a stranger that connects first and stays silent
//! does not delay the real sender. Messages are matched by (tag, sender); messages for other
//! tags are stashed for a later call. Connections complete into the listen backlog (1024)
//! before they are accepted, so every rank can send first and receive afterwards without
//! deadlock.

#![warn(missing_docs)]

use std::time::Duration;

mod auth;
mod env;
mod fdpass;
mod fdrecv;
pub mod launcher;
pub mod limits;
mod rendezvous;
mod server;
mod store;
mod wire;

pub use env::AGENT_STORE_ENV;
pub use limits::StoreLimits;
pub use rendezvous::{fresh_token, StoreAddress};
pub use store::Store;

/// Errors of the bootstrap layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An environment variable is missing or malformed.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A store operation timed out; `missing` names the ranks (or keys) that never arrived.
    #[error("rank {rank}: store {op} `{key}` timed out after {timeout:?}; missing: {missing}")]
    Timeout {
        /// This rank.
        rank: usize,
        /// The operation (get, wait, all_gather, barrier, exchange_fds, connect).
        op: &'static str,
        /// The key or tag.
        key: String,
        /// How long it waited.
        timeout: Duration,
        /// What never came, e.g. "ranks 2, 3".
        missing: String,
    },
    /// The job token did not match: a connection from another job.
    #[error("store rejected a connection: {0}")]
    BadToken(String),
    /// A peer sent something that is not the protocol, or failed a credential check.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An I/O error with context.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Not built yet.
    #[error("{0} is not implemented yet")]
    NotImplemented(&'static str),
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// The bootstrap result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Who this process is, from torchrun-style variables
/// `RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT` (and the optional
/// `DEVCOMM_JOB_TOKEN` the launcher sets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// Global rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank among the processes of this host.
    pub local_rank: usize,
    /// Number of processes on this host.
    pub local_world_size: usize,
    /// Address of rank 0's store.
    pub master_addr: String,
    /// Port of rank 0's store.
    pub master_port: u16,
    /// Shared secret of the job; `None` when the variable is absent. Required when
    /// `master_addr` is beyond loopback (rank 0 refuses to host the store without it).
    pub job_token: Option<String>,
}
