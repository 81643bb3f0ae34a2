//! What each rank of the network tests does. A rank is this test binary re-executed with
//! `DEVCOMM_NET_ROLE` set; a host thread stands in for the device: it writes descriptors into
//! the queues and waits on signal words in host memory.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use devcomm::abi::net::{NetDescriptor, NetOp, SignalOp};
use devcomm::abi::DeviceErrorState;
use devcomm::error::net::NetError;
use devcomm::testing::net::{host, ErrorSink, NetConfig, NetTransport};
use devcomm_bootstrap::{RankInfo, Store};

mod route;

pub const ROLE: &str = "DEVCOMM_NET_ROLE";
pub const T: Duration = Duration::from_secs(30);
/// Bytes each rank sends each peer per round.
const CHUNK: usize = 64 * 1024;
/// Puts per chunk (the ordering check: many puts, then one signal).
const PIECES: usize = 16;

pub type R = Result<(), String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// One rank's transport with a registered data buffer and signal pad, all in host memory.
struct Rank {
    /// First field: dropped before the store (rank 0 hosts it), the buffers and the record.
    net: Option<NetTransport>,
    store: Store,
    /// Layout: receive regions [world * CHUNK], then send regions [world * CHUNK]. Accessed
    /// only through `base` (raw, volatile) once registered: UCX writes into it concurrently.
    data: Vec<u8>,
    base: usize,
    /// Slot p: round whose data from p has landed; slot world + p: acks (counter) from p.
    pad: Box<[AtomicU64]>,
    data_key: u32,
    pad_key: u32,
    /// Kept alive for the sink (boxed: a stable address).
    _state: Box<DeviceErrorState>,
    sink: ErrorSink,
}

impl Rank {
    fn new(info: &RankInfo, capacity: u32, op_timeout: Duration) -> Result<Self, String> {
        let store = Store::connect(info, T).map_err(s)?;
        let world = store.world_size();
        let mut state = Box::new(DeviceErrorState::default());
        // SAFETY: the box lives in `Rank` next to the transport, which is dropped first
        // (`net` is taken and shut down before the struct goes).
        let sink = unsafe { ErrorSink::new(&mut *state) };
        let peers: Vec<usize> = (0..world).filter(|&p| p != store.rank()).collect();
        let config = NetConfig {
            capacity,
            op_timeout,
            ..NetConfig::from_config(&devcomm::Config::from_env().map_err(s)?)
        };
        // SAFETY: see above.
        let net = unsafe { NetTransport::new(&store, &peers, sink, config) }.map_err(s)?;
        let data = vec![0u8; 2 * world * CHUNK];
        let pad: Box<[AtomicU64]> = (0..2 * world).map(|_| AtomicU64::new(0)).collect();
        // SAFETY: `data` and `pad` are never reallocated and outlive the transport.
        let data_key =
            unsafe { net.register(&store, data.as_ptr() as u64, data.len() as u64, false) }
                .map_err(s)?;
        // SAFETY: as above.
        let pad_key =
            unsafe { net.register(&store, pad.as_ptr() as u64, (pad.len() * 8) as u64, false) }
                .map_err(s)?;
        let base = data.as_ptr() as usize;
        Ok(Self {
            net: Some(net),
            store,
            data,
            base,
            pad,
            data_key,
            pad_key,
            _state: state,
            sink,
        })
    }

    fn get(&self, offset: usize) -> u8 {
        assert!(offset < self.data.len());
        // SAFETY: in bounds of `data`, which lives as long as `self`; volatile because UCX
        // writes the buffer behind the compiler's back.
        unsafe { std::ptr::read_volatile((self.base as *const u8).add(offset)) }
    }

    fn set(&self, offset: usize, value: u8) {
        assert!(offset < self.data.len());
        // SAFETY: as in `get`; the test writes only send regions no put is reading (a region
        // is rewritten after the peer acknowledged the round that read it).
        unsafe { std::ptr::write_volatile((self.base as *mut u8).add(offset), value) }
    }

    fn net(&self) -> &NetTransport {
        self.net.as_ref().expect("transport")
    }

    fn rank(&self) -> usize {
        self.store.rank()
    }

    fn world(&self) -> usize {
        self.store.world_size()
    }

    fn enqueue(&self, peer: usize, d: NetDescriptor) -> Result<u64, NetError> {
        let q = self.net().queues().queue(peer, 0)?;
        q.enqueue(d, self.rank(), &self.sink, T)
    }

