//! The memory pool of [`Comm`] (docs/ARCHITECTURE.md, "The memory pool"): grown collectively,
//! allocated from locally, recognised by address.

use super::{Comm, RegisteredRange};
use crate::error::{Error, Result};
use crate::memory::{PoolAllocator, PoolLocation, PoolUsage};

/// A slice of the communicator's memory pool ([`Comm::alloc`]), freed when it drops.
///
/// Its memory is mapped into every NVLink peer as part of its segment, so the registered-buffer
/// calls take it without a registration of its own ([`PoolSlice::range`]). Peers' slices lie
/// at the same offset of their segment only when the ranks allocated (and freed) the same
/// sizes in the same order; [`PoolSlice::offset`] lets a caller check that.
///
/// Dropping it synchronises the device first (work may still use the memory, and the pool
/// hands the range out again at once), so drop it outside graph capture; a binding that
/// tracks the memory's uses itself takes it over with [`PoolSlice::into_raw`].
pub struct PoolSlice<'c> {
    comm: &'c Comm,
    location: PoolLocation,
    bytes: u64,
    freed: bool,
}

impl std::fmt::Debug for PoolSlice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolSlice")
            .field("rank", &self.comm.rank())
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("bytes", &self.bytes)
            .field("segment", &self.location.segment)
            .field("offset", &self.location.offset)
            .finish()
    }
}

impl<'c> PoolSlice<'c> {
    /// The slice on this rank (256-byte aligned).
    pub fn ptr(&self) -> u64 {
        self.location.segment_base + self.location.offset
    }

    /// Bytes asked for (the pool reserves them rounded up to 256).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The slice's segment (creation order, the same on every rank).
    pub fn segment(&self) -> usize {
        self.location.segment
    }

    /// Byte offset of the slice in its segment.
    pub fn offset(&self) -> u64 {
        self.location.offset
    }

    /// Where the slice lies: segment, offset, the segment's device handle and peer tables.
    pub fn location(&self) -> &PoolLocation {
        &self.location
    }

    /// The address of this slice's offset in `peer`'s segment as mapped here (this rank's own
    /// slice for `peer == rank`), or `None` without an NVLink path. It is `peer`'s slice only
    /// when the ranks allocated in the same order.
    pub fn peer_ptr(&self, peer: usize) -> Option<u64> {
        self.location.peer_ptr(peer)
    }

    /// The range `[offset, offset + bytes)` of this slice in its segment's registration, for
    /// [`Comm::send_registered`], [`Comm::recv_registered`] and the other registered-buffer
    /// calls; [`Error::InvalidArgument`] when it does not lie inside the slice. A sender's
    /// range addresses the receiver's segment at the same offset.
    pub fn range(&self, offset: u64, bytes: u64) -> Result<RegisteredRange<'_>> {
        let inside = offset
            .checked_add(bytes)
            .is_some_and(|end| end <= self.bytes);
        if !inside {
            return Err(Error::InvalidArgument {
                op: "PoolSlice::range",
                reason: format!(
                    "rank {}: [{offset}, +{bytes}) does not lie inside the pool slice of {} \
                     bytes at {:#x}",
                    self.comm.rank(),
                    self.bytes,
                    self.ptr()
                ),
            });
        }
        Ok(RegisteredRange::of_handle(
            self.location.device_handle,
            self.location.offset + offset,
            bytes,
        ))
    }

    /// The whole slice as a registered range.
    pub fn whole(&self) -> RegisteredRange<'_> {
        RegisteredRange::of_handle(
            self.location.device_handle,
            self.location.offset,
            self.bytes,
        )
    }

    /// Gives the memory up without freeing it; returns its address, which
    /// [`PoolAllocator::free`] takes back.
    pub fn into_raw(mut self) -> u64 {
        self.freed = true;
        self.ptr()
    }
}

impl Drop for PoolSlice<'_> {
    fn drop(&mut self) {
        if self.freed {
            return;
        }
        crate::cuda::log_drop_error(
            "synchronising before freeing a pool slice",
            crate::cuda::synchronize(&self.comm.group.ctx),
        );
        // SAFETY: the slice owned the allocation (it came from `alloc` and was not given up);
        // the device is idle, and the borrow of the slice ends here.
        if let Err(e) = unsafe { self.comm.pool.allocator().free(self.ptr()) } {
            log::warn!("devcomm: rank {}: {e}", self.comm.rank());
        }
    }
}

