//! All-to-all at every size and type, and the shared pieces of the collective checks: f32
//! buffers with NaN-poisoned outputs, one verified all-to-all of random bytes.

use cudarc::driver::CudaSlice;

use crate::selftest::harness::{compare as first_diff, Ctx, POISON};

type Detail = Result<String, String>;
/// Poisoned bytes after every output, checked untouched.
pub(super) const GUARD: usize = 256;

pub(super) fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// An f32 all-to-all's buffers, `n` elements per peer: send element `i` of this rank is
/// `value(rank, i)`; recv is poisoned with NaN.
pub(super) fn f32_a2a_buffers(
    cx: &Ctx,
    n: usize,
    value: impl Fn(usize, usize) -> f32,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>), String> {
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let data: Vec<f32> = (0..world * n).map(|i| value(rank, i)).collect();
    let send = cx.stream.clone_htod(&data).map_err(err)?;
    let recv = cx
        .stream
        .clone_htod(&vec![f32::NAN; world * n])
        .map_err(err)?;
    Ok((send, recv))
}

/// Waits for the all-to-all into `recv` (of [`f32_a2a_buffers`]) and checks that chunk `src`
/// holds rank `src`'s elements for this rank, bit for bit.
pub(super) fn check_f32_a2a(
    cx: &Ctx,
    recv: &CudaSlice<f32>,
    n: usize,
    value: impl Fn(usize, usize) -> f32,
    what: &str,
) -> Result<(), String> {
    cx.sync()?;
    let rank = cx.comm.rank();
    let got = cx.stream.clone_dtoh(recv).map_err(err)?;
    for (k, g) in got.iter().enumerate() {
        let (src, i) = (k / n, rank * n + k % n);
        let want = value(src, i);
        if g.to_bits() != want.to_bits() {
            return Err(format!(
                "{what}: element {k} from rank {src} is {g}, expected {want}"
            ));
        }
    }
    Ok(())
}

/// All-to-all of `n` bytes per peer: chunk p of rank s is `data_of(s, tag)[p n..]`.
pub(super) fn a2a_once(cx: &Ctx, n: usize, tag: u64) -> Result<(), String> {
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let send = cx
        .stream
        .clone_htod(&cx.data_of(rank, tag, world * n))
        .map_err(err)?;
    let mut recv = cx
        .stream
        .clone_htod(&vec![POISON; world * n + GUARD])
        .map_err(err)?;
    cx.sync()?;
    cx.host_barrier()?;
    cx.comm
        .all_to_all(&send, &mut recv.slice_mut(..world * n), &cx.stream)
        .map_err(err)?;
    cx.sync()?;
    let got = cx.stream.clone_dtoh(&recv).map_err(err)?;
    let mut expect = Vec::with_capacity(world * n + GUARD);
    for src in 0..world {
        expect.extend_from_slice(&cx.data_of(src, tag, world * n)[rank * n..(rank + 1) * n]);
    }
    expect.extend_from_slice(&[POISON; GUARD]);
    first_diff(&got, &expect, &format!("all_to_all {n} B per peer"))
}

pub(super) fn check_all_to_all(cx: &Ctx) -> Detail {
    let sizes = [
        1usize,
        15,
        16,
        1000,
        4096,
        65_536 + 8,
        1 << 20,
        (16 << 20) + 48,
        64 << 20,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        a2a_once(cx, n, 700 + i as u64)?;
    }
    // Typed: f32 with rows of 33 elements.
    let world = cx.comm.world_size();
    let n = 33 * 1000;
    let val = |s: usize, k: usize| (s * 1_000_003 + k) as f32;
    let (send, mut recv) = f32_a2a_buffers(cx, n, val)?;
    cx.comm
        .all_to_all(&send, &mut recv, &cx.stream)
        .map_err(err)?;
    check_f32_a2a(cx, &recv, n, val, "f32 all_to_all")?;
    cx.host_barrier()?;
    Ok(format!(
        "{} sizes from 1 B to 64 MiB per peer (u8) and f32, world {world}, guard untouched",
        sizes.len()
    ))
}
