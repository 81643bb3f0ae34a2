//! Layer 8: `Window<T>`, a symmetric buffer with a signal pad, and its `DeviceWindow` handle.
//!
//! Every rank holds `len` elements of `T` and a pad of `world_size + signal_count` 64-bit
//! signals (barrier slots first), both mapped into every NVLink peer. Kernels receive the
//! [`DeviceWindow`] by value and address peers through its device tables.

use std::marker::PhantomData;
use std::mem::size_of;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::DeviceRepr;

use crate::cuda::{with_rank, DeviceBuffer};
use crate::error::{Error, Result};
use crate::group::Group;
use crate::handles::DeviceWindow;
use crate::memory::SymmetricMemory;
use crate::net::WindowNetHandle;
use crate::window_net::NetPath;

/// A symmetric buffer of `len` elements of `T` on every rank, plus a signal pad and this
/// rank's barrier counter.
///
/// Created collectively (every rank calls `Comm::window` in the same order with the
/// same arguments); dropping it is collective too (it waits for every rank).
pub struct Window<T> {
    len: usize,
    signal_count: usize,
    handle: DeviceWindow,
    /// The network path (dropped first: its registrations go before the memory).
    net: NetPath,
    /// Dropped next: synchronises the device and waits for all ranks before unmapping.
    data: SymmetricMemory,
    signals: SymmetricMemory,
    /// This rank's barrier epoch (`u64`, device memory, not shared).
    _epoch: DeviceBuffer,
    _element: PhantomData<T>,
    /// Last, so the communicator outlives everything above.
    group: Arc<Group>,
}

impl<T> std::fmt::Debug for Window<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("element", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("signal_count", &self.signal_count)
            .field("handle", &self.handle)
            .field("net", &self.net)
            .field("data", &self.data)
            .field("signals", &self.signals)
            .finish()
    }
}

impl<T: DeviceRepr> Window<T> {
    /// Collective: allocates `len` elements and `signal_count` user signal slots on every
    /// rank and maps them into every NVLink peer. Data and signals are zero when this
    /// returns on any rank.
    pub(crate) fn new(group: &Arc<Group>, len: usize, signal_count: usize) -> Result<Self> {
        let sizes = window_sizes(len, size_of::<T>(), group.world_size, signal_count);
        let (data_bytes, signal_bytes) = group.agree("window: arguments", sizes)?;

        // The epoch (zero) and the address of the abort mirror, complete before the signal
        // pad's final setup agreement (which synchronises the device), so no kernel can see a
        // stale epoch.
        let epoch = DeviceBuffer::from_slice(&group.ctx, &[0u64, group.errors.mirror_ptr()])
            .map_err(|e| with_rank(e, group.rank));
        let epoch = group.agree("window: barrier epoch", epoch)?;

        let data = SymmetricMemory::new(group, data_bytes)?;
        let signals = SymmetricMemory::new(group, signal_bytes)?;

        let handle = DeviceWindow {
            data: data.local_ptr(),
            data_bytes: data_bytes as u64,
            signals: signals.local_ptr(),
            signal_count: signal_count as u64,
            peer_data: data.peer_table(),
            peer_signals: signals.peer_table(),
            error_state: group.errors.device_ptr(),
            timeout_ns: timeout_ns(group.device_timeout),
            barrier_epoch: epoch.ptr(),
            rank: i32::try_from(group.rank).unwrap_or(i32::MAX),
            world_size: i32::try_from(group.world_size).unwrap_or(i32::MAX),
        };
        Ok(Self {
            len,
            signal_count,
            handle,
            net: NetPath::NotNeeded,
            data,
            signals,
            _epoch: epoch,
            _element: PhantomData,
            group: group.clone(),
        })
    }

    /// The plain handle kernels receive by value.
    pub fn device_handle(&self) -> DeviceWindow {
        self.handle
    }

    /// The network path kernels receive by value beside [`device_handle`](Self::device_handle)
    /// for the routed operations of `window_net.cuh` (`put_routed`, `put_signal_routed`,
    /// `signal_routed`, `flush_routed`, `barrier_routed`, ...): all zero in a job without
    /// network links (every peer is reached over NVLink). [`Error::Network`] when the job has
    /// network links but the transport could not register the window (UCX without CUDA
    /// memory support: the message says what to set) or `DEVCOMM_NET_USER_CHANNELS` is 0.
    pub fn net_handle(&self) -> Result<WindowNetHandle> {
        self.net.handle(self.group.rank)
    }

    /// Attaches the window's network path (`Comm::window`).
    pub(crate) fn set_net_path(&mut self, net: NetPath) {
        self.net = net;
    }

    /// `peer`'s data region as mapped here (this rank's own for `peer == rank()`), or `None`
    /// when there is no NVLink path to `peer`.
    pub fn get_nvlink_address(&self, peer: usize) -> Option<u64> {
        self.data.peer_ptr(peer)
    }

    /// `peer`'s signal pad as mapped here, or `None` without an NVLink path.
    pub fn get_nvlink_signal_address(&self, peer: usize) -> Option<u64> {
        self.signals.peer_ptr(peer)
    }

    /// Elements per rank.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of data per rank (`len * size_of::<T>()`).
    pub fn data_bytes(&self) -> usize {
        self.data.bytes()
    }

    /// This rank's data region (device address of `len` elements of `T`).
    pub fn as_device_ptr(&self) -> u64 {
        self.data.local_ptr()
    }

    /// This rank's signal pad (`world_size` barrier slots, then the user slots).
    pub fn signals_device_ptr(&self) -> u64 {
        self.signals.local_ptr()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.group.world_size
    }

    /// User signal slots per pad.
    pub fn signal_count(&self) -> usize {
        self.signal_count
    }
}

/// `(data bytes, signal pad bytes)` of a window, or `InvalidArgument` on overflow.
fn window_sizes(
    len: usize,
    element_bytes: usize,
    world_size: usize,
    signal_count: usize,
) -> Result<(usize, usize)> {
    let data = len
        .checked_mul(element_bytes)
        .ok_or_else(|| Error::InvalidArgument {
            op: "Window::new",
            reason: format!("{len} elements of {element_bytes} bytes overflow"),
        })?;
    let signals = world_size
        .checked_add(signal_count)
        .and_then(|slots| slots.checked_mul(size_of::<u64>()))
        .ok_or_else(|| Error::InvalidArgument {
            op: "Window::new",
            reason: format!("{world_size} barrier slots + {signal_count} signal slots overflow"),
        })?;
    Ok((data, signals))
}

/// A duration in nanoseconds, saturating at `u64::MAX` (which means "no bound" in practice).
fn timeout_ns(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_cover_data_and_the_signal_pad() {
        assert_eq!(window_sizes(1000, 4, 4, 16).unwrap(), (4000, (4 + 16) * 8));
        assert_eq!(window_sizes(0, 8, 2, 0).unwrap(), (0, 16));
        assert!(window_sizes(usize::MAX, 2, 1, 0).is_err());
        assert!(window_sizes(1, 1, 8, usize::MAX - 4).is_err());
    }

    #[test]
    fn timeouts_convert_and_saturate() {
        assert_eq!(timeout_ns(Duration::from_millis(1500)), 1_500_000_000);
        assert_eq!(timeout_ns(Duration::MAX), u64::MAX);
    }
}
