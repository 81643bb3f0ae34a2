//! Raw forms of the communicator's operations for bindings (the Python package) that hold
//! device addresses, run-time element sizes and a borrowed stream instead of cudarc slices, and
//! the move of the send/recv namespace from one stream to another.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{Comm, HookArgs};
pub use crate::collective::RawHooks;
use crate::collective::{CollCall, MODE_DEVICE_COUNTS};
use crate::error::{CudaResultExt, Error, Result};

/// A device buffer by address: `elems` elements of `elem_size` bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBuffer {
    /// Device address (of this rank's context).
    pub ptr: u64,
    /// Elements.
    pub elems: u64,
    /// Bytes per element.
    pub elem_size: usize,
}

/// Device addresses of an all-to-all-v's counts, each `u64[world_size]` in rows (see
/// [`crate::AllToAllVCounts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawCounts {
    /// Read: rows for each peer.
    pub send_counts: u64,
    /// Read: first row for each peer; 0 packs them in rank order.
    pub send_offsets: u64,
    /// Written: rows received from each peer.
    pub recv_counts: u64,
    /// Written: first row of each peer's data in the receive buffer.
    pub recv_offsets: u64,
}

/// The copy hooks for elements of `size` bytes (1, 2, 4, 8 or 16).
pub fn copy_hooks(size: usize) -> Result<RawHooks> {
    check_size(size)?;
    Ok(RawHooks::copy_of_size(size))
}

/// User hooks (`name`, the struct in `source`) for input and output elements of run-time
/// sizes (1, 2, 4, 8 or 16 bytes): the form of [`crate::Hooks::new`] for callers that know
/// the element types only at run time. The struct's `In` and `Out` must be of these sizes
/// (checked when the kernel compiles), and the buffers of each call are checked against them.
pub fn hooks_with_sizes(
    name: &str,
    source: &str,
    in_size: usize,
    out_size: usize,
) -> Result<RawHooks> {
    check_size(in_size)?;
    check_size(out_size)?;
    Ok(RawHooks::build(
        name.to_string().into(),
        source.to_string().into(),
        in_size,
        out_size,
    ))
}

fn check_size(size: usize) -> Result<()> {
    match size {
        1 | 2 | 4 | 8 | 16 => Ok(()),
        _ => Err(unsupported_size(size)),
    }
}

fn unsupported_size(size: usize) -> Error {
    Error::InvalidArgument {
        op: "Hooks",
        reason: format!(
            "element size {size}: the collectives take elements of 1, 2, 4, 8 or 16 bytes"
        ),
    }
}

/// Whether `stream` is capturing a CUDA graph now.
fn capturing(stream: &CudaStream, rank: i32) -> Result<bool> {
    crate::cuda::graph::is_capturing(stream).map_err(|e| crate::cuda::with_rank(e, rank as usize))
}

impl Comm {
    /// [`Comm::all_to_all_hooked`] on device addresses.
    ///
    /// # Safety
    ///
    /// `send` must be readable and `recv` writable for their `elems` elements of `elem_size`
    /// bytes (device memory of this rank's context) until the work enqueued on `stream` has
    /// finished, and nothing else may write `recv` meanwhile.
    pub unsafe fn all_to_all_raw(
        &self,
        hooks: &RawHooks,
        send: RawBuffer,
        recv: RawBuffer,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        hooks.check_sizes("all_to_all", Some(send.elem_size), Some(recv.elem_size))?;
        self.all_to_all_at(
            hooks,
            (send.ptr, send.elems),
            (recv.ptr, recv.elems),
            args,
            stream,
        )
    }

