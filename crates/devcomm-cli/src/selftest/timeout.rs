//! The timeout check. It runs last: a device wait that times out leaves the communicator
//! aborted, so no check can follow it.

use std::time::{Duration, Instant};

use cudarc::driver::{LaunchConfig, PushKernelArg};
use devcomm::{DeviceWindow, Error};

use super::harness::{verified, Check, Ctx, Ranks};

/// The group's one check.
pub(super) const CHECKS: &[Check] = &[Check {
    name: "wait_timeout",
    ranks: Ranks::AtLeast(2),
    about: "a wait for a signal that never comes fails within --timeout-ms, naming the peer",
    run: |cx, p| verified(wait_timeout(cx, p.timeout)),
}];

/// A wait on a signal that never comes returns an error naming the peer within the timeout.
fn wait_timeout(cx: &Ctx, timeout: Duration) -> Result<String, String> {
    let comm = &cx.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let module = cx.foundation()?;
    let f = module.function("wait_forever").map_err(|e| e.to_string())?;
    let win = comm.window::<u8>(64, 4).map_err(|e| e.to_string())?;
    let status = cx.stream.alloc_zeros::<i32>(1).map_err(|e| e.to_string())?;
    cx.host_barrier()?;
    let mut handle: DeviceWindow = win.device_handle();
    handle.timeout_ns = timeout.as_nanos() as u64;
    let peer = ((rank + 1) % world) as i32;
    let slot = 3u64;
    let one_warp = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let t = Instant::now();
    let mut l = cx.stream.launch_builder(&f);
    l.arg(&handle).arg(&peer).arg(&slot).arg(&status);
    // SAFETY: wait_forever(DeviceWindow, int, u64, int*); slot 3 < 4 user slots.
    unsafe { l.launch(one_warp) }.map_err(|e| e.to_string())?;
    let err = cx.sync().err();
    let waited = t.elapsed();
    let e = match comm.check() {
        Err(e @ Error::Aborted { .. }) | Err(e @ Error::PeerTimeout { .. }) => e.to_string(),
        Err(other) => return Err(format!("unexpected error: {other}")),
        Ok(()) => return Err(format!("no error after {waited:?} (sync: {err:?})")),
    };
    if !e.contains(&format!("peer {peer}")) {
        return Err(format!("error does not name peer {peer}: {e}"));
    }
    if waited > timeout + Duration::from_secs(5) {
        return Err(format!("took {waited:?} for a {timeout:?} timeout"));
    }
    Ok(format!("returned after {:.2} s: {e}", waited.as_secs_f64()))
}
