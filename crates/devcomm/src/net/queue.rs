//! Descriptor queues between a producer (a GPU kernel, or a host thread standing in for one)
//! and the proxy thread, one per (peer, channel), in host memory both can reach.
//!
//! Each queue is a single-producer single-consumer ring of `capacity` fixed-size
//! [`NetDescriptor`]s behind a [`NetQueueHeader`]:
//! - the producer owns `head` (descriptors written). It may write position `p` only while
//!   `p < tail + capacity` (a *credit*); otherwise it waits, bounded, and on timeout records
//!   `QUEUE_FULL` in the abort record. It writes the descriptor's fields, then publishes the
//!   entry by storing `seq = p + 1` with release ordering.
//! - the proxy owns `tail` (descriptors consumed) and `done` (the sequence number of the last
//!   flush whose operations completed). It takes entry `tail % capacity` once its `seq` is
//!   `tail + 1` (acquire), copies it out and stores `tail + 1` (release): the entry is free.
//!
//! The structs are in `abi/net.rs`; the C++ twin of the producer is `cuda/devcomm/net.cuh`.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::record::{op, ErrorSink};
use crate::abi::net::{NetDescriptor, NetOp, NetQueueHeader, NetQueuesHandle};
use crate::error::net::{NetError, Result};
use crate::handles::ErrorRecord;

/// Bytes of one queue with `capacity` entries.
pub(crate) fn queue_stride(capacity: u32) -> u64 {
    (std::mem::size_of::<NetQueueHeader>() + capacity as usize * 64) as u64
}

/// The queues of one communicator in host memory (page-aligned, zeroed).
#[derive(Debug)]
pub struct QueueMemory {
    ptr: *mut u8,
    /// `Some` when this value allocated the memory (and frees it).
    owned: Option<Layout>,
    /// The memory's address as producers use it (the device address of host-mapped memory).
    producer_base: u64,
    capacity: u32,
    channels: u32,
    world_size: u32,
}

// SAFETY: the memory is owned by this value (or, borrowed, kept alive by the caller of
// `borrowed`); the producer and proxy access the shared words only atomically and an entry
// only while they own it (the protocol in the module doc).
unsafe impl Send for QueueMemory {}
// SAFETY: as above.
unsafe impl Sync for QueueMemory {}

/// Bytes needed for `world_size * channels` queues of `capacity` entries; refuses shapes
/// outside capacity 1..=65536, channels 1..=64, world size 1..=65536 (pure).
pub(crate) fn queue_bytes(world_size: u32, channels: u32, capacity: u32) -> Result<usize> {
    if !(1..=1 << 16).contains(&capacity)
        || !(1..=64).contains(&channels)
        || !(1..=1 << 16).contains(&world_size)
    {
        return Err(NetError::InvalidArgument {
            op: "network queues",
            reason: format!(
                "capacity {capacity} (1..=65536), channels {channels} (1..=64), world size \
                 {world_size} (1..=65536)"
            ),
        });
    }
    Ok(queue_stride(capacity) as usize * world_size as usize * channels as usize)
}

impl QueueMemory {
    /// Allocates `world_size * channels` queues of `capacity` entries in ordinary host memory
    /// (for host producers; a GPU producer needs host-mapped pinned memory: see
    /// [`borrowed`](Self::borrowed)).
    pub(crate) fn new(world_size: u32, channels: u32, capacity: u32) -> Result<Self> {
        let bytes = queue_bytes(world_size, channels, capacity)?;
        let layout =
            Layout::from_size_align(bytes, 4096).map_err(|e| NetError::InvalidArgument {
                op: "network queues",
                reason: e.to_string(),
            })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Ok(Self {
            ptr,
            owned: Some(layout),
            producer_base: ptr as u64,
            capacity,
            channels,
            world_size,
        })
    }

    /// Lays the queues out in memory the caller owns, e.g. pinned host memory mapped into a
    /// GPU (`cuMemHostAlloc` with `DEVICEMAP`), whose device address is `producer_base`.
    /// Zeroes the first [`queue_bytes`] bytes.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `bytes` bytes, 128-byte aligned, and stay allocated
    /// (and untouched by anything but producers and this transport) until the value is dropped.
    pub(crate) unsafe fn borrowed(
        ptr: *mut u8,
        bytes: usize,
        producer_base: u64,
        world_size: u32,
        channels: u32,
        capacity: u32,
    ) -> Result<Self> {
        let needed = queue_bytes(world_size, channels, capacity)?;
        if bytes < needed || ptr.is_null() || ptr as usize % 128 != 0 {
            return Err(NetError::InvalidArgument {
                op: "network queues",
                reason: format!(
                    "{bytes} bytes at {ptr:p} for {needed} bytes of queues (128-byte aligned)"
                ),
            });
        }
        // SAFETY: valid for `bytes >= needed` bytes (caller's contract).
        unsafe { std::ptr::write_bytes(ptr, 0, needed) };
        Ok(Self {
            ptr,
            owned: None,
            producer_base,
            capacity,
            channels,
            world_size,
        })
    }

