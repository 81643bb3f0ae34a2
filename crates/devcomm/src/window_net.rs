//! A window's network path (docs/NETWORK.md, "Users' kernels and network peers"): what a
//! [`Window`](crate::Window) holds towards network peers. `Comm::window` registers the
//! window's data and signal pad with the communicator's transport in a job with network links
//! (`comm/net_window.rs`); kernels receive the handle beside the `DeviceWindow` and route each
//! peer with `window_net.cuh`.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::group::Group;
use crate::net::{KeyReleaser, WindowNetHandle};

/// What a window has towards network peers.
#[derive(Debug)]
pub(crate) enum NetPath {
    /// The job has no network link: every peer is an NVLink peer (or unreachable).
    NotNeeded,
    /// The transport could not register the window (on some rank): the reason.
    Unavailable(String),
    /// Registered: the handle kernels receive, and the release of its keys on drop.
    Ready(Registered),
}

/// The window's registrations; released (collectively) on drop.
pub(crate) struct Registered {
    handle: WindowNetHandle,
    releaser: KeyReleaser,
    group: Arc<Group>,
}

impl Registered {
    /// Registrations `handle.data_key` and `handle.signal_key`, released by `releaser` on drop.
    pub(crate) fn new(handle: WindowNetHandle, releaser: KeyReleaser, group: Arc<Group>) -> Self {
        Self {
            handle,
            releaser,
            group,
        }
    }
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("data_key", &self.handle.data_key)
            .field("signal_key", &self.handle.signal_key)
            .finish()
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // Kernels that still enqueue on the keys must be done before the peers forget them.
        if let Err(e) = self.group.ctx.synchronize() {
            log::warn!("rank {}: window release: {e}", self.group.rank);
        }
        for key in [self.handle.data_key, self.handle.signal_key] {
            if let Err(e) = self.releaser.release(&self.group.store, key) {
                log::warn!(
                    "rank {}: window release of network key {key}: {e}",
                    self.group.rank
                );
            }
        }
    }
}

impl NetPath {
    /// The handle kernels receive: all zero without network links in the job (every routed
    /// operation takes NVLink), the registered path, or why there is none.
    pub(crate) fn handle(&self, rank: usize) -> Result<WindowNetHandle> {
        match self {
            NetPath::NotNeeded => Ok(WindowNetHandle::default()),
            NetPath::Ready(r) if r.handle.channels == 0 => Err(Error::Network {
                rank: rank as i32,
                peer: -1,
                message: format!(
                    "rank {rank}: the window's network path has no user channel \
                     (DEVCOMM_NET_USER_CHANNELS=0)"
                ),
            }),
            NetPath::Ready(r) => Ok(r.handle),
            NetPath::Unavailable(reason) => Err(Error::Network {
                rank: rank as i32,
                peer: -1,
                message: format!("rank {rank}: the window has no network path: {reason}"),
            }),
        }
    }
}
