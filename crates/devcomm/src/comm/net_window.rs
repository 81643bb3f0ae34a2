//! A window's network path (docs/NETWORK.md, "Users' kernels and network peers"): in a job with
//! network links, `Comm::window` registers the window's data and signal pad (GPU memory) with
//! the transport, so that users' kernels reach network peers through the communicator's queues
//! (`window_net.cuh`) beside their NVLink peers in the same launch.

use super::net_p2p::NetPeers;
use crate::error::Result;
use crate::net::{route, WindowNetHandle};
use crate::window_net::{NetPath, Registered};

impl NetPeers {
    /// Collective (every rank of a job with network links, in the same order): registers a
    /// window's data and signal pad, both GPU memory, with the transport. A registration
    /// refused on any rank (UCX without its CUDA memory support) gives every rank the same
    /// [`NetPath::Unavailable`]; only a failure of the store is an error.
    pub(crate) fn window_path(&self, data: (u64, u64), signals: (u64, u64)) -> Result<NetPath> {
        let transport = self.transport()?;
        let store = &self.group().store;
        // SAFETY: the window owns both allocations and drops its `NetPath` (which releases the
        // registrations) before them.
        let data_key = match unsafe { transport.register(store, data.0, data.1, true) } {
            Ok(key) => key,
            Err(e) => return Ok(NetPath::Unavailable(unavailable(&e.to_string()))),
        };
        // SAFETY: as above.
        let signal_key = match unsafe { transport.register(store, signals.0, signals.1, true) } {
            Ok(key) => key,
            Err(e) => {
                transport.releaser().release(store, data_key)?;
                return Ok(NetPath::Unavailable(unavailable(&e.to_string())));
            }
        };
        let handle = WindowNetHandle {
            queues: self.queues_handle(),
            first_channel: route::CHANNELS,
            channels: self.user_channels(),
            data_key,
            signal_key,
        };
        Ok(NetPath::Ready(Registered::new(
            handle,
            transport.releaser(),
            self.group().clone(),
        )))
    }
}

/// The reason of a refused registration, with what to change.
fn unavailable(error: &str) -> String {
    format!(
        "registering its GPU memory with UCX failed ({error}); UCX needs its CUDA support for \
         that (the cuda_copy transport in UCX_TLS, e.g. `tcp,cuda_copy`, or `rc,cuda_copy` \
         with GPUDirect RDMA, and UCX's CUDA modules installed)"
    )
}
