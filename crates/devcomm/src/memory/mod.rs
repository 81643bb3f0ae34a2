//! Layer 4: symmetric allocations and registered user buffers.
//!
//! [`SymmetricMemory`]: every rank allocates the same number of bytes with `cuMemCreate`,
//! exports it as a POSIX fd, passes the fds to its NVLink peers over the bootstrap store's Unix
//! sockets, and maps the peers' memory into its own address space. A device table
//! `u64[world_size]` then holds each rank's memory as mapped here (0 without an NVLink path).
//!
//! [`Registration`]: the same for a buffer the user already owns (`cudaMalloc` memory through
//! CUDA IPC, VMM memory through `cuMemRetainAllocationHandle` and an fd).
//!
//! Setup is collective: every step ends with [`Group::agree`], so either every rank gets the
//! object or every rank gets the same error. Tear-down synchronises the device, waits for all
//! ranks, and unmaps peers' memory before its own.

mod pool;
mod pool_alloc;
mod registration;
mod registry;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use crate::cuda::vmm::{Mapping, PhysicalMemory};
use crate::cuda::{self, with_rank, DeviceBuffer};
use crate::error::{Error, Result};
use crate::group::Group;
use crate::topology::Topology;

pub(crate) use pool::Pool;
pub use pool::{PoolAllocator, PoolLocation, PoolUsage};
pub(crate) use registration::NetworkKey;
pub(crate) use registry::Registry;

/// Physical memory and its mapping in this process. Fields drop in order: the mapping
/// (unmap, free the range) before the physical memory (release).
#[derive(Debug)]
struct MappedMemory {
    mapping: Mapping,
    memory: PhysicalMemory,
}

impl MappedMemory {
    /// Maps `bytes` of `memory` (its full size for symmetric allocations).
    fn map(group: &Group, memory: PhysicalMemory, bytes: usize) -> Result<Self> {
        let mapping = Mapping::new(&group.ctx, &memory, bytes)?;
        Ok(Self { mapping, memory })
    }

    fn ptr(&self) -> u64 {
        self.mapping.ptr()
    }
}

/// One allocation of the same size on every rank, mapped into every NVLink peer.
pub(crate) struct SymmetricMemory {
    /// Unique tag of this allocation (its creation call); tear-down derives its barrier's tag
    /// from it. Dropping waits for every rank, so ranks must drop collective objects in the
    /// same order (a mismatch costs a setup timeout per object, logged, never a hang).
    tag: String,
    /// Bytes asked for.
    bytes: usize,
    /// Bytes allocated and mapped on every rank (rounded up to the granularity).
    capacity: usize,
    /// Each rank's memory as mapped here, by rank; 0 where there is no NVLink path.
    peer_ptrs: Vec<u64>,
    /// Device copy of `peer_ptrs`.
    table: DeviceBuffer,
    /// Peers' memory mapped here (dropped before `local`).
    peers: Vec<MappedMemory>,
    /// This rank's memory.
    local: MappedMemory,
    /// Last, so the communicator outlives everything above.
    group: Arc<Group>,
}

impl std::fmt::Debug for SymmetricMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricMemory")
            .field("rank", &self.group.rank)
            .field("tag", &self.tag)
            .field("bytes", &self.bytes)
            .field("capacity", &self.capacity)
            .field("peer_ptrs", &self.peer_ptrs)
            .finish()
    }
}

