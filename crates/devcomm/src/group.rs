//! The process group every layer above bootstrap works in: rank, store, CUDA context,
//! topology and the host-mapped error state. Owned by [`crate::Comm`]; windows and
//! registrations hold an `Arc<Group>` so they can release peers' mappings in order on drop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use devcomm_bootstrap::Store;

use crate::cuda::ErrorState;
use crate::error::{Error, Result};
use crate::topology::Topology;

/// Shared state of one communicator.
#[derive(Debug)]
pub(crate) struct Group {
    /// Global rank.
    pub(crate) rank: usize,
    /// Number of ranks.
    pub(crate) world_size: usize,
    /// The job's store.
    pub(crate) store: Store,
    /// This rank's CUDA context (device `local_rank` unless configured otherwise).
    pub(crate) ctx: Arc<CudaContext>,
    /// Link kind of every peer.
    pub(crate) topology: Topology,
    /// Host-mapped error record and abort flag shared by all of this communicator's kernels.
    pub(crate) errors: ErrorState,
    /// Bound of every device wait.
    pub(crate) device_timeout: Duration,
    /// Bound of every host-side setup step (store operations).
    pub(crate) setup_timeout: Duration,
    /// Sequence number that makes collective setup tags unique (same order on every rank).
    seq: AtomicU64,
}

impl Group {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        rank: usize,
        world_size: usize,
        store: Store,
        ctx: Arc<CudaContext>,
        topology: Topology,
        errors: ErrorState,
        device_timeout: Duration,
        setup_timeout: Duration,
    ) -> Self {
        Self {
            rank,
            world_size,
            store,
            ctx,
            topology,
            errors,
            device_timeout,
            setup_timeout,
            seq: AtomicU64::new(0),
        }
    }

    /// A tag unique to this collective call: every rank makes setup calls in the same order,
    /// so the n-th call has the same tag everywhere.
    pub(crate) fn next_tag(&self, what: &str) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{what}#{n}")
    }

    /// Ends a collective setup step with an agreement: every rank shares whether its part
    /// succeeded; if any failed, every rank returns [`Error::Setup`] naming the failed ranks.
    /// A rank whose own part failed gets that same error (its own message included).
    pub(crate) fn agree<T>(&self, step: &str, local: Result<T>) -> Result<T> {
        let tag = self.next_tag(&format!("agree/{step}"));
        agree_on(&self.store, &tag, step, local, self.setup_timeout)
    }
}

/// The agreement protocol, usable before a `Group` exists: every rank all-gathers its status
/// under `tag` (empty for success, `!` + message for failure); if any rank failed, every rank
/// returns [`Error::Setup`] naming the failed ranks and their messages.
pub(crate) fn agree_on<T>(
    store: &Store,
    tag: &str,
    step: &str,
    local: Result<T>,
    timeout: Duration,
) -> Result<T> {
    let status = match &local {
        Ok(_) => Vec::new(),
        Err(e) => format!("!{e}").into_bytes(),
    };
    let all = store.all_gather(tag, &status, timeout)?;
    let failures: Vec<(usize, String)> = all
        .iter()
        .enumerate()
        .filter(|(_, s)| s.first() == Some(&b'!'))
        .map(|(r, s)| (r, String::from_utf8_lossy(&s[1..]).into_owned()))
        .collect();
    if failures.is_empty() {
        local
    } else {
        Err(Error::Setup {
            step: step.to_owned(),
            failures,
        })
    }
}