    /// The handle for producers (addresses as producers use them).
    pub(crate) fn handle(&self, rank: u32, error_state: u64, timeout: Duration) -> NetQueuesHandle {
        NetQueuesHandle {
            base: self.producer_base,
            stride: queue_stride(self.capacity),
            capacity: self.capacity,
            channels: self.channels,
            world_size: self.world_size,
            rank,
            error_state,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Ranks the queues are laid out for.
    pub(crate) fn world_size(&self) -> u32 {
        self.world_size
    }

    /// Queues per peer.
    pub(crate) fn channels(&self) -> u32 {
        self.channels
    }

    /// Entries per queue.
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The queue of (`peer`, `channel`).
    pub fn queue(&self, peer: usize, channel: usize) -> Result<QueueRef> {
        if peer >= self.world_size as usize || channel >= self.channels as usize {
            return Err(NetError::InvalidArgument {
                op: "network queue",
                reason: format!(
                    "peer {peer} / channel {channel} outside {} ranks x {} channels",
                    self.world_size, self.channels
                ),
            });
        }
        let index = peer * self.channels as usize + channel;
        // SAFETY: index < world_size * channels, so the offset is inside the allocation.
        let header = unsafe { self.ptr.add(index * queue_stride(self.capacity) as usize) };
        Ok(QueueRef {
            header,
            capacity: self.capacity as u64,
            peer,
            channel,
        })
    }
}

impl Drop for QueueMemory {
    fn drop(&mut self) {
        if let Some(layout) = self.owned {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { dealloc(self.ptr, layout) };
        }
    }
}

/// One queue: raw access for the producer and the proxy. Valid while its [`QueueMemory`] is.
#[derive(Debug, Clone, Copy)]
pub struct QueueRef {
    header: *mut u8,
    capacity: u64,
    /// The peer the queue's operations go to.
    pub(crate) peer: usize,
    /// The channel.
    pub(crate) channel: usize,
}

// SAFETY: see QueueMemory; the owner keeps the memory alive while the proxy runs.
unsafe impl Send for QueueRef {}

impl QueueRef {
    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offset is one of the header's u64 fields (8-byte aligned inside a
        // page-aligned allocation); the words are only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.header.add(offset).cast()) }
    }

    fn entry(&self, position: u64) -> *mut NetDescriptor {
        let slot = (position % self.capacity) as usize;
        // SAFETY: slot < capacity: inside this queue's entries.
        unsafe { self.header.add(128 + slot * 64).cast() }
    }

    /// Descriptors consumed by the proxy.
    pub(crate) fn tail(&self) -> u64 {
        self.word(64).load(Ordering::Acquire)
    }

    /// The last completed flush.
    fn done(&self) -> u64 {
        self.word(72).load(Ordering::Acquire)
    }

    /// Proxy: the next descriptor, if the producer has published it (copied out; the entry
    /// stays owned until [`consume`](Self::consume)).
    pub(crate) fn peek(&self) -> Option<NetDescriptor> {
        let tail = self.word(64).load(Ordering::Relaxed);
        let entry = self.entry(tail);
        // SAFETY: `seq` is the entry's last u64; the producer stores it atomically.
        let seq = unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*entry).seq)) };
        if seq.load(Ordering::Acquire) != tail + 1 {
            return None;
        }
        // SAFETY: the acquire above made the producer's field stores visible; the producer
        // does not touch the entry again until `tail` passes it.
        Some(unsafe { std::ptr::read_volatile(entry) })
    }

    /// Proxy: frees the entry returned by the last `peek` (a credit for the producer).
    pub(crate) fn consume(&self) {
        let tail = self.word(64).load(Ordering::Relaxed);
        self.word(64).store(tail + 1, Ordering::Release);
    }

    /// Proxy: publishes that the flush `seq` completed.
    pub(crate) fn complete_flush(&self, seq: u64) {
        self.word(72).store(seq, Ordering::Release);
    }

    /// Producer (host twin of `net_enqueue` in `net.cuh`): writes `desc` at the next position,
    /// waiting at most `timeout` for a credit. On timeout it records `QUEUE_FULL` in `sink`
    /// (raising abort) and returns the error. Returns the descriptor's `seq`.
    pub fn enqueue(
        &self,
        mut desc: NetDescriptor,
        rank: usize,
        sink: &ErrorSink,
        timeout: Duration,
    ) -> Result<u64> {
        let head = self.word(0).load(Ordering::Relaxed);
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let tail = self.tail();
            if head < tail + self.capacity {
                break;
            }
            if sink.aborted() {
                return Err(sink.check(rank).err().unwrap_or(NetError::Aborted {
                    rank: rank as i32,
                    reason: "aborted".to_owned(),
                }));
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                sink.record(ErrorRecord {
                    op: op::QUEUE_FULL,
                    rank: rank as i32,
                    peer: self.peer as i32,
                    slot: self.channel as u64,
                    expected: head + 1 - self.capacity,
                    seen: tail,
                    elapsed_ns: elapsed.as_nanos() as u64,
                    ..ErrorRecord::default()
                });
                return Err(sink.check(rank).unwrap_err());
            }
            backoff(&mut spins);
        }
        desc.seq = head + 1;
        let entry = self.entry(head);
        // SAFETY: position `head` is below tail + capacity, so the proxy has consumed the
        // entry's previous use and does not read it until `seq` says so.
        unsafe {
            std::ptr::write_volatile(entry, NetDescriptor { seq: 0, ..desc });
            AtomicU64::from_ptr(std::ptr::addr_of_mut!((*entry).seq))
                .store(head + 1, Ordering::Release);
        }
        self.word(0).store(head + 1, Ordering::Relaxed);
        Ok(head + 1)
    }

    /// Producer: enqueues a flush and waits (bounded) until the proxy completed it and every
    /// operation before it. On timeout records `FLUSH_TIMEOUT`.
    pub fn flush(&self, rank: usize, sink: &ErrorSink, timeout: Duration) -> Result<()> {
        let desc = NetDescriptor {
            op: NetOp::Flush as u32,
            ..NetDescriptor::default()
        };
        let seq = self.enqueue(desc, rank, sink, timeout)?;
        let start = Instant::now();
        let mut spins = 0u32;
        while self.done() < seq {
            if sink.aborted() {
                return Err(sink.check(rank).unwrap_err());
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                sink.record(ErrorRecord {
                    op: op::FLUSH_TIMEOUT,
                    rank: rank as i32,
                    peer: self.peer as i32,
                    slot: self.channel as u64,
                    expected: seq,
                    seen: self.done(),
                    elapsed_ns: elapsed.as_nanos() as u64,
                    ..ErrorRecord::default()
                });
                return Err(sink.check(rank).unwrap_err());
            }
            backoff(&mut spins);
        }
        Ok(())
    }
}

