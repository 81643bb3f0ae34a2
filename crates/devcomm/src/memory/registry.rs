//! The registrations of one communicator by handle ([`Registry`]): creation order, lookup of
//! a peer's buffer for the zero-copy calls, and the release of what is left in creation order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::registration::{NetworkKey, Registration};
use crate::error::{Error, Result};
use crate::group::Group;

/// The registrations of one communicator, by handle.
///
/// Dropping it releases the remaining registrations on this rank (each marks its release;
/// none waits for a peer: the communicator's own tear-down meets the peers after).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    entries: Mutex<Entries>,
}

/// One rank's buffer of a registration, as [`Registry::target`] resolves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegisteredTarget {
    /// The registration's creation number plus one: equal on every rank, never zero.
    pub id: u64,
    /// The buffer as mapped here.
    pub ptr: u64,
    /// Bytes that rank registered.
    pub bytes: u64,
}

/// Registrations by handle, each with its creation index.
#[derive(Debug, Default)]
struct Entries {
    next: u64,
    by_handle: HashMap<u64, (u64, Registration)>,
}

impl Registry {
    /// An empty registry.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Collective: registers `[ptr, ptr+bytes)` (see [`Registration::register`]) and returns
    /// its handle, the device address of its [`RegisteredBuffer`].
    ///
    /// `network` registers the buffer with the network transport (see
    /// [`Registration::register`]).
    pub(crate) fn register(
        &self,
        group: &Arc<Group>,
        ptr: u64,
        bytes: usize,
        network: impl FnOnce() -> Result<Option<NetworkKey>>,
    ) -> Result<u64> {
        let registration = Registration::register(group, ptr, bytes, network)?;
        let handle = registration.handle();
        let mut entries = self.lock();
        let index = entries.next;
        entries.next += 1;
        entries.by_handle.insert(handle, (index, registration));
        Ok(handle)
    }

    /// Collective: releases the registration `handle` returned by [`register`](Self::register)
    /// on this rank ([`release_local`](Self::release_local)), then waits until every rank has
    /// released its own (released or dropped it), so that no peer maps this rank's buffer any
    /// more and the buffer may be freed. A rank that does not release within the setup timeout
    /// is named in the error. An unknown handle is refused at once, here only.
    pub(crate) fn deregister(&self, group: &Arc<Group>, handle: u64) -> Result<()> {
        let registration = self.take(group, handle)?;
        let mut registration = registration;
        let closed = registration.close();
        let waited = registration.wait_released();
        closed?;
        waited
    }

    /// Releases the registration `handle` on this rank alone, without waiting for any peer
    /// (what dropping a [`Registration`](crate::Registration) does): this rank stops using it
    /// and closes its peers' buffers; each peer closes this rank's buffer when it releases its
    /// own. Calls of peers that still use the registration with this rank fail (this rank's
    /// side refuses the unknown handle; theirs times out naming this rank).
    pub(crate) fn release_local(&self, group: &Arc<Group>, handle: u64) -> Result<()> {
        self.take(group, handle)?.close()
    }

    /// Removes `handle` from the registry; an error naming it when it is not registered here.
    fn take(&self, group: &Arc<Group>, handle: u64) -> Result<Registration> {
        let removed = self.lock().by_handle.remove(&handle);
        removed
            .map(|(_, r)| r)
            .ok_or_else(|| Error::InvalidArgument {
                op: "deregister",
                reason: format!(
                    "rank {}: {handle:#x} is not a registered handle (never registered, or \
                     released already)",
                    group.rank
                ),
            })
    }

    /// `peer`'s buffer of registration `handle`, as mapped here.
    pub(crate) fn get_nvlink_address(&self, handle: u64, peer: usize) -> Option<u64> {
        let entries = self.lock();
        entries
            .by_handle
            .get(&handle)
            .and_then(|(_, r)| r.get_nvlink_address(peer))
    }

    /// Where a zero-copy message for `peer` may land in registration `handle`: the
    /// registration's id (the same on every rank), and the buffer of `peer` as mapped here
    /// with its registered size (`peer` may be this rank: its own buffer).
    pub(crate) fn target(&self, handle: u64, peer: usize) -> Option<RegisteredTarget> {
        let entries = self.lock();
        let (index, r) = entries.by_handle.get(&handle)?;
        Some(RegisteredTarget {
            id: index + 1,
            ptr: r.get_nvlink_address(peer)?,
            bytes: r.peer_bytes(peer)?,
        })
    }

    /// Device address of registration `handle`'s `u64[world_size]` peer table (see
    /// [`Registration::peer_table`]); `None` for an unknown handle.
    pub(crate) fn peer_table(&self, handle: u64) -> Option<u64> {
        let entries = self.lock();
        entries.by_handle.get(&handle).map(|(_, r)| r.peer_table())
    }

    /// The size every rank registered under `handle` (this rank's handle), known to all since
    /// registration whether or not a peer's buffer is mapped here; `None` for an unknown handle.
    pub(crate) fn sizes(&self, handle: u64) -> Option<Vec<u64>> {
        let entries = self.lock();
        let (_, r) = entries.by_handle.get(&handle)?;
        Some(r.sizes().to_vec())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let entries = std::mem::take(&mut *self.lock());
        let mut remaining: Vec<(u64, Registration)> = entries.by_handle.into_values().collect();
        remaining.sort_by_key(|(index, _)| *index);
        // Each registration's drop synchronises and marks its release, in creation order.
        drop(remaining);
    }
}
