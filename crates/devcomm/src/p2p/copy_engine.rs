//! The host side of the copy-engine protocol (docs/PROTOCOL.md, "Copy engine"): the copy
//! streams' waits, copies and signal writes of pushed and pulled chunks.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream};

use super::P2P;
use crate::abi::P2PSide;
use crate::abi::{ce_pulled, CE_DONE, CE_DONE_R, CE_GO, CE_GO_R, CE_SLOTS, CE_WORDS};
use crate::cuda::{launch_struct, linear_launch, InternalStream};
use crate::error::{Error, Result};
use crate::group::Group;

impl P2P {
    /// The copy streams' part of a copy-engine send of `s`: pushed chunk k (even slot i = k %
    /// CE_SLOTS) goes to copy stream i / 2, which waits for GO[i] >= k + 1 (set by the pacer
    /// once the slot is free), copies the chunk into the peer's inbox slot, then writes DONE[i]
    /// = k + 1 (after a memory barrier); at the end each stream puts the GO word of its slot
    /// back to 0 for the next call (the pacer, which sets them, is done with them by then).
    /// Pulled chunks (odd slots) are the sender kernel's and the receiver's copy stream's.
    pub(super) fn enqueue_copies(
        &self,
        group: &Group,
        s: P2PSide,
        copy: &[InternalStream; 2],
    ) -> Result<()> {
        let (rank, world, peer) = (group.rank, group.world_size, s.peer as usize);
        let word = |w: usize| self.ce_word(world, peer, w);
        let remote =
            self.peer_window(group, "send", peer)? + rank as u64 * self.limits.region_bytes();
        let ctx = |e: Error| crate::cuda::with_rank(e, rank);
        let streams = self.switches.ce_streams.clamp(1, 2);
        for (k, i, off, len) in self.ce_chunks(s, false) {
            let c = &copy[(i / 2) % streams];
            crate::cuda::stream_wait_geq(c, word(CE_GO + i), k + 1).map_err(ctx)?;
            let to = remote + self.limits.ce_slot_offset(i);
            crate::cuda::memcpy_dtod_async(to, s.buf + off, len, c).map_err(ctx)?;
            crate::cuda::stream_write(c, word(CE_DONE + i), k + 1).map_err(ctx)?;
        }
        for i in (0..CE_SLOTS as usize).step_by(2) {
            crate::cuda::stream_write(&copy[(i / 2) % streams], word(CE_GO + i), 0).map_err(ctx)?;
        }
        Ok(())
    }

    /// The receiver's copy stream for a copy-engine receive of `r`: pulled chunk k (odd slot
    /// i) waits for GOR[i] >= k + 1 (set by the receiver's pacer once the sender announced it
    /// and it matches this call), copies the chunk from the sender's outbox slot straight into
    /// the destination, then writes DONER[i] = k + 1; at the end GOR goes back to 0.
    pub(super) fn enqueue_pulls(
        &self,
        group: &Group,
        r: P2PSide,
        pull: &InternalStream,
    ) -> Result<()> {
        let (rank, world, peer) = (group.rank, group.world_size, r.peer as usize);
        let word = |w: usize| self.ce_word(world, peer, w);
        let outbox =
            self.peer_window(group, "recv", peer)? + self.limits.outbox_offset(world, rank);
        let ctx = |e: Error| crate::cuda::with_rank(e, rank);
        for (k, i, off, len) in self.ce_chunks(r, true) {
            crate::cuda::stream_wait_geq(pull, word(CE_GO_R + i), k + 1).map_err(ctx)?;
            let from = outbox + self.limits.ce_slot_offset(i);
            crate::cuda::memcpy_dtod_async(r.buf + off, from, len, pull).map_err(ctx)?;
            crate::cuda::stream_write(pull, word(CE_DONE_R + i), k + 1).map_err(ctx)?;
        }
        for i in (1..CE_SLOTS as usize).step_by(2) {
            crate::cuda::stream_write(pull, word(CE_GO_R + i), 0).map_err(ctx)?;
        }
        Ok(())
    }

    /// Where `peer`'s p2p window is mapped here (an error naming `op` if it is not).
    pub(super) fn peer_window(&self, group: &Group, op: &'static str, peer: usize) -> Result<u64> {
        self.window
            .get_nvlink_address(peer)
            .ok_or_else(|| Error::NoPath {
                op,
                rank: group.rank,
                peer,
                kind: "no NVLink mapping".into(),
            })
    }

    /// The chunks of a copy-engine message `s` on one path (pushed into the inbox or pulled
    /// from the outbox): (chunk index, slot, byte offset, bytes).
    fn ce_chunks(
        &self,
        s: P2PSide,
        pulled: bool,
    ) -> impl Iterator<Item = (u64, usize, u64, usize)> {
        let chunks = s.bytes.div_ceil(s.chunk_bytes);
        (0..chunks).filter_map(move |k| {
            let i = (k % CE_SLOTS) as usize;
            let off = k * s.chunk_bytes;
            let len = (s.bytes - off).min(s.chunk_bytes) as usize;
            (ce_pulled(i) == pulled).then_some((k, i, off, len))
        })
    }

    /// Device address of copy-engine word `w` of `peer`'s block in this rank's signal pad.
    pub(super) fn ce_word(&self, world: usize, peer: usize, w: usize) -> u64 {
        let own = self.window.device_handle();
        own.signals + 8 * (world + self.limits.ce_slot0(world) + peer * CE_WORDS + w) as u64
    }
}

/// Launches `func(args)` as one block of one warp on `stream` (the copy-engine pacers).
///
/// # Safety
///
/// `func` must take exactly one parameter of type `A` by value, and everything it touches
/// through `args` must stay valid until the kernel has finished.
pub(super) unsafe fn launch_one_warp<A: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    func: &CudaFunction,
    args: &A,
    pdl: bool,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    // SAFETY: the caller's contract above; the pacers enter through
    // enter_after_previous_kernel.
    unsafe { launch_struct(stream, func, linear_launch(1, 32), args, pdl) }
}