/// Spin a little, then yield, then sleep: host waits share two cores with the proxies.
pub(crate) fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    match *spins {
        0..=64 => std::hint::spin_loop(),
        65..=256 => std::thread::yield_now(),
        _ => std::thread::sleep(Duration::from_micros(50)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handles::DeviceErrorState;

    #[test]
    fn ring_wraps_and_credits_bound_the_producer() {
        let mem = QueueMemory::new(2, 1, 4).unwrap();
        let q = mem.queue(1, 0).unwrap();
        let mut state = Box::new(DeviceErrorState::default());
        // SAFETY: the box outlives the sink.
        let sink = unsafe { ErrorSink::new(&mut *state) };
        let t = Duration::from_millis(50);
        for i in 0..4u64 {
            let d = NetDescriptor {
                op: 1,
                bytes: i,
                ..Default::default()
            };
            assert_eq!(q.enqueue(d, 0, &sink, t).unwrap(), i + 1);
        }
        // Full: the fifth waits for a credit and gives up, naming peer and channel.
        let err = q
            .enqueue(NetDescriptor::default(), 0, &sink, t)
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("peer 1") && msg.contains("stayed full"),
            "{msg}"
        );
        assert!(sink.aborted());
        // The proxy side sees them in order.
        for i in 0..4u64 {
            let d = q.peek().expect("published");
            assert_eq!((d.bytes, d.seq), (i, i + 1));
            q.consume();
        }
        assert!(q.peek().is_none());
        assert_eq!(q.tail(), 4);
    }

    #[test]
    fn borrowed_memory_is_checked_and_zeroed() {
        let need = queue_bytes(2, 1, 4).unwrap();
        assert_eq!(need, 2 * (128 + 4 * 64));
        let mut buf = vec![0xAAu64; need / 8 + 16];
        let base = buf.as_mut_ptr().cast::<u8>();
        let aligned = base.wrapping_add(base.align_offset(128));
        // SAFETY: `buf` has 128 spare bytes for the alignment and outlives `mem`.
        let mem = unsafe { QueueMemory::borrowed(aligned, need, 0x1000, 2, 1, 4) }.unwrap();
        assert_eq!(mem.handle(0, 0, Duration::from_secs(1)).base, 0x1000);
        assert_eq!(mem.queue(1, 0).unwrap().tail(), 0);
        // SAFETY: as above (refused: too small).
        assert!(unsafe { QueueMemory::borrowed(aligned, need - 1, 0, 2, 1, 4) }.is_err());
        let misaligned = aligned.wrapping_add(8);
        // SAFETY: as above.
        let refused = unsafe { QueueMemory::borrowed(misaligned, need, 0, 2, 1, 4) };
        assert!(refused.is_err());
        drop(mem);
        drop(buf);
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(QueueMemory::new(2, 0, 4).is_err());
        assert!(QueueMemory::new(2, 1, 0).is_err());
        let mem = QueueMemory::new(2, 2, 4).unwrap();
        assert!(mem.queue(2, 0).is_err() && mem.queue(0, 2).is_err());
    }
}
