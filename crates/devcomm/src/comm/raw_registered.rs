//! Raw forms of the zero-copy operations (`send_registered`, `sendrecv_registered`,
//! `all_to_all_registered`) for bindings that hold a device address and a run-time element
//! size instead of a cudarc slice. Each wraps the address in a [`RawSlice`] and calls the
//! typed method, so the checks and the launch are the typed method's own.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DeviceRepr, DeviceSlice, SyncOnDrop};

use super::raw::RawBuffer;
use super::{Comm, RegisteredRange};
use crate::error::{Error, Result};

/// `len` elements of `T` at a device address, borrowed for one call. No event tracking: the
/// caller orders the memory with `stream` itself (the contract of the raw forms).
struct RawSlice<'a, T> {
    ptr: u64,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _elem: PhantomData<T>,
}

impl<T> DeviceSlice<T> for RawSlice<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DevicePtr<T> for RawSlice<'_, T> {
    fn device_ptr<'b>(&'b self, _stream: &'b CudaStream) -> (u64, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

fn bytes_of(send: RawBuffer, op: &'static str) -> Result<usize> {
    send.elems
        .checked_mul(send.elem_size as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::InvalidArgument {
            op,
            reason: format!(
                "{} elements of {} bytes overflow",
                send.elems, send.elem_size
            ),
        })
}

fn slice<'a, T>(ptr: u64, len: usize, stream: &'a Arc<CudaStream>) -> RawSlice<'a, T> {
    RawSlice {
        ptr,
        len,
        stream,
        _elem: PhantomData,
    }
}

impl Comm {
    /// Collective: [`Comm::register`] for bindings that keep registrations by handle (a
    /// `u64` that [`RegisteredRange::from_raw`] takes) instead of by [`crate::Registration`].
    ///
    /// # Safety
    ///
    /// As [`Comm::register`]: `[ptr, ptr + bytes)` must stay allocated until
    /// [`Comm::deregister_raw`] of the handle has returned on this rank.
    pub unsafe fn register_raw(&self, ptr: u64, bytes: usize) -> Result<u64> {
        self.registry
            .register(&self.group, ptr, bytes, || self.network_key(ptr, bytes))
    }

    /// Collective: releases a registration of [`Comm::register_raw`] (every rank, in the same
    /// order). After it returns the memory may be freed.
    pub fn deregister_raw(&self, handle: u64) -> Result<()> {
        self.registry.deregister(&self.group, handle)
    }

    /// The address of `peer`'s buffer of a registration of [`Comm::register_raw`] as mapped
    /// here, or `None` (an unknown handle, or a peer without an NVLink path).
    pub fn registered_address_raw(&self, handle: u64, peer: usize) -> Option<u64> {
        self.registry.get_nvlink_address(handle, peer)
    }

    /// [`Comm::send_registered`] of the bytes of `send`.
    ///
    /// # Safety
    ///
    /// `send` must be device memory of this rank's context, readable for its bytes until the
    /// work enqueued on `stream` has finished.
    pub unsafe fn send_registered_raw(
        &self,
        send: RawBuffer,
        peer: usize,
        dst: RegisteredRange<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let bytes = bytes_of(send, "send_registered")?;
        self.send_registered(&slice::<u8>(send.ptr, bytes, stream), peer, dst, stream)
    }

    /// [`Comm::sendrecv_registered`] sending the bytes of `send`.
    ///
    /// # Safety
    ///
    /// As [`Comm::send_registered_raw`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sendrecv_registered_raw(
        &self,
        send: RawBuffer,
        send_peer: usize,
        send_dst: RegisteredRange<'_>,
        recv_dst: RegisteredRange<'_>,
        recv_peer: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let bytes = bytes_of(send, "sendrecv_registered")?;
        let buf = slice::<u8>(send.ptr, bytes, stream);
        self.sendrecv_registered(&buf, send_peer, send_dst, recv_dst, recv_peer, stream)
    }

    /// [`Comm::all_to_all_registered`] of `send`, whose elements are `send.elem_size` bytes
    /// (1, 2, 4, 8 or 16).
    ///
    /// # Safety
    ///
    /// As [`Comm::send_registered_raw`].
    pub unsafe fn all_to_all_registered_raw(
        &self,
        send: RawBuffer,
        recv: RegisteredRange<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let len = usize::try_from(send.elems).map_err(|_| Error::InvalidArgument {
            op: "all_to_all_registered",
            reason: format!("{} elements do not fit this host", send.elems),
        })?;
        fn run<T: DeviceRepr>(
            c: &Comm,
            ptr: u64,
            len: usize,
            recv: RegisteredRange<'_>,
            s: &Arc<CudaStream>,
        ) -> Result<()> {
            c.all_to_all_registered(&slice::<T>(ptr, len, s), recv, s)
        }
        match send.elem_size {
            1 => run::<[u8; 1]>(self, send.ptr, len, recv, stream),
            2 => run::<[u8; 2]>(self, send.ptr, len, recv, stream),
            4 => run::<[u8; 4]>(self, send.ptr, len, recv, stream),
            8 => run::<[u8; 8]>(self, send.ptr, len, recv, stream),
            16 => run::<[u8; 16]>(self, send.ptr, len, recv, stream),
            size => Err(Error::InvalidArgument {
                op: "all_to_all_registered",
                reason: format!(
                    "element size {size}: the collectives take elements of 1, 2, 4, 8 or 16 \
                     bytes"
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_that_overflow_are_refused() {
        let ok = RawBuffer {
            ptr: 0x1000,
            elems: 3,
            elem_size: 4,
        };
        assert_eq!(bytes_of(ok, "send_registered").unwrap(), 12);
        let big = RawBuffer {
            ptr: 0x1000,
            elems: u64::MAX / 2,
            elem_size: 4,
        };
        let e = bytes_of(big, "send_registered").unwrap_err().to_string();
        assert!(e.contains("overflow"), "{e}");
    }
}
