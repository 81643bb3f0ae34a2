//! Registration of buffers the user already owns, so kernels of every NVLink peer can reach
//! them through a [`RegisteredBuffer`] handle.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::{exchange, fd_peers, MappedMemory};
use crate::cuda::ipc::{IpcHandle, IpcMapping, IPC_HANDLE_BYTES};
use crate::cuda::vmm::PhysicalMemory;
use crate::cuda::{self, pointer, with_rank, DeviceBuffer};
use crate::error::{Error, Result};
use crate::group::Group;
use crate::handles::{DevicePeerTable, RegisteredBuffer};

/// How a rank shares its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// VMM memory: the backing allocation travels as an fd and peers map all of it.
    Vmm = 1,
    /// `cuMemAlloc` memory: a legacy IPC handle of the allocation's base.
    Ipc = 2,
}

/// What one rank tells the others about its buffer (all-gathered).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ExportInfo {
    backend: Backend,
    /// Offset of the buffer from the start of the shared allocation (or mapping).
    offset: u64,
    /// Bytes of the shared allocation (VMM: of the mapping; peers map that much).
    alloc_bytes: u64,
    /// Bytes the rank registered (what a peer may write into).
    bytes: u64,
    /// The IPC handle (zero for VMM).
    ipc: [u8; IPC_HANDLE_BYTES],
}

const INFO_BYTES: usize = 1 + 8 + 8 + 8 + IPC_HANDLE_BYTES;

impl ExportInfo {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(INFO_BYTES);
        out.push(self.backend as u8);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.alloc_bytes.to_le_bytes());
        out.extend_from_slice(&self.bytes.to_le_bytes());
        out.extend_from_slice(&self.ipc);
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != INFO_BYTES {
            return None;
        }
        let backend = match bytes[0] {
            1 => Backend::Vmm,
            2 => Backend::Ipc,
            _ => return None,
        };
        let word = |at: usize| bytes[at..at + 8].try_into().ok().map(u64::from_le_bytes);
        Some(Self {
            backend,
            offset: word(1)?,
            alloc_bytes: word(9)?,
            bytes: word(17)?,
            ipc: bytes[25..].try_into().ok()?,
        })
    }
}

/// A peer's buffer opened here.
#[derive(Debug)]
enum PeerMapping {
    Vmm(MappedMemory),
    Ipc(IpcMapping),
}

impl PeerMapping {
    /// Where the peer's shared allocation (or mapping) starts in this process.
    fn base(&self) -> u64 {
        match self {
            Self::Vmm(m) => m.ptr(),
            Self::Ipc(m) => m.ptr(),
        }
    }
}

/// A registration's key with the network transport (`RegisteredBuffer::lkey`) and what
/// releases it (collectively) when dropped; made by the communicator's layer.
pub(crate) struct NetworkKey {
    /// The key, the same on every rank; never 0.
    pub(crate) lkey: u32,
    /// Dropped when the registration closes, before its NVLink mappings.
    pub(crate) _release: Box<dyn std::any::Any + Send + Sync>,
}

/// A user buffer made reachable from every NVLink peer's kernels (and, with a
/// [`NetworkKey`], from network peers' puts).
///
/// [`handle`](Self::handle) is the device address of a [`RegisteredBuffer`] whose
/// `backend_window` points to a [`DevicePeerTable`]. Dropping it (or
/// [`Registry::deregister`](super::Registry::deregister)) is collective: it waits until every rank has closed its mappings
/// of this rank's buffer, after which the user may free the buffer.
pub(crate) struct Registration {
    tag: String,
    ptr: u64,
    bytes: usize,
    /// The buffer as mapped here, by rank; 0 without an NVLink path.
    peer_ptrs: Vec<u64>,
    /// Bytes each rank registered.
    peer_bytes: Vec<u64>,
    /// `RegisteredBuffer` (the handle), `DevicePeerTable`, and the `u64[world_size]` table.
    handle: DeviceBuffer,
    _peer_table: DeviceBuffer,
    table: DeviceBuffer,
    mappings: Vec<PeerMapping>,
    /// The network registration, if any (released first).
    network: Option<NetworkKey>,
    closed: bool,
    /// Last, so the communicator outlives everything above.
    group: Arc<Group>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("rank", &self.group.rank)
            .field("tag", &self.tag)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .field("handle", &format_args!("{:#x}", self.handle.ptr()))
            .field("peer_ptrs", &self.peer_ptrs)
            .field("lkey", &self.network.as_ref().map(|n| n.lkey))
            .finish()
    }
}

