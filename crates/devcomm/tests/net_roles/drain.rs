//! The proxy after an abort a kernel recorded (docs/NETWORK.md, "Failures"): what the queues
//! held when the abort came still leaves for a bounded time (`DRAIN_AFTER_ABORT`, 200 ms), so
//! that a launch that failed against one peer still tells its other peers what its call was;
//! after that time nothing more leaves.

use std::sync::atomic::Ordering;
use std::time::Duration;

use devcomm::abi::net::SignalOp;
use devcomm::abi::ErrorRecord;
use devcomm_bootstrap::RankInfo;

use super::{pattern, s, Rank, CHUNK, R, T};

/// Rank 0 queues a chunk and its signal for rank 1 with its proxy paused, then records a
/// failure as a kernel does (a call mismatch, say: abort raised) and resumes
/// the proxy: rank 1 must get the chunk and the signal. Rank 0 then waits past the drain and
/// queues a second signal, which rank 1 must never see.
pub(super) fn drain(info: RankInfo) -> R {
    let r = Rank::new(&info, 8, Duration::from_secs(10))?;
    let world = r.world();
    if r.rank() == 1 {
        r.wait(0, 0, 1)?;
        let bad = (0..CHUNK).find(|&k| r.get(k) != pattern(7, 0, 1, k));
        if let Some(k) = bad {
            return Err(format!("byte {k} from rank 0 is wrong"));
        }
        println!("rank 1: the chunk queued before rank 0's abort arrived after it");
        r.store.barrier("drain/late-queued", T).map_err(s)?;
        std::thread::sleep(Duration::from_millis(500));
        let word = r.pad[0].load(Ordering::Acquire);
        if word != 1 {
            return Err(format!(
                "a signal queued after the drain arrived (word {word})"
            ));
        }
        println!("rank 1: nothing queued after the drain arrived");
        r.store.barrier("drain/done", T).map_err(s)?;
        return r.finish();
    }
    let src = (world + 1) * CHUNK;
    for k in 0..CHUNK {
        r.set(src + k, pattern(7, 0, 1, k));
    }
    r.net().set_paused(true);
    let q = r.net().queues().queue(1, 0).map_err(s)?;
    q.enqueue(r.put(src, 0, CHUNK), 0, &r.sink, T).map_err(s)?;
    q.enqueue(r.signal(0, SignalOp::Set, 1), 0, &r.sink, T)
        .map_err(s)?;
    r.sink.record_as_kernel(ErrorRecord {
        op: 11, // DeviceOp::CallMismatch
        rank: 0,
        peer: 1,
        slot: 2,
        expected: 8,
        seen: 16,
        ..ErrorRecord::default()
    });
    if r.net().check().is_ok() {
        return Err("the transport is not aborted after the record".to_owned());
    }
    r.net().set_paused(false);
    // Past the drain: a descriptor queued now must stay where it is.
    std::thread::sleep(Duration::from_millis(600));
    q.enqueue(r.signal(0, SignalOp::Set, 2), 0, &r.sink, T)
        .map_err(s)?;
    println!("rank 0: aborted by a kernel's record; queued a signal after the drain");
    r.store.barrier("drain/late-queued", T).map_err(s)?;
    r.store.barrier("drain/done", T).map_err(s)?;
    // The transport is aborted: shut it down without the check.
    let mut r = r;
    let net = r.net.take().expect("transport");
    net.shutdown(&r.store).map_err(s)
}
