//! A ring all-gather composed from `Comm::sendrecv`, as a user would write one: the
//! `sendrecv_ring_gather` check runs it to test ring schedules of send/recv over every route
//! (NVLink, network, or both side by side), and the collective mismatch check sets it
//! against a collective.

use std::sync::Arc;

use cudarc::driver::{CudaStream, CudaViewMut, DevicePtr, DeviceRepr};
use devcomm::{Comm, Error};

/// Gathers every rank's `send` into `recv` (world size x `send`'s length), in rank order:
/// this rank's block is copied on `stream`, then `world_size - 1` calls of `Comm::sendrecv`,
/// step `s` forwarding to the next rank the block received from the previous one at step
/// `s - 1`. A length that does not fit is refused before anything is launched.
pub(crate) fn ring_gather<T: DeviceRepr, S: DevicePtr<T>>(
    comm: &Comm,
    send: &S,
    recv: &mut CudaViewMut<'_, T>,
    stream: &Arc<CudaStream>,
) -> devcomm::Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let n = send.len();
    if recv.len() != n * world {
        return Err(Error::InvalidArgument {
            op: "ring_gather",
            reason: format!(
                "recv holds {} elements; world size {world} x {n} are needed",
                recv.len()
            ),
        });
    }
    stream
        .memcpy_dtod(send, &mut recv.slice_mut(rank * n..(rank + 1) * n))
        .map_err(|source| Error::Cuda {
            rank: rank as i32,
            call: "cuMemcpyDtoDAsync",
            source,
        })?;
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    for step in 0..world.saturating_sub(1) {
        let out = (rank + world - step) % world;
        let into = (rank + world - step - 1) % world;
        // The two blocks differ: split the buffer between them for one shared and one
        // exclusive view.
        let (mut low, mut high) = recv.split_at_mut(out.max(into) * n);
        if out < into {
            let block = low.slice(out * n..(out + 1) * n);
            comm.sendrecv(&block, next, &mut high.slice_mut(..n), prev, stream)?;
        } else {
            let block = high.slice(..n);
            let mut dst = low.slice_mut(into * n..(into + 1) * n);
            comm.sendrecv(&block, next, &mut dst, prev, stream)?;
        }
    }
    Ok(())
}
