//! The registrations of one communicator by handle ([`Registry`]): creation order, lookup of
//! a peer's buffer for the zero-copy calls, and the release of what is left in creation order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::registration::{NetworkKey, Registration};
use crate::error::{Error, Result};
use crate::group::Group;

/// The registrations of one communicator, by handle.
///
/// Dropping it releases the remaining registrations in creation order, which is the same on
/// every rank (each release waits for all ranks).
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
    /// on this rank. Every rank must call it (with its own handle of the same registration);
    /// an unknown handle on any rank fails on every rank and releases nothing.
    pub(crate) fn deregister(&self, group: &Arc<Group>, handle: u64) -> Result<()> {
        let known = self.lock().by_handle.contains_key(&handle);
        let lookup = if known {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                op: "deregister",
                reason: format!(
                    "rank {}: {handle:#x} is not a registered handle",
                    group.rank
                ),
            })
        };
        group.agree("deregister", lookup)?;
        let registration = self.lock().by_handle.remove(&handle);
        match registration {
            Some((_, mut registration)) => registration.close(),
            None => Err(Error::InvalidArgument {
                op: "deregister",
                reason: format!(
                    "rank {}: {handle:#x} was deregistered concurrently",
                    group.rank
                ),
            }),
        }
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
        // Each registration's drop synchronises and waits for every rank, in creation order.
        drop(remaining);
    }
}
