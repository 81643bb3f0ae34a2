//! Two contracts a user meets without doing anything exotic: an all-gather of any element type
//! (it reduces nothing), and a registration dropped on one rank alone (an early return), which
//! must neither block that rank nor the peers' collective release.

use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DeviceRepr};

use crate::selftest::harness::Ctx;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// 16 bytes aligned to 16: moves as two `i64` per element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C, align(16))]
struct Wide {
    a: u64,
    b: u32,
    c: u32,
}
// SAFETY: a plain `#[repr(C)]` struct of integers, valid for any bits.
unsafe impl DeviceRepr for Wide {}

/// Gathers `per` elements of `T` from every rank (data from `make(rank, i)`) and compares the
/// whole output bitwise.
fn gather<T: DeviceRepr + Copy + PartialEq + std::fmt::Debug>(
    cx: &Ctx,
    per: usize,
    make: impl Fn(usize, usize) -> T,
) -> Result<(), String> {
    let (comm, s) = (&cx.comm, &cx.stream);
    let (rank, w) = (comm.rank(), comm.world_size());
    let mine: Vec<T> = (0..per).map(|i| make(rank, i)).collect();
    let src = s.clone_htod(&mine).map_err(err)?;
    let mut dst: CudaSlice<T> = s.clone_htod(&vec![make(99, 0); per * w]).map_err(err)?;
    comm.all_gather(&src, &mut dst, s).map_err(err)?;
    comm.synchronize(s).map_err(err)?;
    let got = s.clone_dtoh(&dst).map_err(err)?;
    for p in 0..w {
        for i in 0..per {
            if got[p * per + i] != make(p, i) {
                return Err(format!(
                    "{}: rank {p}'s element {i} is {:?}, expected {:?}",
                    std::any::type_name::<T>(),
                    got[p * per + i],
                    make(p, i)
                ));
            }
        }
    }
    // In place: this rank's shard of the output is its input.
    let mut buf: CudaSlice<T> = s.clone_htod(&vec![make(99, 0); per * w]).map_err(err)?;
    s.memcpy_htod(&mine, &mut buf.slice_mut(rank * per..(rank + 1) * per))
        .map_err(err)?;
    comm.all_gather_in_place(&mut buf, s).map_err(err)?;
    comm.synchronize(s).map_err(err)?;
    if s.clone_dtoh(&buf).map_err(err)? != got {
        return Err(format!("{}: in place differs", std::any::type_name::<T>()));
    }
    Ok(())
}

/// All-gathers of u16 (NaN-like bit patterns kept: a copy, never a conversion), u32, i8,
/// [f32; 4] (16 bytes aligned to 4), a 16-byte struct aligned to 16 and [u8; 3], in and out of
/// place, one-shot and two-shot sizes.
pub(super) fn all_gather_any_type(cx: &Ctx) -> Result<String, String> {
    for per in [1usize, 777, 300_000] {
        gather(cx, per, |r, i| (0x7e01u16 ^ (r as u16) << 12) ^ i as u16)?;
        gather(cx, per, |r, i| (r as u32) << 24 | i as u32)?;
        gather(cx, per, |r, i| (r as i8).wrapping_mul(31) ^ i as i8)?;
        gather(cx, per, |r, i| [r as f32, i as f32, -0.0, f32::from_bits(0x7fc0_0001)].map(f32::to_bits))?;
        gather(cx, per, |r, i| Wide {
            a: (r as u64) << 40 | i as u64,
            b: !(i as u32),
            c: r as u32,
        })?;
        gather(cx, per, |r, i| [r as u8, i as u8, (i >> 8) as u8])?;
    }
    Ok("u16, u32, i8, [f32; 4], a 16-byte struct and [u8; 3]: bitwise, in and out of place, \
        1, 777 and 300,000 elements"
        .into())
}

/// Rank 0 drops a registration alone (as an early `?` return would) while the peers are still
/// busy: its drop returns at once. The peers then release collectively, which counts rank 0's
/// release and returns; a registration made after works for a zero-copy ring.
pub(super) fn registration_dropped_alone(cx: &Ctx) -> Result<String, String> {
    let (comm, s) = (&cx.comm, &cx.stream);
    let (rank, w) = (comm.rank(), comm.world_size());
    let bytes = 1 << 20;
    let memory = devcomm::testing::DeviceBuffer::zeroed(comm.context(), bytes).map_err(err)?;
    devcomm::testing::synchronize(comm.context()).map_err(err)?;
    // SAFETY: `memory` outlives the registration: it is freed at the end of this function,
    // after every rank released (the host barrier below follows the peers' collective release).
    let reg = unsafe { comm.register(memory.ptr(), bytes) }.map_err(err)?;
    let mut dropped_in = Duration::ZERO;
    if rank == 0 {
        let t = Instant::now();
        drop(reg);
        dropped_in = t.elapsed();
        if dropped_in > Duration::from_secs(1) {
            return Err(format!("dropping alone took {dropped_in:?}"));
        }
    } else {
        // Busy long after rank 0 dropped, then release collectively.
        std::thread::sleep(Duration::from_millis(500));
        let t = Instant::now();
        reg.release()
            .map_err(|e| format!("the collective release after rank 0's drop: {e}"))?;
        if t.elapsed() > Duration::from_secs(5) {
            return Err(format!("the collective release took {:?}", t.elapsed()));
        }
    }
    cx.host_barrier()?;
    // The communicator is whole: a new registration carries a zero-copy ring.
    // SAFETY: as above; released before `memory` is freed (the drop order below).
    let reg = unsafe { comm.register(memory.ptr(), bytes) }.map_err(err)?;
    let (to, from) = ((rank + 1) % w, (rank + w - 1) % w);
    let src = s.clone_htod(&cx.data_of(rank, 7, bytes)).map_err(err)?;
    comm.sendrecv_registered(&src, to, reg.range(0, bytes as u64), reg.range(0, bytes as u64), from, s)
        .and_then(|()| comm.synchronize(s))
        .map_err(|e| format!("the ring after the release: {e}"))?;
    let got = cx.read_ptr(memory.ptr(), bytes)?;
    if got != cx.data_of(from, 7, bytes) {
        return Err("the ring after the release delivered other bytes".into());
    }
    reg.release().map_err(err)?;
    drop(memory);
    Ok(format!(
        "rank 0 dropped alone in {dropped_in:?}; the peers' collective release counted it; a \
         new registration carried a verified zero-copy ring"
    ))
}