impl Registration {
    /// Collective over all ranks: registers `bytes` bytes at device address `ptr` (each rank
    /// its own buffer). `cudaMalloc`/`cuMemAlloc` memory is shared through CUDA IPC; VMM memory
    /// must have been created with the POSIX-fd handle type. Other memory (e.g. stream-ordered
    /// pool allocations) is refused with [`Error::InvalidArgument`] on every rank.
    ///
    /// `network` runs on every rank once the peers' buffers are mapped (collective): the
    /// registration with the network transport, whose key goes into the handle's `lkey`.
    pub(crate) fn register(
        group: &Arc<Group>,
        ptr: u64,
        bytes: usize,
        network: impl FnOnce() -> Result<Option<NetworkKey>>,
    ) -> Result<Self> {
        let tag = group.next_tag("reg");
        let rank = group.rank;
        let at_rank = |e: Error| with_rank(e, rank);

        let local = inspect(group, ptr, bytes).map_err(at_rank);
        let (info, fd) = group.agree("register: inspect", local)?;

        let blobs =
            group
                .store
                .all_gather(&format!("{tag}/info"), &info.encode(), group.setup_timeout)?;
        let infos = decode_all(&blobs)?;

        // Fds travel only if some rank shares VMM memory; the others send a placeholder so the
        // exchange stays collective. Every rank sees the same `infos`, so all decide alike.
        let peers = fd_peers(&group.topology);
        let mut fds: HashMap<usize, OwnedFd> = HashMap::new();
        if infos.iter().any(|i| i.backend == Backend::Vmm) {
            let sent = match fd {
                Some(fd) => Ok(fd),
                None => placeholder_fd(),
            };
            let received = sent.and_then(|fd| exchange(group, &format!("{tag}/fds"), &fd, &peers));
            fds = group
                .agree("register: exchange", received)?
                .into_iter()
                .collect();
        }

        let opened = peers
            .iter()
            .filter(|&&p| p != rank)
            .map(|&p| open_peer(group, p, &infos[p], fds.remove(&p)).map(|m| (p, m)))
            .collect::<Result<Vec<_>>>();
        let opened = group.agree("register: import", opened.map_err(at_rank))?;

        let peer_ptrs = super::build_peer_table(
            group.world_size,
            rank,
            ptr,
            opened
                .iter()
                .map(|(p, m)| (*p, m.base() + infos[*p].offset)),
        );
        let network = network()?;
        let lkey = network.as_ref().map_or(0, |n| n.lkey);
        let published = publish(group, ptr, bytes, &peer_ptrs, lkey);
        let (handle, peer_table, table) =
            group.agree("register: publish", published.map_err(at_rank))?;

        Ok(Self {
            tag,
            ptr,
            bytes,
            peer_ptrs,
            peer_bytes: infos.iter().map(|i| i.bytes).collect(),
            handle,
            _peer_table: peer_table,
            table,
            mappings: opened.into_iter().map(|(_, m)| m).collect(),
            network,
            closed: false,
            group: group.clone(),
        })
    }

    /// Device address of the [`RegisteredBuffer`]: the value kernels receive and
    /// [`Registry::deregister`](super::Registry::deregister) takes back.
    pub(crate) fn handle(&self) -> u64 {
        self.handle.ptr()
    }

    /// `peer`'s buffer as mapped here (this rank's own for `peer == rank`), or `None` without
    /// an NVLink path.
    pub(crate) fn get_nvlink_address(&self, peer: usize) -> Option<u64> {
        self.peer_ptrs.get(peer).copied().filter(|&p| p != 0)
    }

    /// Device address of the `u64[world_size]` table of the buffer as mapped here, by rank
    /// (0 without an NVLink path): what kernels index by peer.
    pub(crate) fn peer_table(&self) -> u64 {
        self.table.ptr()
    }

    /// Bytes `peer` registered in this registration.
    pub(crate) fn peer_bytes(&self, peer: usize) -> Option<u64> {
        self.peer_bytes.get(peer).copied()
    }

    /// Bytes every rank registered in this registration, by rank.
    pub(super) fn sizes(&self) -> &[u64] {
        &self.peer_bytes
    }

    /// This rank's release, which waits for no peer: waits for this device's work, closes
    /// peers' buffers here and the network key, and marks the release in the store (the
    /// arrival at the registration's tear-down step). Peers keep this rank's buffer mapped
    /// until they release their own, so the buffer must stay allocated until every rank has
    /// released ([`wait_released`](Self::wait_released) tells when). Runs once.
    pub(super) fn close(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        let synced = cuda::synchronize(&self.group.ctx).map_err(|e| with_rank(e, self.group.rank));
        self.network = None;
        self.mappings.clear();
        // A failed communicator marks its failure instead (Group::teardown_arrive).
        let arrived = self.group.teardown_arrive(&self.free_tag());
        synced?;
        arrived?;
        Ok(())
    }

