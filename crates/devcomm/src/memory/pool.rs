//! The communicator's memory pool (docs/ARCHITECTURE.md, "The memory pool"): symmetric
//! segments that users allocate into, so that calls find peers' inputs and outputs already
//! mapped.
//!
//! A segment is grown collectively: every rank creates the same size with `cuMemCreate`, and
//! the segment becomes a [`Registration`](super::registration::Registration) in the
//! communicator's [`Registry`], which exports, exchanges and maps it into every NVLink peer
//! (and registers it with the network transport), so the registered-buffer zero-copy calls
//! take pool memory as they take any registration. Segments are never shrunk; they go with
//! the communicator. Allocation and free are local: the [`SubAllocator`] hands out
//! 256-byte-aligned slices, first fit in a fixed order, so ranks that allocate the same sizes
//! in the same order get the same offsets (the slices are then symmetric, as with PyTorch's
//! symmetric memory); nothing checks that, so a call that relies on it compares the offsets.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::pool_alloc::{locate, AllocError, FreeError, SubAllocator};
use super::{check_same_size, MappedMemory, NetworkKey, Registry};
use crate::cuda::vmm::PhysicalMemory;
use crate::cuda::{self, with_rank};
use crate::error::{Error, Result};
use crate::group::Group;

pub use super::pool_alloc::PoolUsage;

/// Where a range of pool memory lies: the answer of a lookup by address
/// ([`PoolAllocator::lookup`], `Comm::pool_lookup`) and of an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLocation {
    /// The segment's index (creation order, the same on every rank).
    pub segment: usize,
    /// Byte offset of the range in the segment. Peers' slices are at the same offset of their
    /// segment only when the ranks allocated in the same order: a call that relies on it
    /// compares the offsets across ranks.
    pub offset: u64,
    /// The segment on this rank.
    pub segment_base: u64,
    /// Bytes of the segment (the same on every rank).
    pub segment_bytes: u64,
    /// The segment's registration: the device address of its `RegisteredBuffer`
    /// (`cuda/devcomm/handles.cuh`), which kernels take to reach peers' segments, and the
    /// handle of the registered-buffer calls.
    pub device_handle: u64,
    /// Device address of the segment's `u64[world_size]` table of peers' segment bases as
    /// mapped here (0 without an NVLink path): what kernels index by peer.
    pub peer_table: u64,
    /// The same table on the host, by rank.
    pub peer_bases: Arc<[u64]>,
}

impl PoolLocation {
    /// The address of this range's offset in `peer`'s segment as mapped here (`peer` may be
    /// this rank), or `None` without an NVLink path (or out of range).
    pub fn peer_ptr(&self, peer: usize) -> Option<u64> {
        let base = self.peer_bases.get(peer).copied().filter(|&b| b != 0)?;
        Some(base + self.offset)
    }
}

/// One segment as the lookups see it.
#[derive(Debug, Clone)]
struct SegmentView {
    base: u64,
    bytes: u64,
    handle: u64,
    peer_table: u64,
    peer_bases: Arc<[u64]>,
}

#[derive(Debug, Default)]
struct State {
    alloc: SubAllocator,
    segments: Vec<SegmentView>,
    /// `(base, bytes)` of every segment, for [`locate`].
    bounds: Vec<(u64, u64)>,
    /// Set when the communicator tears the pool down: the memory is gone.
    closed: bool,
}

#[derive(Debug)]
struct Shared {
    rank: usize,
    state: Mutex<State>,
}

/// A handle on a communicator's pool for local allocation, free and lookup, with no borrow of
/// the communicator: what bindings keep (PyTorch's pluggable allocator calls into one). It
/// never owns memory: once the communicator is dropped its allocations fail and its lookups
/// find nothing.
#[derive(Debug, Clone)]
pub struct PoolAllocator {
    shared: Arc<Shared>,
}