impl Comm {
    /// Collective: adds a segment of at least `bytes` to the memory pool (rounded up to the
    /// allocation granularity, the same on every rank), zeroed, mapped into every NVLink peer
    /// and registered like [`Comm::register`]'s buffers; returns its index. Every rank calls
    /// it with the same size, in the same order as the other collective setup calls. The pool
    /// never shrinks: segments go with the communicator (collectively, first thing when it
    /// drops). `DEVCOMM_POOL_MIB` grows a first segment when the communicator is built.
    pub fn grow_pool(&self, bytes: usize) -> Result<usize> {
        self.pool
            .grow(bytes, |ptr, bytes| self.network_key(ptr, bytes))
    }

    /// Collective: adds `[ptr, ptr + bytes)`, device memory of this rank's GPU that the caller
    /// allocated (`cuMemAlloc`, or `cuMemCreate` with a shareable handle, as `ncclMemAlloc`
    /// does), to the memory pool as a segment that nothing allocates from; returns its index.
    /// Calls on addresses inside it take the zero-copy paths as pool memory does (peers read
    /// and write it in place), with the same results bit for bit. Every rank adopts the same
    /// size, at the same point among the collective setup calls; a mismatch, memory that
    /// overlaps the pool, or memory that cannot be shared fails on every rank alike, nothing
    /// adopted. This is how NCCL's window registration reaches devcomm (docs/NCCL.md).
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + bytes)` must stay allocated until [`Comm::pool_release`] of the returned
    /// segment (or the communicator's drop) has returned on every rank: peers write into it.
    pub unsafe fn pool_adopt(&self, ptr: u64, bytes: usize) -> Result<usize> {
        self.pool
            .adopt(ptr, bytes, |ptr, bytes| self.network_key(ptr, bytes))
    }

    /// Collective: removes the adopted segment `segment` ([`Comm::pool_adopt`]) from the
    /// pool; once it returns no peer maps this rank's memory and the caller may free it. A
    /// segment that is not adopted memory is refused on every rank.
    pub fn pool_release(&self, segment: usize) -> Result<()> {
        self.pool.release_adopted(segment)
    }

    /// The pool's allocator: local allocation, free and lookup without a borrow of the
    /// communicator (for bindings; [`Comm::alloc`] is the typed form).
    pub fn pool(&self) -> PoolAllocator {
        self.pool.allocator()
    }

    /// Local (no communication): `bytes` of the memory pool, 256-byte aligned, freed when the
    /// slice drops. [`Error::PoolExhausted`] names the request, the segments and the free
    /// bytes when no segment has room; nothing is allocated then.
    pub fn alloc(&self, bytes: u64) -> Result<PoolSlice<'_>> {
        let location = self.pool.allocator().alloc(bytes)?;
        Ok(PoolSlice {
            comm: self,
            location,
            bytes,
            freed: false,
        })
    }

    /// Whether `[ptr, ptr+bytes)` of this rank lies inside one segment of the memory pool, and
    /// where (segment, offset, the segment's device handle and peers' bases): the one lookup a
    /// call makes to take its zero-copy path for pool memory.
    pub fn pool_lookup(&self, ptr: u64, bytes: u64) -> Option<PoolLocation> {
        self.pool.allocator().lookup(ptr, bytes)
    }

    /// The memory pool's segment sizes, free bytes and live allocations.
    pub fn pool_usage(&self) -> PoolUsage {
        self.pool.allocator().usage()
    }

    /// The registered range of pool memory `[ptr, ptr+bytes)` of this rank, for the
    /// registered-buffer calls ([`Comm::send_registered`], [`Comm::recv_registered`],
    /// [`Comm::all_to_all_registered`]), or `None` when it lies in no single segment. A
    /// sender's range addresses the receiver's segment at the same offset: symmetric only when
    /// the ranks allocated in the same order.
    pub fn registered_range_of(&self, ptr: u64, bytes: u64) -> Option<RegisteredRange<'_>> {
        let at = self.pool_lookup(ptr, bytes)?;
        Some(RegisteredRange::of_handle(
            at.device_handle,
            at.offset,
            bytes,
        ))
    }
}