    /// After [`close`](Self::close): waits until every rank has released this registration
    /// (dropped or released it), so that no peer maps this rank's buffer any more; an error
    /// naming the ranks that did not within the setup timeout.
    pub(super) fn wait_released(&self) -> Result<()> {
        self.group.teardown_wait(&self.free_tag())
    }

    /// The tear-down step of this registration: its creation tag, the same on every rank.
    fn free_tag(&self) -> String {
        format!("{}/free", self.tag)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.closed {
            if let Err(e) = self.close() {
                log::warn!(
                    "devcomm: rank {}: releasing registration {}: {e}",
                    self.group.rank,
                    self.tag
                );
            }
        }
    }
}

/// Works out how this rank shares `[ptr, ptr+bytes)`, and exports it.
fn inspect(group: &Group, ptr: u64, bytes: usize) -> Result<(ExportInfo, Option<OwnedFd>)> {
    let ctx = &group.ctx;
    let invalid = |reason: String| Error::InvalidArgument {
        op: "register",
        reason,
    };
    if bytes == 0 {
        return Err(invalid(format!(
            "rank {}: zero-byte buffer at {ptr:#x}",
            group.rank
        )));
    }
    let ordinal = pointer::device_ordinal(ctx, ptr)?;
    if usize::try_from(ordinal).ok() != Some(ctx.ordinal()) {
        return Err(invalid(format!(
            "rank {}: buffer {ptr:#x} is on device {ordinal}, this rank uses device {}",
            group.rank,
            ctx.ordinal()
        )));
    }
    if pointer::is_vmm(ctx, ptr)? {
        let (base, size) = pointer::mapping_range(ctx, ptr)?;
        check_within(ptr, bytes, base, size)
            .map_err(|r| invalid(format!("rank {}: {r}", group.rank)))?;
        let memory = PhysicalMemory::retain(ctx, ptr, size)?.ok_or_else(|| {
            invalid(format!(
                "rank {}: {ptr:#x} stopped being VMM memory",
                group.rank
            ))
        })?;
        let fd = memory.export_fd().map_err(|e| {
            invalid(format!(
                "rank {}: VMM buffer {ptr:#x} cannot be exported as a POSIX fd (create it with \
                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR): {e}",
                group.rank
            ))
        })?;
        // `memory` (our extra reference) is released here; the user's mapping keeps the
        // allocation and the fd keeps it importable.
        let info = ExportInfo {
            backend: Backend::Vmm,
            offset: ptr - base,
            alloc_bytes: size as u64,
            bytes: bytes as u64,
            ipc: [0; IPC_HANDLE_BYTES],
        };
        Ok((info, Some(fd)))
    } else if pointer::is_legacy_ipc_capable(ctx, ptr)? {
        let (base, size) = pointer::allocation_range(ctx, ptr)?;
        check_within(ptr, bytes, base, size)
            .map_err(|r| invalid(format!("rank {}: {r}", group.rank)))?;
        let handle = IpcHandle::get(ctx, base)?;
        let info = ExportInfo {
            backend: Backend::Ipc,
            offset: ptr - base,
            alloc_bytes: size as u64,
            bytes: bytes as u64,
            ipc: *handle.as_bytes(),
        };
        Ok((info, None))
    } else {
        Err(invalid(format!(
            "rank {}: buffer {ptr:#x} is neither VMM memory nor legacy-IPC capable \
             (stream-ordered pool allocations cannot be registered)",
            group.rank
        )))
    }
}

/// Checks that `[ptr, ptr+bytes)` lies inside `[base, base+size)`.
fn check_within(ptr: u64, bytes: usize, base: u64, size: usize) -> Result<(), String> {
    let end = ptr.checked_add(bytes as u64);
    let alloc_end = base.checked_add(size as u64);
    match (end, alloc_end) {
        (Some(end), Some(alloc_end)) if ptr >= base && end <= alloc_end => Ok(()),
        _ => Err(format!(
            "buffer [{ptr:#x}, +{bytes}) is not inside one allocation [{base:#x}, +{size})"
        )),
    }
}

