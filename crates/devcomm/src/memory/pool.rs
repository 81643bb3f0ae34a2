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
//!
//! Memory the caller allocated can join the pool too ([`Pool::adopt`]): registered the same
//! way, found by the same lookups (so calls on it take the zero-copy paths), but never
//! allocated from, and released collectively by its owner ([`Pool::release_adopted`]). That
//! is how NCCL's window buffers (`ncclCommWindowRegister`) reach devcomm's zero-copy paths.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::pool_alloc::{locate, overlapping, AllocError, FreeError, SubAllocator};
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
    /// The sub-allocator's index of a grown segment; `None` for adopted memory, which
    /// nothing allocates from.
    alloc: Option<usize>,
}

#[derive(Debug, Default)]
struct State {
    alloc: SubAllocator,
    /// Grown and adopted segments, in creation order (the same on every rank).
    segments: Vec<SegmentView>,
    /// The segment of each of the sub-allocator's segments.
    allocated_in: Vec<usize>,
    /// `(base, bytes)` of every segment, for [`locate`]; `(0, 0)` once an adopted segment is
    /// released (no range lies in it).
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
            Ok(p) => {
                let segment = st.allocated_in[p.segment];
                Ok(location(&st.segments[segment], segment, p.offset))
            }
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
        let Some(index) = st.segments[segment].alloc else {
            return Err(not_ours(
                "lies in memory adopted into the pool (the caller's, never allocated from)",
            ));
        };
        st.alloc.free(index, offset).map_err(|e| match e {
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
        st.alloc.allocated(st.segments[segment].alloc?, offset)
    }

    /// The grown segments' sizes, free bytes and live allocations (adopted memory is not
    /// counted: nothing is allocated from it).
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

/// What the pool holds collectively: its grown segments (memory it owns) and the adopted
/// ones (the caller's memory: the segment's index and its registration).
#[derive(Debug, Default)]
struct Owned {
    grown: Vec<Segment>,
    adopted: Vec<(usize, u64)>,
}

/// The pool a communicator owns: its segments' memory and registrations, and the shared
/// bookkeeping its [`PoolAllocator`]s use.
#[derive(Debug)]
pub(crate) struct Pool {
    shared: Arc<Shared>,
    /// Segments in creation order; the lock also orders concurrent `grow` and `adopt` calls.
    segments: Mutex<Owned>,
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
            segments: Mutex::new(Owned::default()),
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
        segments.grown.push(Segment {
            handle,
            memory: local,
        });
        let view = self.view(handle, ptr, capacity as u64);
        let mut st = self.allocator_state();
        let index = st.segments.len();
        let alloc = st.alloc.add_segment(capacity as u64);
        st.allocated_in.push(index);
        st.bounds.push((ptr, capacity as u64));
        st.segments.push(SegmentView {
            alloc: Some(alloc),
            ..view
        });
        log::debug!("rank {rank}: memory pool segment {index}: {capacity} bytes at {ptr:#x}");
        Ok(index)
    }

    /// Collective over all ranks: adds `[ptr, ptr+bytes)`, device memory the caller allocated
    /// and keeps, as a segment that nothing allocates from but every lookup finds, registered
    /// like a grown segment (`network` as in [`grow`](Self::grow)); returns its index. Every
    /// rank adopts the same size (checked after the registration, which is then undone on
    /// every rank alike); memory that overlaps a segment of the pool is refused on every
    /// rank. The memory must stay allocated until [`release_adopted`](Self::release_adopted)
    /// (or the pool's end) has returned on every rank.
    pub(crate) fn adopt(
        &self,
        ptr: u64,
        bytes: usize,
        network: impl FnOnce(u64, usize) -> Result<Option<NetworkKey>>,
    ) -> Result<usize> {
        let group = &self.group;
        let rank = group.rank;
        let mut owned = self.segments.lock().unwrap_or_else(PoisonError::into_inner);
        let refused = |reason: String| Error::InvalidArgument {
            op: "pool_adopt",
            reason: format!("rank {rank}: {reason}"),
        };
        let args = match ptr.checked_add(bytes as u64) {
            _ if ptr == 0 || bytes == 0 => Err(refused(format!(
                "{bytes} bytes at {ptr:#x}: nothing to adopt"
            ))),
            None => Err(refused(format!("{bytes} bytes at {ptr:#x} overflow"))),
            Some(end) => match overlapping(&self.allocator_state().bounds, ptr, end) {
                Some(s) => Err(refused(format!(
                    "[{ptr:#x}, {end:#x}) overlaps segment {s} of the pool"
                ))),
                None => Ok(()),
            },
        };
        group.agree("pool adopt: arguments", args)?;
        let handle = self
            .registry
            .register(group, ptr, bytes, || network(ptr, bytes))?;
        // Every rank sees every rank's size, so every rank undoes a mismatch alike.
        let sizes = self.registry.sizes(handle).unwrap_or_default();
        if sizes.iter().any(|&s| s != bytes as u64) {
            self.registry.deregister(group, handle)?;
            return Err(Error::InvalidArgument {
                op: "pool_adopt",
                reason: format!(
                    "ranks adopt different sizes (by rank, bytes): {}",
                    sizes
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        let view = self.view(handle, ptr, bytes as u64);
        let mut st = self.allocator_state();
        let index = st.segments.len();
        st.bounds.push((ptr, bytes as u64));
        st.segments.push(view);
        owned.adopted.push((index, handle));
        log::debug!("rank {rank}: memory pool segment {index}: {bytes} bytes adopted at {ptr:#x}");
        Ok(index)
    }

    /// Collective over all ranks: removes the adopted segment `segment` from the pool (no
    /// lookup finds it from here on) and releases its registration on every rank
    /// ([`Registry::deregister`]: once it returns, no peer maps this rank's memory and the
    /// owner may free it). A segment that is not adopted memory of this pool is refused on
    /// every rank.
    pub(crate) fn release_adopted(&self, segment: usize) -> Result<()> {
        let group = &self.group;
        let mut owned = self.segments.lock().unwrap_or_else(PoisonError::into_inner);
        let at = owned.adopted.iter().position(|&(s, _)| s == segment);
        let args = at.ok_or_else(|| Error::InvalidArgument {
            op: "pool_release",
            reason: format!(
                "rank {}: segment {segment} is not adopted memory of this pool (released \
                 already, or a grown segment, which goes with the communicator)",
                group.rank
            ),
        });
        let at = group.agree("pool release: arguments", args)?;
        let (_, handle) = owned.adopted.remove(at);
        self.allocator_state().bounds[segment] = (0, 0);
        self.registry.deregister(group, handle)
    }

    /// The lookups' view of a registered segment (not allocated from until the caller says).
    fn view(&self, handle: u64, base: u64, bytes: u64) -> SegmentView {
        SegmentView {
            base,
            bytes,
            handle,
            peer_table: self.registry.peer_table(handle).unwrap_or(0),
            peer_bases: (0..self.group.world_size)
                .map(|p| self.registry.get_nvlink_address(handle, p).unwrap_or(0))
                .collect(),
            alloc: None,
        }
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
        let Owned {
            grown: segments,
            adopted,
        } = std::mem::take(&mut *self.segments.lock().unwrap_or_else(PoisonError::into_inner));
        // Collective, in creation order (as every rank's): adopted memory's registrations
        // first (the memory is the caller's), then the grown segments'.
        for (index, handle) in adopted {
            if let Err(e) = self.registry.deregister(&self.group, handle) {
                log::warn!(
                    "devcomm: rank {}: releasing adopted memory (pool segment {index}): {e}",
                    self.group.rank
                );
            }
        }
        if live > 0 && !segments.is_empty() {
            log::warn!(
                "devcomm: rank {}: the memory pool goes with its communicator while {live} \
                 allocation(s) are live; their memory is unmapped",
                self.group.rank
            );
        }
        // Each grown segment's registration is released on every rank before this rank
        // unmaps its memory.
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
