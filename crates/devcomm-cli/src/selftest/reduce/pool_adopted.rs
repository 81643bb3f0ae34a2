//! `devcomm selftest` check of memory the caller allocated and adopted into the pool
//! (`Comm::pool_adopt`, as the NCCL-compatible library adopts windows): lookups, refusals,
//! the zero-copy cases of `reduce_pool` on it, release.

use devcomm::ReduceOp;
use half::bf16;

use super::pool_cases::{pool_cases_of, Arena};
use crate::selftest::harness::Ctx;

type Check = Result<String, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Memory the caller allocated (`cuMemAlloc`, as NCCL windows of `cudaMalloc` memory are)
/// adopted into the pool: found by lookups, never allocated from or freed by the pool; the
/// zero-copy paths on it bitwise equal to the host reference and to ordinary buffers (f32 sum
/// and max, bf16 sum, every collective and arrangement as `reduce_pool`); overlapping memory
/// and ranks adopting different sizes refused on every rank; released collectively, after
/// which lookups miss it and a second release is refused.
pub(super) fn check_pool_adopted(cx: &Ctx) -> Check {
    let comm = &cx.comm;
    let w = comm.world_size();
    let bytes = (2 * w * (4 << 20) + (1 << 20)).next_multiple_of(1 << 20);
    let memory = devcomm::testing::DeviceBuffer::zeroed(comm.context(), bytes).map_err(err)?;
    devcomm::testing::synchronize(comm.context()).map_err(err)?;
    let base = memory.ptr();
    // SAFETY: `memory` is `bytes` bytes, released below (or by the communicator's drop,
    // before `memory` is freed at the end of this function on the error paths too: the
    // release is collective and the check's communicator outlives it).
    let segment = unsafe { comm.pool_adopt(base, bytes) }.map_err(err)?;
    let released = std::cell::Cell::new(false);
    let result = (|| -> Check {
        let at = comm
            .pool_lookup(base + 4096, 256)
            .ok_or("adopted memory is not found by a lookup")?;
        if at.segment != segment || at.offset != 4096 {
            return Err(format!("lookup: {at:?}, expected segment {segment} at 4096"));
        }
        // SAFETY: the address is refused (it is adopted memory, never allocated from).
        if unsafe { comm.pool().free(base) }.is_ok() {
            return Err("the pool freed adopted memory".into());
        }
        if comm.pool_usage().segments.len() > segment + 1 {
            return Err("adopted memory counted as an allocatable segment".into());
        }
        // Overlapping memory: refused on every rank.
        // SAFETY: nothing is adopted (refused); the range lies in `memory`.
        // (The argument agreement reports each rank's refusal.)
        match unsafe { comm.pool_adopt(base + 4096, 8192) } {
            Err(e) if e.to_string().contains("overlaps segment") => {}
            other => return Err(format!("overlapping memory: {other:?}, expected a refusal")),
        }
        // Different sizes: refused on every rank (rank 0 adopts 256 bytes less).
        let second = devcomm::testing::DeviceBuffer::zeroed(comm.context(), 1 << 20).map_err(err)?;
        devcomm::testing::synchronize(comm.context()).map_err(err)?;
        let size = (1 << 20) - if comm.rank() == 0 { 256 } else { 0 };
        // SAFETY: `second` holds `size` bytes and outlives the (undone) registration.
        match unsafe { comm.pool_adopt(second.ptr(), size) } {
            Err(e) if e.to_string().contains("different sizes") => {}
            other => return Err(format!("different sizes: {other:?}, expected a refusal")),
        }
        drop(second);
        let arena = Arena {
            base,
            bytes: bytes as u64,
            next: std::cell::Cell::new(0),
        };
        let mut tag = 58_000u64;
        let n = pool_cases_of::<f32>(cx, &[ReduceOp::Sum, ReduceOp::Max], &mut tag, Some(&arena))?
            + pool_cases_of::<bf16>(cx, &[ReduceOp::Sum], &mut tag, Some(&arena))?;
        comm.pool_release(segment).map_err(err)?;
        released.set(true);
        if comm.pool_lookup(base + 4096, 256).is_some() {
            return Err("released adopted memory is still found by a lookup".into());
        }
        if comm.pool_release(segment).is_ok() {
            return Err("a second release of adopted memory succeeded".into());
        }
        Ok(format!(
            "{bytes} bytes of cuMemAlloc memory adopted as segment {segment}: lookups find it, \
             the pool never frees it; overlapping memory and unequal sizes refused on every \
             rank; {n} cases (f32 sum/max, bf16 sum; every collective, in/out of place, every \
             arrangement, 1 element to 3 MiB) bitwise equal to the host reference and to \
             ordinary buffers; released, then no longer found and not released twice"
        ))
    })();
    if !released.get() {
        // Collective on every rank that failed before its release (a failure above is a
        // failure of every rank's check: the calls agree).
        let _ = comm.pool_release(segment);
    }
    drop(memory);
    result
}
