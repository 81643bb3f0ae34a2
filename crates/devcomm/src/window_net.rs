//! A window's network path (docs/NETWORK.md, "Users' kernels and network peers"): what a
//! [`Window`](crate::Window) holds towards network peers. `Comm::window` registers the
//! window's data and signal pad with the communicator's transport in a job with network links
//! (`p2p/net_keys.rs`); kernels receive the handle beside the `DeviceWindow` and route each
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
    /// Registered: the handle kernels receive, and the keys it names (released on drop).
    Ready {
        /// What kernels receive.
        handle: WindowNetHandle,
        /// The window's data and pad registrations.
        _keys: NetKeys,
    },
}

/// Registrations with the network transport, released (collectively) on drop: the device is
/// synchronised (kernels that still enqueue on the keys are done), then every key is forgotten
/// after the communicator's tear-down barrier (which a failed communicator does not wait in).
pub(crate) struct NetKeys {
    keys: Vec<u32>,
    releaser: KeyReleaser,
    group: Arc<Group>,
}

impl NetKeys {
    /// `keys` of the transport of `releaser`, in registration order.
    pub(crate) fn new(keys: Vec<u32>, releaser: KeyReleaser, group: Arc<Group>) -> Self {
        Self {
            keys,
            releaser,
            group,
        }
    }

    /// The keys, in registration order.
    pub(crate) fn keys(&self) -> &[u32] {
        &self.keys
    }
}

impl std::fmt::Debug for NetKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetKeys").field("keys", &self.keys).finish()
    }
}

impl Drop for NetKeys {
    fn drop(&mut self) {
        if let Err(e) = self.group.ctx.synchronize() {
            log::warn!("rank {}: network keys release: {e}", self.group.rank);
        }
        for &key in &self.keys {
            if let Err(e) = self.group.teardown_barrier(&self.releaser.barrier_tag(key)) {
                log::warn!(
                    "rank {}: release of network key {key}: {e}",
                    self.group.rank
                );
            }
            self.releaser.forget(key);
        }
    }
}

impl NetPath {
    /// The handle kernels receive: all zero without network links in the job (every routed
    /// operation takes NVLink), the registered path, or why there is none.
    pub(crate) fn handle(&self, rank: usize) -> Result<WindowNetHandle> {
        match self {
            NetPath::NotNeeded => Ok(WindowNetHandle::default()),
            NetPath::Ready { handle, .. } if handle.channels == 0 => Err(Error::Network {
                rank: rank as i32,
                peer: -1,
                message: format!(
                    "rank {rank}: the window's network path has no user channel \
                     (DEVCOMM_NET_USER_CHANNELS=0)"
                ),
            }),
            NetPath::Ready { handle, .. } => Ok(*handle),
            NetPath::Unavailable(reason) => Err(Error::Network {
                rank: rank as i32,
                peer: -1,
                message: format!("rank {rank}: the window has no network path: {reason}"),
            }),
        }
    }
}