    /// [`Comm::all_to_all_v_hooked`] on device addresses: the counts stay on the GPU.
    ///
    /// # Safety
    ///
    /// As [`Comm::all_to_all_raw`] for `send` and `recv`; each non-zero address of `counts`
    /// must hold `world_size` `u64`s (`recv_counts` and `recv_offsets` writable) until the work
    /// on `stream` has finished.
    pub unsafe fn all_to_all_v_raw(
        &self,
        hooks: &RawHooks,
        send: RawBuffer,
        recv: RawBuffer,
        counts: RawCounts,
        args: HookArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const OP: &str = "all_to_all_v";
        hooks.check_sizes(OP, Some(send.elem_size), Some(recv.elem_size))?;
        let missing = [
            ("send_counts", counts.send_counts),
            ("recv_counts", counts.recv_counts),
            ("recv_offsets", counts.recv_offsets),
        ]
        .into_iter()
        .find(|(_, p)| *p == 0);
        if let Some((name, _)) = missing {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("{name} is a null address"),
            });
        }
        let call = CollCall {
            op: OP,
            input: send.ptr,
            output: recv.ptr,
            in_elems: send.elems,
            out_elems: recv.elems,
            row_len: args.cols(),
            rows: 0,
            send_counts: counts.send_counts,
            send_offsets: counts.send_offsets,
            recv_counts: counts.recv_counts,
            recv_offsets: counts.recv_offsets,
            user: args.user,
            mode: MODE_DEVICE_COUNTS,
            peer_rows: [[0; 32]; 2],
            code: 0,
        };
        self.launch_collective(hooks, call, stream)
    }

    /// The raw address of the stream this communicator's send/recv namespace is bound to
    /// (`None` before the first operation).
    pub fn bound_stream(&self) -> Option<usize> {
        self.p2p.bound_stream.lock().ok().and_then(|b| *b)
    }

    /// Moves the send/recv namespace from the stream it is bound to, `from`, to `to`, so that
    /// operations on `to` are accepted from now on and operations on `from` refused. Nothing to
    /// do when `to` is already bound; with nothing bound yet, `to` is bound.
    ///
    /// Why this is safe: the namespace's counters live on the device and every kernel advances
    /// them in stream order; two streams may not run kernels of one namespace at once, since
    /// their steps would interleave. This call makes `to` wait for an event recorded on `from`
    /// after the last work enqueued there (the namespace's last kernel among it), so every
    /// kernel enqueued on `to` afterwards starts after `from`'s last kernel has finished:
    /// the two streams' kernels of the namespace stay in one order, the order of the calls,
    /// which is also the order the peers issue theirs.
    ///
    /// CUDA graphs: a stream that is capturing records work that runs only when the graph is
    /// launched, so when `to` is capturing no wait is enqueued (a non-captured event cannot be
    /// waited on in a capture); the caller must launch the graph in stream order after the
    /// namespace's other work (PyTorch synchronises the device before a capture begins, and a
    /// replay on the stream that runs the eager calls is ordered with them). When `from` is
    /// still capturing, the move is refused: work on `to` now would run before the captured
    /// kernels that precede it in call order.
    ///
    /// # Safety
    ///
    /// `from` and `to` must be live streams of this communicator's context, and `from` must be
    /// the stream bound now (checked by address).
    pub unsafe fn rebind_stream(&self, from: &Arc<CudaStream>, to: &Arc<CudaStream>) -> Result<()> {
        let rank = self.rank() as i32;
        let mut bound = self.p2p.bound_stream.lock().map_err(|_| Error::Aborted {
            rank,
            reason: "a thread panicked during send/recv".into(),
        })?;
        let (old, new) = (from.cu_stream() as usize, to.cu_stream() as usize);
        match *bound {
            Some(b) if b == new => return Ok(()),
            None => {
                *bound = Some(new);
                return Ok(());
            }
            Some(b) if b != old => {
                return Err(Error::InvalidArgument {
                    op: "rebind_stream",
                    reason: format!(
                        "the send/recv namespace is bound to stream {b:#x}, not {old:#x}"
                    ),
                })
            }
            Some(_) => {}
        }
        if capturing(from, rank)? {
            return Err(Error::InvalidArgument {
                op: "rebind_stream",
                reason: format!(
                    "stream {old:#x} is capturing a CUDA graph that holds this communicator's \
                     work; operations on stream {new:#x} before the capture ends would run \
                     before the captured kernels that precede them"
                ),
            });
        }
        if !capturing(to, rank)? {
            let event = self
                .context()
                .new_event(None)
                .cuda(rank, "cuEventCreate (rebind_stream)")?;
            event
                .record(from)
                .cuda(rank, "cuEventRecord (rebind_stream)")?;
            to.wait(&event)
                .cuda(rank, "cuStreamWaitEvent (rebind_stream)")?;
        }
        *bound = Some(new);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_time_sizes_pick_the_same_hooks_as_static_types() {
        let copy = copy_hooks(4).unwrap();
        let typed_copy = crate::Hooks::<f32>::copy();
        assert_eq!(copy.name(), typed_copy.name());
        assert_eq!(copy.spec(false).source, typed_copy.raw().spec(false).source);
        assert_eq!(copy.key(), typed_copy.raw().key());
        let h = hooks_with_sizes("Fp8", "struct Fp8 {};", 4, 1).unwrap();
        let typed = crate::Hooks::<f32, u8>::new("Fp8", "struct Fp8 {};");
        assert_eq!(h.spec(true).source, typed.raw().spec(true).source);
        assert_eq!(h.key(), typed.raw().key());
        h.check_sizes("test", Some(4), Some(1)).unwrap();
        assert!(h.check_sizes("test", Some(2), Some(1)).is_err());
    }

    #[test]
    fn sizes_the_collectives_do_not_take_are_refused() {
        for size in [0, 3, 6, 32] {
            assert!(copy_hooks(size).is_err());
            let e = hooks_with_sizes("H", "", size, 4).unwrap_err().to_string();
            assert!(e.contains(&format!("element size {size}")), "{e}");
            assert!(hooks_with_sizes("H", "", 4, size).is_err());
        }
    }
}