    fn put(&self, src: usize, dst: usize, bytes: usize) -> NetDescriptor {
        NetDescriptor {
            op: NetOp::Put as u32,
            key: self.data_key,
            src_offset: src as u64,
            dst_offset: dst as u64,
            bytes: bytes as u64,
            ..NetDescriptor::default()
        }
    }

    fn signal(&self, slot: usize, op: SignalOp, value: u64) -> NetDescriptor {
        NetDescriptor {
            op: NetOp::Signal as u32,
            signal_key: self.pad_key,
            signal_op: op as u32,
            signal_offset: (slot * 8) as u64,
            signal_value: value,
            ..NetDescriptor::default()
        }
    }

    fn wait(&self, slot: usize, peer: usize, value: u64) -> Result<(), String> {
        let site = (self.rank(), peer as i32, slot as u64);
        host::wait_signal(&self.pad[slot], value, site, &self.sink, T).map_err(s)
    }

    fn finish(mut self) -> R {
        let net = self.net.take().expect("transport");
        net.check().map_err(s)?;
        net.shutdown(&self.store).map_err(s)
    }
}

/// The byte `k` of what `from` sends `to` in `round`.
fn pattern(round: u64, from: usize, to: usize, k: usize) -> u8 {
    let x = round.wrapping_mul(0x9e37_79b9) ^ (from as u64) << 40 ^ (to as u64) << 48 ^ k as u64;
    (x ^ x >> 7 ^ x >> 13) as u8
}

pub fn run_role(role: &str, info: RankInfo) -> R {
    let rounds = std::env::var("DEVCOMM_NET_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    match role {
        "exchange" => exchange(info, rounds),
        "credits" => credits(info),
        "death" => death(info),
        "setup_failure" => setup_failure(info),
        "bad_descriptor" => bad_descriptor(info),
        "route" => route::route(info),
        "gpu_put" => gpu_put(info),
        other => Err(format!("unknown role {other}")),
    }
}