impl SymmetricMemory {
    /// Collective over all ranks: allocates `bytes` bytes (rounded up to the allocation
    /// granularity; 0 gets one granule) on every rank and maps each NVLink peer's allocation
    /// here. The memory is zeroed before the call returns on any rank.
    pub(crate) fn new(group: &Arc<Group>, bytes: usize) -> Result<Self> {
        let tag = group.next_tag("symm");
        let rank = group.rank;
        let at_rank = |e: Error| with_rank(e, rank);

        // (a) Create and map our own memory.
        let local = PhysicalMemory::create(&group.ctx, bytes).and_then(|memory| {
            let bytes = memory.bytes();
            MappedMemory::map(group, memory, bytes)
        });
        let local = group.agree("symmetric alloc: create", local.map_err(at_rank))?;
        let capacity = local.memory.bytes();

        // Every rank must have allocated the same size (same request, same granularity).
        let sizes = group.store.all_gather(
            &format!("{tag}/size"),
            &(capacity as u64).to_le_bytes(),
            group.setup_timeout,
        )?;
        check_same_size(&sizes, "SymmetricMemory::new")?;

        // (b) Export and exchange fds with the NVLink peers.
        let fd = group.agree(
            "symmetric alloc: export",
            local.memory.export_fd().map_err(at_rank),
        )?;
        let peers = fd_peers(&group.topology);
        let received = exchange(group, &format!("{tag}/fds"), &fd, &peers);
        let received = group.agree("symmetric alloc: exchange", received)?;
        drop(fd);

        // (c) Import and map each peer's memory.
        let imported = received
            .into_iter()
            .map(|(peer, fd)| {
                let memory = PhysicalMemory::import(&group.ctx, fd.as_fd(), capacity)?;
                // `fd` is closed here: the imported handle keeps the memory.
                Ok((peer, MappedMemory::map(group, memory, capacity)?))
            })
            .collect::<Result<Vec<_>>>();
        let imported = group.agree("symmetric alloc: import", imported.map_err(at_rank))?;

        // (d) Zero our memory, publish the table, and make sure both are complete before the
        // final agreement (after it, peers may write into our memory).
        let peer_ptrs = build_peer_table(
            group.world_size,
            rank,
            local.ptr(),
            imported.iter().map(|(peer, m)| (*peer, m.ptr())),
        );
        let table = zero_and_publish(group, local.ptr(), capacity, &peer_ptrs);
        let table = group.agree("symmetric alloc: publish", table.map_err(at_rank))?;

        Ok(Self {
            tag,
            bytes,
            capacity,
            peer_ptrs,
            table,
            peers: imported.into_iter().map(|(_, m)| m).collect(),
            local,
            group: group.clone(),
        })
    }

    /// This rank's memory.
    pub(crate) fn local_ptr(&self) -> u64 {
        self.local.ptr()
    }

    /// `peer`'s memory as mapped here; `Some(local_ptr)` for this rank, `None` for a peer
    /// without an NVLink path (or out of range).
    pub(crate) fn peer_ptr(&self, peer: usize) -> Option<u64> {
        self.peer_ptrs.get(peer).copied().filter(|&p| p != 0)
    }

    /// Device address of the `u64[world_size]` table of [`peer_ptr`](Self::peer_ptr)s
    /// (0 where there is no NVLink path).
    pub(crate) fn peer_table(&self) -> u64 {
        self.table.ptr()
    }

    /// Bytes asked for.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for SymmetricMemory {
    fn drop(&mut self) {
        // Our kernels are done with every mapping; then wait until every rank's are, so no
        // peer still writes into our memory. A dead peer makes the barrier time out (logged),
        // never hang: the physical memory stays valid while peers keep their imports anyway.
        teardown_barrier(&self.group, &self.tag);
        self.peers.clear();
        // `table`, then `local` (unmap, free range, release) drop after this.
    }
}

/// Synchronises this rank's device, then waits for every rank at `{tag}/free`, unless the
/// communicator has failed (its kernels have all given up; a dead peer would hold every
/// barrier for the setup timeout, and a communicator holds several). Errors are logged: this
/// runs in `Drop`.
fn teardown_barrier(group: &Group, tag: &str) {
    cuda::log_drop_error(
        "synchronising before unmapping",
        cuda::synchronize(&group.ctx),
    );
    let barrier = group.teardown_barrier(&format!("{tag}/free"));
    if let Err(e) = barrier {
        log::warn!(
            "devcomm: rank {}: tear-down barrier `{tag}` failed: {e}",
            group.rank
        );
    }
}

/// Ranks that exchange fds with this one: its NVLink peers and itself, sorted.
fn fd_peers(topology: &Topology) -> Vec<usize> {
    let mut peers = topology.nvl_peers();
    peers.push(topology.rank);
    peers.sort_unstable();
    peers.dedup();
    peers
}

