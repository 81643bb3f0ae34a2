//! A user's kernel with NVLink and network peers (docs/NETWORK.md, "Users' kernels and network
//! peers"): the foundation kernels `routed_rounds` and `routed_barrier_loop` (`cuda/foundation.cu`)
//! reach every peer of a window by its own route in one launch, NVLink stores or the network
//! queues of `window_net.cuh`; every byte is compared on the device against the sender's
//! pattern, and the last round's data again here against [`routed_byte`].

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use devcomm::{Window, WindowNetHandle};

use super::super::harness::{Checked, Ctx, Outcome, RegBuf, Skip};
use super::job;

/// (bytes per peer, rounds) of each launch; rounds continue from launch to launch.
const LAUNCHES: &[(usize, u64)] = &[(1, 20), (4099, 20), (1 << 20, 10), ((3 << 20) + 5, 4)];
/// Iterations of the routed barrier loop.
const BARRIER_ITERS: u64 = 50;

/// Byte `i` of what rank `from` puts into rank `to`'s window in round `r` (twin of
/// `routed_byte` in `foundation.cu`).
pub(crate) fn routed_byte(from: usize, to: usize, r: u64, i: u64) -> u8 {
    let mut x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= r
        .wrapping_mul(0xD1B5_4A32_D192_ED03)
        .wrapping_add((from as u64) << 40)
        .wrapping_add((to as u64) << 52);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x >> 56) as u8
}

/// A window of `bytes` bytes and `slots` user slots with its network path, or the skip of a
/// job whose transport cannot register it (UCX without CUDA memory support).
fn window_with_path(
    cx: &Ctx,
    bytes: usize,
    slots: usize,
) -> Result<Result<(Window<u8>, WindowNetHandle), Outcome>, String> {
    let win = cx
        .comm
        .window::<u8>(bytes, slots)
        .map_err(|e| e.to_string())?;
    Ok(match win.net_handle() {
        Ok(net) => Ok((win, net)),
        Err(e) => Err(Outcome::Skip(Skip::Unavailable(e.to_string()))),
    })
}