impl PoolAllocator {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// Local: takes `bytes` (rounded up to 256; 0 takes one granule) from the first free range
    /// of the first segment that holds them. [`Error::PoolExhausted`] when none does (naming
    /// the request, the segments and the free bytes; nothing allocated). The caller frees the
    /// memory with [`free`](Self::free).
    pub fn alloc(&self, bytes: u64) -> Result<PoolLocation> {
        let rank = self.rank();
        let mut st = self.lock();
        if st.closed {
            return Err(torn_down("pool alloc", rank));
        }
        match st.alloc.alloc(bytes) {
            Ok(p) => Ok(location(&st.segments[p.segment], p.segment, p.offset)),
            Err(AllocError::Exhausted { requested, rounded }) => {
                let usage = st.alloc.usage();
                Err(Error::PoolExhausted {
                    rank,
                    requested,
                    rounded,
                    segments: usage.segments,
                    free: usage.free,
                    largest_free: usage.largest_free,
                })
            }
        }
    }

    /// Local: returns the allocation starting at `ptr` to the pool; its size. Anything else
    /// (an address freed already, never allocated here, or inside an allocation) is refused
    /// with [`Error::InvalidArgument`] naming it, nothing changed.
    ///
    /// # Safety
    ///
    /// No work may use the allocation after this call, and nothing may use it afterwards
    /// through its old address: the range may be handed out again at once.
    pub unsafe fn free(&self, ptr: u64) -> Result<u64> {
        let rank = self.rank();
        let mut st = self.lock();
        if st.closed {
            return Err(torn_down("pool free", rank));
        }
        let not_ours = |why: &str| Error::InvalidArgument {
            op: "pool free",
            reason: format!("rank {rank}: {ptr:#x} {why}"),
        };
        let (segment, offset) =
            locate(&st.bounds, ptr, 1).ok_or_else(|| not_ours("lies in no segment of the pool"))?;
        st.alloc.free(segment, offset).map_err(|e| match e {
            FreeError::NotAllocated { .. } | FreeError::NoSegment { .. } => not_ours(&format!(
                "(segment {segment}, offset {offset}) is not the start of a live allocation \
                 (freed already, or inside one)"
            )),
        })
    }

    /// Whether `[ptr, ptr+bytes)` lies inside one segment of the pool, and where: one lookup
    /// over the segments' bounds (allocated or not: a caller that needs the slice itself
    /// checks its own bounds).
    pub fn lookup(&self, ptr: u64, bytes: u64) -> Option<PoolLocation> {
        let st = self.lock();
        if st.closed {
            return None;
        }
        let (segment, offset) = locate(&st.bounds, ptr, bytes)?;
        Some(location(&st.segments[segment], segment, offset))
    }

    /// The live allocation starting at `ptr`: its (rounded) size, or `None`.
    pub fn allocation_bytes(&self, ptr: u64) -> Option<u64> {
        let st = self.lock();
        let (segment, offset) = locate(&st.bounds, ptr, 1)?;
        st.alloc.allocated(segment, offset)
    }

    /// The segments' sizes, free bytes and live allocations.
    pub fn usage(&self) -> PoolUsage {
        self.lock().alloc.usage()
    }
}

fn location(s: &SegmentView, segment: usize, offset: u64) -> PoolLocation {
    PoolLocation {
        segment,
        offset,
        segment_base: s.base,
        segment_bytes: s.bytes,
        device_handle: s.handle,
        peer_table: s.peer_table,
        peer_bases: s.peer_bases.clone(),
    }
}

fn torn_down(op: &'static str, rank: usize) -> Error {
    Error::InvalidArgument {
        op,
        reason: format!("rank {rank}: the communicator of this memory pool was dropped"),
    }
}

/// A segment's memory, owned by the pool; its registration lives in the registry.
#[derive(Debug)]
struct Segment {
    handle: u64,
    memory: MappedMemory,
}

/// The pool a communicator owns: its segments' memory and registrations, and the shared
/// bookkeeping its [`PoolAllocator`]s use.
#[derive(Debug)]
pub(crate) struct Pool {
    shared: Arc<Shared>,
    /// Segments in creation order; the lock also orders concurrent `grow` calls.
    segments: Mutex<Vec<Segment>>,
    registry: Arc<Registry>,
    group: Arc<Group>,
}

impl Pool {
    /// An empty pool (no segment: every allocation is refused until one is grown).
    pub(crate) fn new(group: &Arc<Group>, registry: Arc<Registry>) -> Self {
        Self {
            shared: Arc::new(Shared {
                rank: group.rank,
                state: Mutex::new(State::default()),
            }),
            segments: Mutex::new(Vec::new()),
            registry,
            group: group.clone(),
        }
    }