/// `exchange_fds` among `peers`, checking that exactly the expected peers answered.
fn exchange(
    group: &Group,
    tag: &str,
    fd: &OwnedFd,
    peers: &[usize],
) -> Result<Vec<(usize, OwnedFd)>> {
    if peers.iter().all(|&p| p == group.rank) {
        // No NVLink peer: nothing to exchange and no one to wait for.
        return Ok(Vec::new());
    }
    let received = group
        .store
        .exchange_fds(tag, fd.as_fd(), peers, group.setup_timeout)?;
    let got: Vec<usize> = received.iter().map(|(r, _)| *r).collect();
    let expected: Vec<usize> = peers.iter().copied().filter(|&p| p != group.rank).collect();
    if got != expected {
        return Err(Error::InvalidArgument {
            op: "exchange_fds",
            reason: format!(
                "rank {}: expected fds from ranks {expected:?}, got {got:?}",
                group.rank
            ),
        });
    }
    Ok(received)
}

/// Checks that every rank reported the same little-endian `u64` size.
fn check_same_size(sizes: &[Vec<u8>], op: &'static str) -> Result<u64> {
    let parsed: Vec<Option<u64>> = sizes
        .iter()
        .map(|s| {
            <[u8; 8]>::try_from(s.as_slice())
                .ok()
                .map(u64::from_le_bytes)
        })
        .collect();
    match parsed.first() {
        Some(Some(first)) if parsed.iter().all(|s| *s == Some(*first)) => Ok(*first),
        _ => Err(Error::InvalidArgument {
            op,
            reason: format!(
                "ranks allocated different sizes (by rank, bytes): {}",
                parsed
                    .iter()
                    .map(|s| s.map_or_else(|| "?".to_owned(), |b| b.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// The peer table by rank: `local` for `rank`, the mapped address for each listed peer, 0
/// for everyone else.
fn build_peer_table(
    world_size: usize,
    rank: usize,
    local: u64,
    peers: impl IntoIterator<Item = (usize, u64)>,
) -> Vec<u64> {
    let mut table = vec![0u64; world_size];
    table[rank] = local;
    for (peer, ptr) in peers {
        table[peer] = ptr;
    }
    table
}

/// Zeroes `[ptr, ptr+bytes)`, uploads `table`, and waits until both are done.
fn zero_and_publish(group: &Group, ptr: u64, bytes: usize, table: &[u64]) -> Result<DeviceBuffer> {
    // SAFETY: `[ptr, ptr+bytes)` is our own freshly mapped allocation; no kernel uses it yet
    // (peers get to use it only after the final agreement of setup).
    unsafe { cuda::memset_zero(&group.ctx, ptr, bytes)? };
    let buf = DeviceBuffer::from_slice(&group.ctx, table)?;
    cuda::synchronize(&group.ctx)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{LinkKind, PeerDevice};

    #[test]
    fn peer_table_has_self_peers_and_zeros() {
        let table = build_peer_table(4, 1, 0x1000, [(0, 0x2000), (3, 0x3000)]);
        assert_eq!(table, vec![0x2000, 0x1000, 0, 0x3000]);
        assert_eq!(build_peer_table(1, 0, 0x10, []), vec![0x10]);
    }

    #[test]
    fn sizes_must_agree() {
        let same = vec![8u64.to_le_bytes().to_vec(); 3];
        assert_eq!(check_same_size(&same, "t").unwrap(), 8);
        let differ = vec![8u64.to_le_bytes().to_vec(), 16u64.to_le_bytes().to_vec()];
        let err = check_same_size(&differ, "t").unwrap_err().to_string();
        assert!(err.contains("8, 16"), "{err}");
        let garbled = vec![8u64.to_le_bytes().to_vec(), vec![1, 2]];
        assert!(check_same_size(&garbled, "t")
            .unwrap_err()
            .to_string()
            .contains("8, ?"));
        assert!(check_same_size(&[], "t").is_err());
    }

    fn topology(rank: usize, kinds: Vec<LinkKind>) -> Topology {
        let devices = (0..kinds.len())
            .map(|r| PeerDevice {
                rank: r,
                host: "h".into(),
                pci_bus_id: String::new(),
                uuid: String::new(),
                name: String::new(),
            })
            .collect();
        Topology {
            rank,
            kinds,
            devices,
            net_tuned: Vec::new(),
        }
    }

    #[test]
    fn fd_peers_are_nvl_peers_and_self() {
        use LinkKind::*;
        let t = topology(2, vec![Nvl, Net, SelfLink, Nvl, Shm]);
        assert_eq!(fd_peers(&t), vec![0, 2, 3]);
        let alone = topology(0, vec![SelfLink, Net]);
        assert_eq!(fd_peers(&alone), vec![0]);
    }
}
