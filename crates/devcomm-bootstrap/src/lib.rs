//! Process-group bootstrap for devcomm (layer 2): who am I, a TCP key-value store hosted by
//! rank 0, file-descriptor passing between local ranks, and the `devcomm launch` launcher.
//!
//! CONTRACT (owned by the bootstrap module; other crates code against these signatures):
//! every blocking call takes a timeout and fails with an error naming what is missing.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

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
    /// Shared secret of the job; `None` when the variable is absent.
    pub job_token: Option<String>,
}

impl RankInfo {
    /// Reads the variables; errors name the variable and what is wrong.
    pub fn from_env() -> Result<Self> {
        Err(Error::NotImplemented("RankInfo::from_env"))
    }
}

/// A client of the job's key-value store; rank 0's `Store` also hosts the server.
#[derive(Debug)]
pub struct Store {
    _private: (),
}

impl Store {
    /// Joins the job's store (rank 0 starts the server first), presents the job token,
    /// publishes this process's pid, and opens the local fd-passing socket.
    pub fn connect(_info: &RankInfo, _timeout: Duration) -> Result<Self> {
        Err(Error::NotImplemented("Store::connect"))
    }
    /// This rank.
    pub fn rank(&self) -> usize {
        0
    }
    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        0
    }
    /// Sets `key` to `value` (overwrites).
    pub fn set(&self, _key: &str, _value: &[u8]) -> Result<()> {
        Err(Error::NotImplemented("Store::set"))
    }
    /// Returns `key`'s value, waiting up to `timeout` for it to be set.
    pub fn get(&self, _key: &str, _timeout: Duration) -> Result<Vec<u8>> {
        Err(Error::NotImplemented("Store::get"))
    }
    /// Adds `delta` to the integer at `key` (absent = 0) and returns the new value.
    pub fn add(&self, _key: &str, _delta: i64) -> Result<i64> {
        Err(Error::NotImplemented("Store::add"))
    }
    /// Waits until every key is set.
    pub fn wait(&self, _keys: &[&str], _timeout: Duration) -> Result<()> {
        Err(Error::NotImplemented("Store::wait"))
    }
    /// Collective: every rank contributes `blob` under `tag`; returns all blobs by rank.
    /// A timeout names the ranks that did not contribute. `tag` must be unique per call.
    pub fn all_gather(&self, _tag: &str, _blob: &[u8], _timeout: Duration) -> Result<Vec<Vec<u8>>> {
        Err(Error::NotImplemented("Store::all_gather"))
    }
    /// Collective: returns once every rank has entered the barrier `tag`; a timeout names the
    /// ranks that did not arrive.
    pub fn barrier(&self, _tag: &str, _timeout: Duration) -> Result<()> {
        Err(Error::NotImplemented("Store::barrier"))
    }
    /// Collective among `peers` (global ranks on this host; may include this rank, which is
    /// skipped): sends `fd` to every other rank of `peers` over Unix sockets with
    /// `SCM_RIGHTS`, receives one fd from each, and checks each sender's credentials
    /// (same uid, and the pid that rank published). Returns `(rank, fd)` sorted by rank.
    pub fn exchange_fds(
        &self,
        _tag: &str,
        _fd: BorrowedFd<'_>,
        _peers: &[usize],
        _timeout: Duration,
    ) -> Result<Vec<(usize, OwnedFd)>> {
        Err(Error::NotImplemented("Store::exchange_fds"))
    }
}