/// One block of 256 threads per peer.
fn per_peer(world: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (world as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Waits for the launch, then `Err` naming `what` unless the kernel's status is 1 and it
/// counted no wrong byte.
fn device_verdict(
    cx: &Ctx,
    bad: &CudaSlice<u64>,
    status: &CudaSlice<i32>,
    what: &str,
) -> Result<(), String> {
    cx.sync()?;
    let d = |e: cudarc::driver::DriverError| e.to_string();
    let b = cx.stream.clone_dtoh(bad).map_err(d)?[0];
    let st = cx.stream.clone_dtoh(status).map_err(d)?[0];
    if st != 1 || b != 0 {
        return Err(format!("{what}: status {st}, {b} wrong bytes"));
    }
    Ok(())
}

/// Reads back what every peer put at `[(W + p) * chunk, ...)` of the buffer at `ptr` in
/// `round` and compares it with [`routed_byte`] here.
fn host_verdict(cx: &Ctx, ptr: u64, chunk: usize, round: u64, what: &str) -> Result<(), String> {
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let got = cx.read_ptr(ptr, 2 * world * chunk)?;
    for p in (0..world).filter(|&p| p != rank) {
        let region = &got[(world + p) * chunk..(world + p + 1) * chunk];
        let expect = |i: usize| routed_byte(p, rank, round, i as u64);
        if let Some(i) = (0..chunk).find(|&i| region[i] != expect(i)) {
            return Err(format!(
                "{what}: {chunk} B from peer {p} ({:?}), round {round}: byte {i} is {:#x}, \
                 expected {:#x}",
                cx.comm.topology().kind(p),
                region[i],
                expect(i)
            ));
        }
    }
    Ok(())
}

pub(super) fn routed(cx: &Ctx) -> Checked {
    if let Err(skip) = job(cx, "net_window")? {
        return Ok(skip);
    }
    let (comm, stream) = (&cx.comm, &cx.stream);
    let (rank, world) = (comm.rank(), comm.world_size());
    let max_chunk = LAUNCHES.iter().map(|l| l.0).max().unwrap_or(1);
    let (win, net) = match window_with_path(cx, 2 * world * max_chunk, 2 * world)? {
        Ok(w) => w,
        Err(skip) => return Ok(skip),
    };
    let handle = win.device_handle();
    let module = cx.foundation()?;
    let rounds_fn = module
        .function("routed_rounds")
        .map_err(|e| e.to_string())?;
    let barrier_fn = module
        .function("routed_barrier_loop")
        .map_err(|e| e.to_string())?;
    let d = |e: cudarc::driver::DriverError| e.to_string();
    let bad = stream.alloc_zeros::<u64>(1).map_err(d)?;
    let status = stream.clone_htod(&[1i32]).map_err(d)?;
    let mut first = 1u64;
    let mut moved = 0u64;
    for &(chunk, rounds) in LAUNCHES {
        cx.host_barrier()?;
        let n = chunk as u64;
        let mut l = stream.launch_builder(&rounds_fn);
        l.arg(&handle)
            .arg(&net)
            .arg(&n)
            .arg(&first)
            .arg(&rounds)
            .arg(&bad)
            .arg(&status);
        // SAFETY: routed_rounds(DeviceWindow, WindowNet, u64, u64, u64, u64*, int*); the window
        // holds 2 * world * max_chunk bytes and 2 * world user slots; bad and status are
        // one-element device buffers.
        unsafe { l.launch(per_peer(world)) }.map_err(d)?;
        let what = format!("{chunk} B per peer, rounds {first}..{}", first + rounds);
        device_verdict(cx, &bad, &status, &what)?;
        // The last round's data, read back here.
        host_verdict(cx, handle.data, chunk, first + rounds - 1, &what)?;
        moved += n * rounds * (world as u64 - 1);
        first += rounds;
    }
    let scratch = stream.alloc_zeros::<u64>(3).map_err(d)?;
    cx.host_barrier()?;
    let mut l = stream.launch_builder(&barrier_fn);
    l.arg(&handle)
        .arg(&net)
        .arg(&BARRIER_ITERS)
        .arg(&scratch)
        .arg(&status);
    let threads = (world as u32).div_ceil(32) * 32;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: routed_barrier_loop(DeviceWindow, WindowNet, u64, u64*, int*); the window holds
    // 2 * world words and more; scratch has 3 words; one block of at least world threads.
    unsafe { l.launch(cfg) }.map_err(d)?;
    cx.sync()?;
    let st = stream.clone_dtoh(&status).map_err(d)?[0];
    if st != 1 {
        let s = stream.clone_dtoh(&scratch).map_err(d)?;
        return Err(format!(
            "routed barrier: iteration {} saw {} from peer {}",
            s[0], s[2], s[1]
        ));
    }
    let kinds: Vec<String> = (0..world)
        .filter(|&p| p != rank)
        .map(|p| format!("{p}:{:?}", comm.topology().kind(p)))
        .collect();
    Ok(Outcome::Pass(format!(
        "{moved} bytes put and verified in {} rounds with peers [{}] from one kernel, \
         {BARRIER_ITERS} routed barriers",
        first - 1,
        kinds.join(", ")
    )))
}

/// Sizes of the registered-buffer rounds, one launch each.
const REGISTERED: &[usize] = &[8, 4099, (1 << 20) + 3];

/// A user's buffer registered in a job with network links carries a network key in its
/// `RegisteredBuffer` (read back from the device), and a kernel puts from it into every peer's
/// buffer of the registration by its route (`put_registered_routed`), signalling on the same
/// channel; every byte is compared on the device and the last size again here.
pub(super) fn registered(cx: &Ctx) -> Checked {
    if let Err(skip) = job(cx, "net_registered")? {
        return Ok(skip);
    }
    let (comm, stream) = (&cx.comm, &cx.stream);
    let world = comm.world_size();
    let (win, net) = match window_with_path(cx, 64, world)? {
        Ok(w) => w,
        Err(skip) => return Ok(skip),
    };
    let max = REGISTERED.iter().copied().max().unwrap_or(1);
    let buf = RegBuf::new(cx, 2 * world * max)?;
    let handle = buf.reg().device_handle();
    // The RegisteredBuffer as kernels read it: base, size, peer table, lkey (@24).
    let raw = cx.read_ptr(handle, 32)?;
    let lkey = u32::from_le_bytes(raw[24..28].try_into().expect("4 bytes"));
    if lkey == 0 {
        return Err("the registered buffer's network key (lkey) is 0 in a job with network \
                    links whose windows have a network path"
            .into());
    }
    let module = cx.foundation()?;
    let f = module
        .function("routed_registered")
        .map_err(|e| e.to_string())?;
    let d = |e: cudarc::driver::DriverError| e.to_string();
    let bad = stream.alloc_zeros::<u64>(1).map_err(d)?;
    let status = stream.clone_htod(&[1i32]).map_err(d)?;
    let h = win.device_handle();
    let mut moved = 0u64;
    for (k, &chunk) in REGISTERED.iter().enumerate() {
        let round = k as u64 + 1;
        cx.host_barrier()?;
        let n = chunk as u64;
        let mut l = stream.launch_builder(&f);
        l.arg(&h)
            .arg(&net)
            .arg(&handle)
            .arg(&n)
            .arg(&round)
            .arg(&bad)
            .arg(&status);
        // SAFETY: routed_registered(DeviceWindow, WindowNet, const RegisteredBuffer*, u64,
        // u64, u64*, int*); the registered buffer holds 2 * world * max bytes, the window
        // world user slots; bad and status are one-element device buffers.
        unsafe { l.launch(per_peer(world)) }.map_err(d)?;
        let what = format!("{chunk} B per peer from the registered buffer");
        device_verdict(cx, &bad, &status, &what)?;
        host_verdict(cx, buf.ptr, chunk, round, &what)?;
        moved += n * (world as u64 - 1);
        cx.host_barrier()?;
    }
    Ok(Outcome::Pass(format!(
        "network key {lkey} in the handle; {moved} bytes put from registered buffers into \
         every peer's by its route, sizes {REGISTERED:?}, every byte checked"
    )))
}

#[cfg(test)]
mod tests {
    use super::routed_byte;

    #[test]
    fn the_pattern_changes_with_every_input() {
        let base = (0..64).map(|i| routed_byte(0, 1, 1, i)).collect::<Vec<_>>();
        for other in [
            (0..64).map(|i| routed_byte(1, 0, 1, i)).collect::<Vec<_>>(),
            (0..64).map(|i| routed_byte(0, 1, 2, i)).collect(),
            (0..64).map(|i| routed_byte(0, 2, 1, i)).collect(),
        ] {
            assert_ne!(base, other);
        }
    }
}