/// Decodes every rank's [`ExportInfo`]; the same verdict on every rank.
fn decode_all(blobs: &[Vec<u8>]) -> Result<Vec<ExportInfo>> {
    blobs
        .iter()
        .enumerate()
        .map(|(r, b)| {
            ExportInfo::decode(b).ok_or_else(|| Error::InvalidArgument {
                op: "register",
                reason: format!(
                    "rank {r} sent a malformed registration record ({} bytes)",
                    b.len()
                ),
            })
        })
        .collect()
}

/// An fd to send when this rank has none of its own (`/dev/null`).
fn placeholder_fd() -> Result<OwnedFd> {
    let file = std::fs::File::open("/dev/null").map_err(|source| Error::Io {
        context: "opening /dev/null".to_owned(),
        source,
    })?;
    Ok(file.into())
}

/// Opens `peer`'s shared allocation here (the buffer is at `base() + info.offset`).
fn open_peer(
    group: &Group,
    peer: usize,
    info: &ExportInfo,
    fd: Option<OwnedFd>,
) -> Result<PeerMapping> {
    match info.backend {
        Backend::Vmm => {
            let fd = fd.ok_or_else(|| Error::InvalidArgument {
                op: "register",
                reason: format!("rank {}: no fd arrived from VMM peer {peer}", group.rank),
            })?;
            let bytes = usize::try_from(info.alloc_bytes).unwrap_or(usize::MAX);
            let memory = PhysicalMemory::import(&group.ctx, fd.as_fd(), bytes)?;
            Ok(PeerMapping::Vmm(MappedMemory::map(group, memory, bytes)?))
        }
        Backend::Ipc => {
            let handle = IpcHandle::from_bytes(&info.ipc)?;
            Ok(PeerMapping::Ipc(IpcHandle::open(&group.ctx, &handle)?))
        }
    }
}

/// Uploads the peer table, the `DevicePeerTable` and the `RegisteredBuffer`, and waits until
/// the copies are complete. Returns `(handle, peer_table, table)`.
fn publish(
    group: &Group,
    ptr: u64,
    bytes: usize,
    peer_ptrs: &[u64],
    lkey: u32,
) -> Result<(DeviceBuffer, DeviceBuffer, DeviceBuffer)> {
    let table = DeviceBuffer::from_slice(&group.ctx, peer_ptrs)?;
    let peer_table = DevicePeerTable {
        peer_base: table.ptr(),
        rank: i32::try_from(group.rank).unwrap_or(i32::MAX),
        world_size: i32::try_from(group.world_size).unwrap_or(i32::MAX),
    };
    let peer_table = DeviceBuffer::from_slice(&group.ctx, &[peer_table])?;
    let handle = RegisteredBuffer {
        base_ptr: ptr,
        size: bytes as u64,
        backend_window: peer_table.ptr(),
        lkey,
        reserved: 0,
    };
    let handle = DeviceBuffer::from_slice(&group.ctx, &[handle])?;
    cuda::synchronize(&group.ctx)?;
    Ok((handle, peer_table, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_info_round_trips() {
        let mut ipc = [0u8; IPC_HANDLE_BYTES];
        ipc.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        for info in [
            ExportInfo {
                backend: Backend::Ipc,
                offset: 4096,
                alloc_bytes: 1 << 30,
                bytes: 12345,
                ipc,
            },
            ExportInfo {
                backend: Backend::Vmm,
                offset: 0,
                alloc_bytes: 2 << 20,
                bytes: 2 << 20,
                ipc: [0; IPC_HANDLE_BYTES],
            },
        ] {
            let bytes = info.encode();
            assert_eq!(bytes.len(), INFO_BYTES);
            assert_eq!(ExportInfo::decode(&bytes), Some(info));
        }
        let mut bad = ExportInfo {
            backend: Backend::Ipc,
            offset: 0,
            alloc_bytes: 1,
            bytes: 1,
            ipc,
        }
        .encode();
        assert_eq!(ExportInfo::decode(&bad[..INFO_BYTES - 1]), None);
        bad[0] = 7;
        assert_eq!(ExportInfo::decode(&bad), None);
        let err = decode_all(&[bad]).unwrap_err().to_string();
        assert!(err.contains("rank 0"), "{err}");
    }

    #[test]
    fn buffers_must_lie_inside_the_allocation() {
        assert!(check_within(0x1000, 0x100, 0x1000, 0x100).is_ok());
        assert!(check_within(0x1080, 0x80, 0x1000, 0x100).is_ok());
        assert!(check_within(0x1080, 0x81, 0x1000, 0x100).is_err());
        assert!(check_within(0xfff, 0x10, 0x1000, 0x100).is_err());
        assert!(check_within(u64::MAX - 4, 16, 0, usize::MAX).is_err());
    }
}
