//! Zero-copy calls (`*_registered`) with network peers: each is a send/recv of the network
//! route into the registered range (docs/NETWORK.md), checked byte for byte with guard bytes
//! around the range; a range past the peer's registration is refused before launch; the
//! all-to-all into a registered output runs its fused kernel. A `sendrecv_registered` with one
//! NVLink and one network peer is `zero_copy_mixed.rs`'s.

use std::time::{Duration, Instant};

use devcomm::Error;

use super::super::harness::{compare, Checked, Ctx, Outcome, RegBuf, POISON};
use super::job;

/// Bytes of the registered buffer.
const BYTES: usize = 4 << 20;
/// Poison bytes checked after each range.
const GUARD: usize = 4096;

pub(super) fn zero_copy(cx: &Ctx) -> Checked {
    let net = match job(cx, "net_zero_copy")? {
        Ok(j) => j,
        Err(skip) => return Ok(skip),
    };
    let (comm, stream) = (&cx.comm, &cx.stream);
    let (rank, world) = (comm.rank(), comm.world_size());
    let d = |e: cudarc::driver::DriverError| e.to_string();
    let reg = RegBuf::new(cx, BYTES)?;
    let read = |what: &str| -> Result<Vec<u8>, String> {
        let view = reg.view(stream);
        let got = stream.clone_dtoh(&*view).map_err(d)?;
        if got.len() != BYTES {
            return Err(format!("{what}: read {} bytes", got.len()));
        }
        Ok(got)
    };
    // The range [off, off + n) holds `expect`, the guard after it still the poison.
    let check = |what: &str, off: usize, expect: &[u8]| -> Result<(), String> {
        let got = read(what)?;
        let end = off + expect.len();
        compare(&got[off..end], expect, what)?;
        match got[end..end + GUARD].iter().position(|&b| b != POISON) {
            Some(i) => Err(format!("{what}: guard byte {i} after the range was written")),
            None => Ok(()),
        }
    };
    let mut done = Vec::new();
    for (i, &n) in [8usize, 4099, (1 << 20) + 3].iter().enumerate() {
        let off = 40 + 1000 * i;
        let tag = 50 + i as u64;
        reg.poison(stream)?;
        cx.sync()?;
        cx.host_barrier()?;
        if let Some(peer) = net.partner {
            let src = stream
                .clone_htod(&cx.data_of(rank, tag, n))
                .map_err(d)?;
            // One way: the lower rank sends into the higher rank's range.
            let r = if rank < peer {
                comm.send_registered(&src, peer, reg.at(off, n), stream)
            } else {
                comm.recv_registered(reg.at(off, n), peer, stream)
            };
            r.and_then(|()| comm.synchronize(stream))
                .map_err(|x| format!("{n} B one way: {x}"))?;
            if rank > peer {
                check(&format!("{n} B from peer {peer}"), off, &cx.data_of(peer, tag, n))?;
            }
            // Both ways in one call, into the same range of each other's registration.
            reg.poison(stream)?;
            comm.sendrecv_registered(&src, peer, reg.at(off, n), reg.at(off, n), peer, stream)
                .and_then(|()| comm.synchronize(stream))
                .map_err(|x| format!("{n} B both ways: {x}"))?;
            check(
                &format!("{n} B both ways from peer {peer}"),
                off,
                &cx.data_of(peer, tag, n),
            )?;
            done.push(n);
        }
        cx.host_barrier()?;
    }
    // A range past the peer's registered size: refused before anything is launched.
    if let Some(peer) = net.partner {
        let src = stream.alloc_zeros::<u8>(8).map_err(d)?;
        let t = Instant::now();
        match comm.send_registered(&src, peer, reg.at(BYTES - 4, 8), stream) {
            Err(Error::CapacityExceeded { peer: p, .. }) if p == peer => {}
            other => return Err(format!("a range past peer {peer}'s buffer: {other:?}")),
        }
        if t.elapsed() > Duration::from_secs(1) {
            return Err("the refusal of a range past the buffer took over 1 s".into());
        }
    }
    cx.host_barrier()?;
    // The all-to-all into a registered output, every rank: the fused kernel.
    let chunk = 4099;
    let all = cx.data_of(rank, 77, world * chunk);
    let src = stream.clone_htod(&all).map_err(d)?;
    reg.poison(stream)?;
    cx.sync()?;
    cx.host_barrier()?;
    comm.all_to_all_registered(&src, reg.at(64, world * chunk), stream)
        .and_then(|()| comm.synchronize(stream))
        .map_err(|x| format!("all_to_all_registered: {x}"))?;
    let got = read("all_to_all_registered")?;
    for p in 0..world {
        let expect = &cx.data_of(p, 77, world * chunk)[rank * chunk..(rank + 1) * chunk];
        let at = 64 + p * chunk;
        compare(&got[at..at + chunk], expect, &format!("all_to_all_registered chunk {p}"))?;
    }
    cx.host_barrier()?;
    drop(reg);
    let pairs = match net.partner {
        Some(peer) => format!("with network peer {peer}: {done:?} B one way and both ways"),
        None => "no network partner on this rank".into(),
    };
    Ok(Outcome::Pass(format!(
        "{pairs}, guard bytes untouched; a range past the peer's buffer refused; \
         all_to_all_registered of {chunk} B per peer verified"
    )))
}
