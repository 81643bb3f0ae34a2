//! Network keys of registered memory and windows (docs/NETWORK.md, "Users' kernels and
//! network peers"): in a job with network links, registrations, pool segments and windows are
//! also registered with the send/recv family's network transport, so that network peers'
//! puts reach them and users' kernels reach network peers through the communicator's queues
//! (`window_net.cuh`) beside their NVLink peers in the same launch.

use super::net::NetPeers;
use super::P2P;
use crate::abi::DeviceWindow;
use crate::error::Result;
use crate::memory::NetworkKey;
use crate::net::{route, WindowNetHandle};
use crate::window_net::{NetKeys, NetPath};

impl NetPeers {
    /// Collective (every rank of a job with network links, in the same order): registers
    /// GPU memory regions `(address, bytes)` with the transport. A registration refused on any
    /// rank (UCX without its CUDA memory support) gives every rank the same `Err(reason)`, the
    /// regions registered before it released; only a failure of the store is an error.
    pub(crate) fn register_gpu(
        &self,
        regions: &[(u64, u64)],
    ) -> Result<std::result::Result<NetKeys, String>> {
        let transport = self.transport()?;
        let store = &self.group().store;
        let mut keys = Vec::new();
        for &(base, bytes) in regions {
            // SAFETY: the caller keeps every region allocated until the returned keys drop.
            match unsafe { transport.register(store, base, bytes.max(1), true) } {
                Ok(key) => keys.push(key),
                Err(e) => {
                    for key in keys {
                        transport.releaser().release(store, key)?;
                    }
                    return Ok(Err(unavailable(&e.to_string())));
                }
            }
        }
        Ok(Ok(NetKeys::new(
            keys,
            transport.releaser(),
            self.group().clone(),
        )))
    }

    /// Collective: the network path of a window (its data and signal pad registered), or why
    /// there is none (the same on every rank).
    pub(crate) fn window_path(&self, data: (u64, u64), signals: (u64, u64)) -> Result<NetPath> {
        let keys = match self.register_gpu(&[data, signals])? {
            Ok(keys) => keys,
            Err(reason) => return Ok(NetPath::Unavailable(reason)),
        };
        let handle = WindowNetHandle {
            queues: self.queues_handle(),
            first_channel: route::CHANNELS,
            channels: self.user_channels(),
            data_key: keys.keys()[0],
            signal_key: keys.keys()[1],
        };
        Ok(NetPath::Ready {
            handle,
            _keys: keys,
        })
    }
}

impl P2P {
    /// Collective, in a job with network links: registers a user buffer (GPU memory) with the
    /// network transport, for its `RegisteredBuffer::lkey`. `None` without network links, or
    /// when the transport could not register it (logged; the same on every rank).
    pub(crate) fn network_key(
        &self,
        rank: usize,
        ptr: u64,
        bytes: usize,
    ) -> Result<Option<NetworkKey>> {
        let Some(net) = self.network() else {
            return Ok(None);
        };
        match net.register_gpu(&[(ptr, bytes as u64)])? {
            Ok(keys) => Ok(Some(NetworkKey {
                lkey: keys.keys()[0],
                _release: Box::new(keys),
            })),
            Err(reason) => {
                log::warn!("rank {rank}: registered buffer without a network key: {reason}");
                Ok(None)
            }
        }
    }

    /// Collective, in a job with network links: the network path of a window whose device
    /// handle is `h` (its data and signal pad registered; `NetPath::Unavailable` with the
    /// reason, logged, when the transport refused); `None` without network links.
    pub(crate) fn window_net_path(&self, rank: usize, h: &DeviceWindow) -> Result<Option<NetPath>> {
        let Some(net) = self.network() else {
            return Ok(None);
        };
        let pad_bytes = (h.world_size as u64 + h.signal_count) * 8;
        let path = net.window_path((h.data, h.data_bytes), (h.signals, pad_bytes))?;
        if let NetPath::Unavailable(reason) = &path {
            log::warn!("rank {rank}: window without a network path: {reason}");
        }
        Ok(Some(path))
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