    pub(crate) fn allocator(&self) -> PoolAllocator {
        PoolAllocator {
            shared: self.shared.clone(),
        }
    }

    /// Collective over all ranks: adds a segment of `bytes` (rounded up to the allocation
    /// granularity, the same on every rank: checked), zeroed, registered in the registry
    /// (mapped into every NVLink peer; `network` registers it with the network transport,
    /// given its address and size), and returns its index. Every step ends with an
    /// agreement, so either every rank grows or every rank gets the same error.
    pub(crate) fn grow(
        &self,
        bytes: usize,
        network: impl FnOnce(u64, usize) -> Result<Option<NetworkKey>>,
    ) -> Result<usize> {
        let group = &self.group;
        let rank = group.rank;
        let at_rank = |e: Error| with_rank(e, rank);
        let mut segments = self.segments.lock().unwrap_or_else(PoisonError::into_inner);
        let tag = group.next_tag("pool");

        let args = match bytes {
            0 => Err(Error::InvalidArgument {
                op: "grow_pool",
                reason: format!("rank {rank}: a segment of 0 bytes"),
            }),
            _ => Ok(()),
        };
        group.agree("pool grow: arguments", args)?;
        let local = PhysicalMemory::create(&group.ctx, bytes).and_then(|memory| {
            let capacity = memory.bytes();
            MappedMemory::map(group, memory, capacity)
        });
        let local = group.agree("pool grow: create", local.map_err(at_rank))?;
        let capacity = local.memory.bytes();
        let sizes = group.store.all_gather(
            &format!("{tag}/size"),
            &(capacity as u64).to_le_bytes(),
            group.setup_timeout,
        )?;
        check_same_size(&sizes, "grow_pool")?;

        // Zeroed before any peer can map it (the registration's agreements come after), so a
        // fresh slice reads as zeros on every rank.
        let ptr = local.ptr();
        // SAFETY: `[ptr, ptr+capacity)` is our own freshly mapped segment; nothing uses it yet.
        let zeroed = unsafe { cuda::memset_zero(&group.ctx, ptr, capacity) }
            .and_then(|()| cuda::synchronize(&group.ctx));
        group.agree("pool grow: zero", zeroed.map_err(at_rank))?;

        let handle = self
            .registry
            .register(group, ptr, capacity, || network(ptr, capacity))?;
        let peer_bases: Arc<[u64]> = (0..group.world_size)
            .map(|p| self.registry.get_nvlink_address(handle, p).unwrap_or(0))
            .collect();
        let view = SegmentView {
            base: ptr,
            bytes: capacity as u64,
            handle,
            peer_table: self.registry.peer_table(handle).unwrap_or(0),
            peer_bases,
        };
        segments.push(Segment {
            handle,
            memory: local,
        });
        let mut st = self.allocator_state();
        let index = st.alloc.add_segment(capacity as u64);
        st.bounds.push((ptr, capacity as u64));
        st.segments.push(view);
        log::debug!("rank {rank}: memory pool segment {index}: {capacity} bytes at {ptr:#x}");
        Ok(index)
    }

    fn allocator_state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let live = {
            let mut st = self.allocator_state();
            st.closed = true;
            st.alloc.usage().allocations
        };
        let segments =
            std::mem::take(&mut *self.segments.lock().unwrap_or_else(PoisonError::into_inner));
        if live > 0 && !segments.is_empty() {
            log::warn!(
                "devcomm: rank {}: the memory pool goes with its communicator while {live} \
                 allocation(s) are live; their memory is unmapped",
                self.group.rank
            );
        }
        // Collective, in creation order (as every rank's): each segment's registration is
        // released on every rank before this rank unmaps its memory.
        for segment in segments {
            if let Err(e) = self.registry.deregister(&self.group, segment.handle) {
                log::warn!(
                    "devcomm: rank {}: releasing a memory pool segment ({:#x}, {} bytes): {e}",
                    self.group.rank,
                    segment.memory.ptr(),
                    segment.memory.memory.bytes()
                );
            }
            drop(segment.memory);
        }
    }
}