/// Every rank sends every other rank a chunk per round as PIECES puts then a signal (or a
/// put-with-signal for the last piece, on even rounds); the receiver waits for the signal and
/// checks every byte, then acknowledges with a counter signal so that the sender may reuse
/// its send region. A small queue makes the credits cycle many times.
fn exchange(info: RankInfo, rounds: u64) -> R {
    let r = Rank::new(&info, 8, Duration::from_secs(10))?;
    let (me, world) = (r.rank(), r.world());
    let piece = CHUNK / PIECES;
    for round in 1..=rounds {
        for p in (0..world).filter(|&p| p != me) {
            let src = (world + p) * CHUNK;
            for k in 0..CHUNK {
                r.set(src + k, pattern(round, me, p, k));
            }
            let combined = round % 2 == 0;
            for i in 0..PIECES {
                let mut d = r.put(src + i * piece, me * CHUNK + i * piece, piece);
                if combined && i == PIECES - 1 {
                    let sig = r.signal(me, SignalOp::Set, round);
                    d.op = NetOp::PutSignal as u32;
                    (d.signal_key, d.signal_op, d.signal_offset, d.signal_value) = (
                        sig.signal_key,
                        sig.signal_op,
                        sig.signal_offset,
                        sig.signal_value,
                    );
                }
                r.enqueue(p, d).map_err(s)?;
            }
            if !combined {
                r.enqueue(p, r.signal(me, SignalOp::Set, round))
                    .map_err(s)?;
            }
        }
        for p in (0..world).filter(|&p| p != me) {
            r.wait(p, p, round)?;
            let dst = p * CHUNK;
            if let Some(k) = (0..CHUNK).find(|&k| r.get(dst + k) != pattern(round, p, me, k)) {
                return Err(format!(
                    "rank {me} round {round}: byte {k} from rank {p} is {} but {} was sent \
                     (data seen before its signal?)",
                    r.get(dst + k),
                    pattern(round, p, me, k)
                ));
            }
            r.enqueue(p, r.signal(world + me, SignalOp::Add, 1))
                .map_err(s)?;
        }
        for p in (0..world).filter(|&p| p != me) {
            r.wait(world + p, p, round)?;
        }
    }
    for p in (0..world).filter(|&p| p != me) {
        let q = r.net().queues().queue(p, 0).map_err(s)?;
        q.flush(me, &r.sink, T).map_err(s)?;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    println!("rank {me}: host {}", host.trim());
    println!(
        "rank {me}: {rounds} rounds with {} peers verified",
        world - 1
    );
    r.finish()
}

/// Rank 0: a paused proxy blocks the producer at `capacity` descriptors until it resumes;
/// then a proxy that stays stuck makes the producer give up with an error naming the peer.
/// Rank 1 receives and checks the data of the first part.
fn credits(info: RankInfo) -> R {
    const CAP: u32 = 4;
    let r = Rank::new(&info, CAP, Duration::from_secs(10))?;
    let world = r.world();
    if r.rank() == 1 {
        r.wait(0, 0, 1)?;
        let bad = (0..CHUNK).find(|&k| r.get(k) != pattern(1, 0, 1, k));
        if let Some(k) = bad {
            return Err(format!("byte {k} from rank 0 is wrong"));
        }
        r.enqueue(0, r.signal(world + 1, SignalOp::Add, 1))
            .map_err(s)?;
        r.store.barrier("credits/stuck-done", T).map_err(s)?;
        return r.finish();
    }
    let src = (world + 1) * CHUNK;
    for k in 0..CHUNK {
        r.set(src + k, pattern(1, 0, 1, k));
    }
    let r = Arc::new(r);
    r.net().set_paused(true);
    let written = Arc::new(AtomicUsize::new(0));
    let piece = CHUNK / PIECES;
    // Taken before the producer starts, so that its time counts the whole pause below (a
    // clock started inside the thread starts late on a loaded machine).
    let start = Instant::now();
    let producer = {
        let (r, written) = (r.clone(), written.clone());
        std::thread::spawn(move || -> Result<Duration, String> {
            for i in 0..PIECES {
                r.enqueue(1, r.put(src + i * piece, i * piece, piece))
                    .map_err(s)?;
                written.fetch_add(1, Ordering::SeqCst);
            }
            r.enqueue(1, r.signal(0, SignalOp::Set, 1)).map_err(s)?;
            Ok(start.elapsed())
        })
    };
    let pause = Duration::from_millis(400);
    std::thread::sleep(pause);
    let stalled_at = written.load(Ordering::SeqCst);
    if stalled_at != CAP as usize {
        return Err(format!("with the proxy paused the producer wrote {stalled_at} descriptors, expected exactly {CAP}"));
    }
    r.net().set_paused(false);
    let took = producer
        .join()
        .map_err(|_| "producer panicked".to_owned())??;
    if took < pause {
        return Err(format!(
            "producer finished in {took:?}, before the proxy resumed"
        ));
    }
    r.wait(world + 1, 1, 1)?;
    println!("rank 0: producer held at {stalled_at} descriptors for {pause:?}, then finished");
    // A stuck proxy: fill the queue, then one more must fail within its timeout.
    r.net().set_paused(true);
    let q = r.net().queues().queue(1, 0).map_err(s)?;
    for _ in 0..CAP {
        q.enqueue(r.signal(0, SignalOp::Add, 0), 0, &r.sink, T)
            .map_err(s)?;
    }
    let limit = Duration::from_millis(500);
    let start = Instant::now();
    let err = q
        .enqueue(r.signal(0, SignalOp::Add, 0), 0, &r.sink, limit)
        .expect_err("the queue is full");
    let waited = start.elapsed();
    let msg = err.to_string();
    if !matches!(err, NetError::QueueFull { peer: 1, .. }) || waited < limit || waited > limit * 10
    {
        return Err(format!(
            "stuck proxy: got `{msg}` after {waited:?} (limit {limit:?})"
        ));
    }
    let again = r
        .net()
        .check()
        .expect_err("the transport is aborted")
        .to_string();
    if again != msg {
        return Err(format!("check() says `{again}`, the producer said `{msg}`"));
    }
    println!("rank 0: stuck proxy reported after {waited:?}: {msg}");
    r.store.barrier("credits/stuck-done", T).map_err(s)?;
    let r = Arc::into_inner(r).ok_or("producer still holds the rank")?;
    // The transport is aborted: shut it down without the check.
    let mut r = r;
    let net = r.net.take().expect("transport");
    net.shutdown(&r.store).map_err(s)
}

/// Ranks 0 and 1 survive; rank 2 is killed by the test once it printed READY. The survivors
/// keep putting to rank 2 and flushing until the proxy reports it failed, and check that the
/// error names peer 2 and comes within the bound.
fn death(info: RankInfo) -> R {
    let op_timeout = Duration::from_secs(5);
    let r = Rank::new(&info, 8, op_timeout)?;
    let me = r.rank();
    r.store.barrier("death/ready", T).map_err(s)?;
    if me == 2 {
        println!("READY");
        std::thread::sleep(Duration::from_secs(120));
        return Err("rank 2 was not killed".to_owned());
    }
    let start = Instant::now();
    let bound = Duration::from_secs(60);
    let err = loop {
        if start.elapsed() > bound {
            return Err(format!(
                "rank {me}: no failure reported within {bound:?} of rank 2's end"
            ));
        }
        let q = r.net().queues().queue(2, 0).map_err(s)?;
        let src = (r.world() + 2) * CHUNK;
        if let Err(e) = q.enqueue(r.put(src, me * CHUNK, CHUNK), me, &r.sink, T) {
            break e;
        }
        if let Err(e) = q.flush(me, &r.sink, Duration::from_secs(20)) {
            break e;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let msg = err.to_string();
    if !matches!(err, NetError::PeerFailed { peer: 2, .. }) {
        return Err(format!(
            "rank {me}: expected a failure of peer 2, got `{msg}`"
        ));
    }
    // A wait on the dead peer's signal now returns at once with the same record.
    let t = Instant::now();
    let wait = host::wait_signal(&r.pad[2], 1, (me, 2, 2), &r.sink, T).expect_err("aborted");
    if t.elapsed() > Duration::from_secs(1) || wait.to_string() != msg {
        return Err(format!(
            "rank {me}: wait after the failure took {:?}: {wait}",
            t.elapsed()
        ));
    }
    println!(
        "rank {me}: peer death reported after {:?}: {msg}",
        start.elapsed()
    );
    // Rank 0 hosts the store: it leaves last.
    if me == 1 {
        r.store.set("death/1-done", b"1").map_err(s)?;
    } else {
        r.store.get("death/1-done", T).map_err(s)?;
    }
    drop(r);
    Ok(())
}

/// Rank 1 is given a libucp path that does not exist: every rank's setup fails with the same
/// error, naming rank 1 and the path (no rank is left waiting for the others).
fn setup_failure(info: RankInfo) -> R {
    let store = Store::connect(&info, T).map_err(s)?;
    let me = store.rank();
    let mut state = Box::new(DeviceErrorState::default());
    // SAFETY: `state` outlives the transport, which is never created.
    let sink = unsafe { ErrorSink::new(&mut *state) };
    let mut config = NetConfig::from_config(&devcomm::Config::from_env().expect("settings"));
    if me == 1 {
        config.library = Some("/nonexistent/devcomm-ucx".to_owned());
    }
    let peers: Vec<usize> = (0..store.world_size()).filter(|&p| p != me).collect();
    // SAFETY: as above.
    let result = unsafe { NetTransport::new(&store, &peers, sink, config) };
    let err = match result {
        Ok(_) => return Err(format!("rank {me}: setup succeeded without UCX on rank 1")),
        Err(e) => e,
    };
    let msg = err.to_string();
    let ok = matches!(&err, NetError::Setup { failures, .. } if failures.len() == 1 && failures[0].0 == 1)
        && msg.contains("/nonexistent/devcomm-ucx");
    if !ok {
        return Err(format!("rank {me}: unexpected error `{msg}`"));
    }
    println!("rank {me}: setup refused: {msg}");
    store.barrier("setup_failure/done", T).map_err(s)?;
    Ok(())
}

/// Rank 0 asks for a put that ends past the peer's registration: the proxy performs nothing,
/// records the refusal, and rank 0's flush returns it naming peer 1; rank 1's buffer is
/// untouched.
fn bad_descriptor(info: RankInfo) -> R {
    let mut r = Rank::new(&info, 8, Duration::from_secs(10))?;
    let world = r.world();
    if r.rank() == 0 {
        let len = 2 * world * CHUNK;
        r.enqueue(1, r.put(0, len - 8, 16)).map_err(s)?;
        let q = r.net().queues().queue(1, 0).map_err(s)?;
        let err = q
            .flush(0, &r.sink, T)
            .expect_err("the descriptor is refused");
        let msg = err.to_string();
        if !matches!(err, NetError::BadDescriptor { peer: 1, .. }) {
            return Err(format!(
                "rank 0: expected a refused descriptor for peer 1, got `{msg}`"
            ));
        }
        println!("rank 0: refused: {msg}");
    }
    r.store.barrier("bad_descriptor/done", T).map_err(s)?;
    if r.rank() == 1 {
        if let Some(k) = (0..2 * world * CHUNK).find(|&k| r.get(k) != 0) {
            return Err(format!("rank 1: byte {k} was written"));
        }
        return r.finish();
    }
    let net = r.net.take().expect("transport");
    net.shutdown(&r.store).map_err(s)
}

/// GPU memory over UCX, a probe for registering GPU buffers with the transport (docs/NETWORK.md,
/// "Not built yet"): each rank of two registers a GPU buffer (`cuda = true`) and a host signal
/// pad, puts its pattern from its GPU buffer into the peer's in PIECES puts, signals, waits for
/// the peer's signal and checks every byte that landed in its GPU buffer.
fn gpu_put(info: RankInfo) -> R {
    use cudarc::driver::{CudaContext, DevicePtr};
    const N: usize = 1 << 20;
    let store = Store::connect(&info, T).map_err(s)?;
    let (rank, world) = (store.rank(), store.world_size());
    if world != 2 {
        return Err(format!("gpu_put runs on 2 ranks, not {world}"));
    }
    let peer = 1 - rank;
    let ctx = CudaContext::new(0).map_err(s)?;
    let stream = ctx.default_stream();
    // [0, N): what the peer puts; [N, 2N): what this rank sends.
    let host: Vec<u8> = (0..2 * N)
        .map(|k| {
            if k < N {
                0
            } else {
                pattern(0, rank, peer, k - N)
            }
        })
        .collect();
    let buf = stream.clone_htod(&host).map_err(s)?;
    stream.synchronize().map_err(s)?;
    let ptr = buf.device_ptr(&stream).0;
    let mut state = Box::new(DeviceErrorState::default());
    // SAFETY: `state` outlives the transport, which is shut down below.
    let sink = unsafe { ErrorSink::new(&mut *state) };
    let config = NetConfig::from_config(&devcomm::Config::from_env().map_err(s)?);
    // SAFETY: as above.
    let net = unsafe { NetTransport::new(&store, &[peer], sink, config) }.map_err(s)?;
    // SAFETY: `buf` (device memory of 2N bytes) lives until after the shutdown.
    let data_key = unsafe { net.register(&store, ptr, (2 * N) as u64, true) }.map_err(s)?;
    let pad: Box<[AtomicU64]> = (0..2).map(|_| AtomicU64::new(0)).collect();
    // SAFETY: `pad` outlives the transport.
    let pad_key = unsafe { net.register(&store, pad.as_ptr() as u64, 16, false) }.map_err(s)?;
    let q = net.queues().queue(peer, 0).map_err(s)?;
    let piece = N / PIECES;
    for i in 0..PIECES {
        let d = NetDescriptor {
            op: NetOp::Put as u32,
            key: data_key,
            src_offset: (N + i * piece) as u64,
            dst_offset: (i * piece) as u64,
            bytes: piece as u64,
            ..NetDescriptor::default()
        };
        q.enqueue(d, rank, &sink, T).map_err(s)?;
    }
    let signal = NetDescriptor {
        op: NetOp::Signal as u32,
        signal_key: pad_key,
        signal_op: SignalOp::Set as u32,
        signal_offset: (rank * 8) as u64,
        signal_value: 1,
        ..NetDescriptor::default()
    };
    q.enqueue(signal, rank, &sink, T).map_err(s)?;
    host::wait_signal(&pad[peer], 1, (rank, peer as i32, peer as u64), &sink, T).map_err(s)?;
    let got = stream.clone_dtoh(&buf).map_err(s)?;
    if let Some(k) = (0..N).find(|&k| got[k] != pattern(0, peer, rank, k)) {
        return Err(format!(
            "byte {k} from peer {peer} in GPU memory is {:#x}, expected {:#x}",
            got[k],
            pattern(0, peer, rank, k)
        ));
    }
    store.barrier("gpu_put/done", T).map_err(s)?;
    net.check().map_err(s)?;
    net.shutdown(&store).map_err(s)?;
    drop(buf);
    println!("rank {rank}: {N} B put from GPU memory into peer {peer}'s GPU memory, verified");
    Ok(())
}
