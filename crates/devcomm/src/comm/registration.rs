//! Windows and registered buffers of [`Comm`]: [`Registration`], a user buffer made reachable
//! from every NVLink peer's kernels, released when it drops.

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use super::Comm;
use crate::error::Result;
use crate::window::Window;

/// A user buffer registered with every rank ([`Comm::register`], [`Comm::register_slice`]).
///
/// It borrows the communicator, and for [`Comm::register_slice`] the slice, so it can outlive
/// neither.
///
/// **Release.** Dropping it releases this rank's side at once and waits for no peer (an early
/// return on one rank never blocks it): the rank waits for its device's work, closes its
/// mappings of the peers' buffers and marks the release; each peer closes its mapping of this
/// rank's buffer when it releases its own (docs/ARCHITECTURE.md, "Registered buffers"). So the
/// *memory* must stay allocated until every rank has released: [`Registration::release`] is the
/// collective form that returns once every rank has released (dropped or released) this
/// registration, after which the buffer may be freed, and names the ranks that did not
/// within the setup timeout. A call that still uses the registration on a peer after this rank
/// released it is refused here (unknown handle) and fails there within the device timeout,
/// naming this rank.
pub struct Registration<'a> {
    comm: &'a Comm,
    handle: u64,
    ptr: u64,
    bytes: usize,
    released: bool,
    /// The registered memory, borrowed for `'a` by [`Comm::register_slice`].
    _memory: PhantomData<&'a ()>,
}

impl std::fmt::Debug for Registration<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("rank", &self.comm.rank())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .field("device_handle", &format_args!("{:#x}", self.handle))
            .finish()
    }
}

impl Registration<'_> {
    /// The device address of this registration's `RegisteredBuffer` struct
    /// (`cuda/devcomm/handles.cuh`): the value a user kernel takes to reach the peers' buffers.
    pub fn device_handle(&self) -> u64 {
        self.handle
    }

    /// The registered buffer on this rank.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes registered on this rank.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// `peer`'s buffer of this registration as mapped here (this rank's own for `peer ==
    /// rank`), or `None` without an NVLink path.
    pub fn nvlink_address(&self, peer: usize) -> Option<u64> {
        self.comm.registry.get_nvlink_address(self.handle, peer)
    }

    /// The range `[offset, offset + bytes)` of this registration: where a zero-copy message of
    /// `bytes` lands (on the receiver), or is sent to (on the sender: the receiver's buffer of
    /// the same registration). Bounds are checked against each rank's registered size when a
    /// call uses the range.
    pub fn range(&self, offset: u64, bytes: u64) -> RegisteredRange<'_> {
        RegisteredRange {
            handle: self.handle,
            offset,
            bytes,
            _registration: PhantomData,
        }
    }

    /// Collective: releases this rank's side (as dropping does), then waits until every rank
    /// has released the registration; the user may free the buffer once this returns `Ok`. An
    /// error names the ranks that did not release within the setup timeout.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.comm.registry.deregister(&self.comm.group, self.handle)
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Err(e) = self
            .comm
            .registry
            .release_local(&self.comm.group, self.handle)
        {
            log::warn!(
                "devcomm: rank {}: releasing the registration of {:#x} (+{} bytes): {e}",
                self.comm.rank(),
                self.ptr,
                self.bytes
            );
        }
    }
}

/// A byte range inside a [`Registration`]: where a zero-copy message lands
/// ([`Registration::range`]).
///
/// Registration is collective, so one registration names one buffer on every rank: a sender's
/// range addresses the receiver's buffer of that registration, a receiver's range its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisteredRange<'r> {
    pub(crate) handle: u64,
    /// Byte offset into the registered buffer.
    pub offset: u64,
    /// Bytes of the range.
    pub bytes: u64,
    _registration: PhantomData<&'r ()>,
}

impl RegisteredRange<'_> {
    /// The range as the send/recv family takes it.
    pub(crate) fn plain(&self) -> crate::p2p::registered::RegRange {
        crate::p2p::registered::RegRange {
            handle: self.handle,
            offset: self.offset,
            bytes: self.bytes,
        }
    }
}

impl RegisteredRange<'static> {
    /// A range of a registration made with [`Comm::register_raw`] (for bindings that keep
    /// registrations by handle).
    ///
    /// # Safety
    ///
    /// `handle` must come from [`Comm::register_raw`] of the communicator the range is used
    /// with and must not have been released ([`Comm::deregister_raw`]) before every call that
    /// uses the range has been enqueued and its work has finished.
    pub unsafe fn from_raw(handle: u64, offset: u64, bytes: u64) -> Self {
        Self {
            handle,
            offset,
            bytes,
            _registration: PhantomData,
        }
    }
}

impl RegisteredRange<'_> {
    /// A range of the registration `handle` of this crate's registry (a memory pool segment),
    /// borrowed for as long as the caller's borrow of what keeps the registration alive.
    pub(crate) fn of_handle(handle: u64, offset: u64, bytes: u64) -> Self {
        Self {
            handle,
            offset,
            bytes,
            _registration: PhantomData,
        }
    }

    /// The range `bytes` further on, of the same length (`at(p)` of a chunked buffer).
    pub(crate) fn shifted(self, by: u64, bytes: u64) -> Self {
        Self {
            offset: self.offset + by,
            bytes,
            ..self
        }
    }
}

impl Comm {
    /// Collective: a symmetric window of `len` elements and `signal_count` user signal slots
    /// on every rank.
    ///
    /// In a job with network links the window's data and pad are also registered with the
    /// network transport, so that kernels reach network peers through
    /// [`Window::net_handle`] (docs/NETWORK.md, "Users' kernels and network peers").
    pub fn window<T: DeviceRepr>(&self, len: usize, signal_count: usize) -> Result<Window<T>> {
        let mut window = Window::new(&self.group, len, signal_count)?;
        if let Some(path) = self
            .p2p
            .window_net_path(self.rank(), &window.device_handle())?
        {
            window.set_net_path(path);
        }
        Ok(window)
    }

    /// Collective: registers `bytes` bytes at device address `ptr` (each rank its own buffer),
    /// a buffer the user allocated (`cuMemAlloc`/`cudaMalloc` memory, or a `cuMem`
    /// virtual-memory allocation made with the POSIX-fd handle type), so that peers' kernels
    /// can reach it. Other memory (stream-ordered pool allocations) is refused with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) on every rank.
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + bytes)` must stay allocated until the returned [`Registration`] has been
    /// dropped (or released): peers write into it during the zero-copy calls that name it.
    /// [`Comm::register_slice`] is the safe form for cudarc slices.
    pub unsafe fn register(&self, ptr: u64, bytes: usize) -> Result<Registration<'_>> {
        let handle = self
            .registry
            .register(&self.group, ptr, bytes, || self.network_key(ptr, bytes))?;
        Ok(Registration {
            comm: self,
            handle,
            ptr,
            bytes,
            released: false,
            _memory: PhantomData,
        })
    }

    /// Collective: registers `slice` (see [`Comm::register`]); the registration borrows it, so
    /// the slice outlives it. A slice from a stream-ordered pool (cudarc's `alloc` on a
    /// stream, with async allocation supported) cannot be registered and is refused on every
    /// rank.
    pub fn register_slice<'a, T: DeviceRepr>(
        &'a self,
        slice: &'a CudaSlice<T>,
    ) -> Result<Registration<'a>> {
        let bytes = slice.num_bytes();
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(slice.stream());
            ptr
        };
        // SAFETY: the registration borrows `slice` for 'a, so the memory stays allocated until
        // the registration is dropped.
        unsafe { self.register(ptr, bytes) }
    }
}
