//! Host twin of the network send/recv route (`cuda/kernels/sendrecv_net.cu`,
//! `cuda/devcomm/net_p2p.cuh`, docs/NETWORK.md "Send/recv over the network"): the same staging
//! layout (`devcomm::testing::net::route::StagingLayout`), chunk headers, READY/FREE words, credits and
//! refusal, with host threads standing in for the kernel's two roles, over real UCX. What the
//! CPU can check: that the route's offsets, words and descriptors work with the proxy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use devcomm::abi::net::{NetDescriptor, NetOp, SignalOp};
use devcomm::abi::DeviceErrorState;
use devcomm::testing::net::route::{
    chunks, refusal, refused, ChunkHeader, StagingLayout, CHANNELS, CHANNEL_CREDIT, CHANNEL_DATA,
    HEADER_BYTES, KIND_SENDRECV,
};
use devcomm::testing::net::{host, ErrorSink, NetConfig, NetTransport};
use devcomm_bootstrap::{RankInfo, Store};

use super::{s, R, T};

/// Small slots, two of them, so that messages wrap the ring and wait for credits.
const SLOT_BYTES: u64 = 4096;
const SLOTS: u32 = 2;

struct RouteRank {
    /// First field: dropped before the store and the staging.
    net: Option<NetTransport>,
    store: Store,
    /// The staging (u64 for alignment); accessed through `base` once registered.
    _staging: Vec<u64>,
    base: usize,
    layout: StagingLayout,
    key: u32,
    /// Per peer: chunks sent, calls sent, chunks received, calls received (the kernel's
    /// device counters).
    counters: Mutex<Vec<[u64; 4]>>,
    _state: Box<DeviceErrorState>,
    sink: ErrorSink,
}

impl RouteRank {
    fn new(info: &RankInfo) -> Result<Self, String> {
        let store = Store::connect(info, T).map_err(s)?;
        let (me, world) = (store.rank(), store.world_size());
        let mut state = Box::new(DeviceErrorState::default());
        // SAFETY: the box lives in `RouteRank`, whose transport is dropped first.
        let sink = unsafe { ErrorSink::new(&mut *state) };
        let peers: Vec<usize> = (0..world).filter(|&p| p != me).collect();
        let config = NetConfig {
            channels: CHANNELS,
            ..NetConfig::from_config(&devcomm::Config::from_env().map_err(s)?)
        };
        // SAFETY: as above.
        let net = unsafe { NetTransport::new(&store, &peers, sink, config) }.map_err(s)?;
        let layout = StagingLayout::new(world, SLOTS, SLOT_BYTES).map_err(s)?;
        let total = layout.total().ok_or("staging size overflows")?;
        let staging = vec![0u64; total.div_ceil(8) as usize];
        // SAFETY: `staging` is never reallocated and outlives the transport.
        let key =
            unsafe { net.register(&store, staging.as_ptr() as u64, total, false) }.map_err(s)?;
        let base = staging.as_ptr() as usize;
        Ok(Self {
            net: Some(net),
            store,
            _staging: staging,
            base,
            layout,
            key,
            counters: Mutex::new(vec![[0; 4]; world]),
            _state: state,
            sink,
        })
    }

    fn me(&self) -> usize {
        self.store.rank()
    }

    fn word(&self, index: u64) -> &AtomicU64 {
        assert!(8 * (index + 1) <= self.layout.words_bytes());
        // SAFETY: inside the staging's word area (8-byte aligned); the words are only accessed
        // atomically here and written by UCX as whole aligned words.
        unsafe { AtomicU64::from_ptr((self.base + 8 * index as usize) as *mut u64) }
    }

    fn ptr(&self, offset: u64) -> *mut u8 {
        assert!(offset < self.layout.total().expect("checked"));
        (self.base + offset as usize) as *mut u8
    }

    fn enqueue(&self, peer: usize, channel: u32, d: NetDescriptor) -> Result<u64, String> {
        let net = self.net.as_ref().expect("transport");
        let q = net.queues().queue(peer, channel as usize).map_err(s)?;
        q.enqueue(d, self.me(), &self.sink, T).map_err(s)
    }

    fn signal(&self, word: u64, value: u64) -> NetDescriptor {
        NetDescriptor {
            op: NetOp::Signal as u32,
            signal_key: self.key,
            signal_op: SignalOp::Set as u32,
            signal_offset: 8 * word,
            signal_value: value,
            ..NetDescriptor::default()
        }
    }

    /// The sender's wait on FREE[peer] (a credit, or the end of the call), and its refusal.
    fn wait_free(&self, peer: usize, needed: u64) -> Result<(), String> {
        let word = self.word(StagingLayout::free_word(peer));
        host::wait_signal(word, needed, (self.me(), peer as i32, 0), &self.sink, T).map_err(s)?;
        match refused(word.load(Ordering::Acquire)) {
            Some((field, theirs)) => {
                Err(format!("refused by peer {peer}: field {field}, {theirs}"))
            }
            None => Ok(()),
        }
    }

    /// The send role: `data` to `peer`.
    fn send(&self, peer: usize, data: &[u8]) -> R {
        let [sent, calls, _, _] = self.counters.lock().map_err(s)?[peer];
        let call = calls + 1;
        let (slots, slot_bytes) = (self.layout.slots, self.layout.slot_bytes);
        let n = chunks(data.len() as u64, slot_bytes);
        for i in 0..n {
            let j = sent + i;
            let slot = j % slots;
            if j >= slots {
                self.wait_free(peer, j - slots + 1)?;
            }
            let off = (i * slot_bytes) as usize;
            let len = (data.len() - off).min(slot_bytes as usize);
            let out = self.layout.outbox(peer, slot);
            let header = ChunkHeader {
                kind: KIND_SENDRECV,
                chunk: i as u32,
                call,
                bytes: data.len() as u64,
                op: 0,
                rows: 0,
                reserved: [0; 3],
            };
            // SAFETY: the outbox slot holds HEADER_BYTES + slot_bytes bytes; the credit above
            // says the proxy finished reading its previous use.
            unsafe {
                std::ptr::write_unaligned(self.ptr(out).cast::<ChunkHeader>(), header);
                std::ptr::copy_nonoverlapping(
                    data[off..].as_ptr(),
                    self.ptr(out + HEADER_BYTES),
                    len,
                );
            }
            let d = NetDescriptor {
                op: NetOp::PutSignal as u32,
                key: self.key,
                src_offset: out,
                dst_offset: self.layout.inbox(self.me(), slot),
                bytes: HEADER_BYTES + len as u64,
                ..self.signal(StagingLayout::ready_word(self.me()), j + 1)
            };
            self.enqueue(peer, CHANNEL_DATA, d)?;
        }
        self.wait_free(peer, sent + n)?;
        let mut c = self.counters.lock().map_err(s)?;
        c[peer][0] = sent + n;
        c[peer][1] = call;
        Ok(())
    }

    /// The receive role: `bytes` from `peer`, each chunk's header checked before its payload
    /// is copied out; a header that differs is refused (FREE set to the refusal, flushed).
    fn recv(&self, peer: usize, bytes: usize) -> Result<Vec<u8>, String> {
        let [_, _, received, calls] = self.counters.lock().map_err(s)?[peer];
        let call = calls + 1;
        let (slots, slot_bytes) = (self.layout.slots, self.layout.slot_bytes);
        let n = chunks(bytes as u64, slot_bytes);
        let mut out = vec![0u8; bytes];
        let ready = self.word(StagingLayout::ready_word(peer));
        for i in 0..n {
            let j = received + i;
            let slot = j % slots;
            let site = (self.me(), peer as i32, slot);
            host::wait_signal(ready, j + 1, site, &self.sink, T).map_err(s)?;
            let inbox = self.layout.inbox(peer, slot);
            // SAFETY: the READY word (acquire) says the slot holds chunk j, whole.
            let h = unsafe { std::ptr::read_unaligned(self.ptr(inbox).cast::<ChunkHeader>()) };
            let differs = if h.kind != KIND_SENDRECV || u64::from(h.chunk) != i {
                Some((1, u64::from(KIND_SENDRECV), u64::from(h.kind)))
            } else if h.bytes != bytes as u64 {
                Some((2, bytes as u64, h.bytes))
            } else if h.call != call {
                Some((5, call, h.call))
            } else {
                None
            };
            if let Some((field, mine, theirs)) = differs {
                self.enqueue(
                    peer,
                    CHANNEL_CREDIT,
                    self.signal(StagingLayout::free_word(self.me()), refusal(field, mine)),
                )?;
                let net = self.net.as_ref().expect("transport");
                let q = net
                    .queues()
                    .queue(peer, CHANNEL_CREDIT as usize)
                    .map_err(s)?;
                q.flush(self.me(), &self.sink, T).map_err(s)?;
                return Err(format!(
                    "mismatch with peer {peer}: field {field} is {mine} here, {theirs} there"
                ));
            }
            let off = (i * slot_bytes) as usize;
            let len = (bytes - off).min(slot_bytes as usize);
            // SAFETY: as above; the sender does not rewrite the slot before our credit.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.ptr(inbox + HEADER_BYTES),
                    out[off..].as_mut_ptr(),
                    len,
                );
            }
            self.enqueue(
                peer,
                CHANNEL_CREDIT,
                self.signal(StagingLayout::free_word(self.me()), j + 1),
            )?;
        }
        let mut c = self.counters.lock().map_err(s)?;
        c[peer][2] = received + n;
        c[peer][3] = call;
        Ok(out)
    }

    fn finish(mut self) -> R {
        let net = self.net.take().expect("transport");
        net.check().map_err(s)?;
        net.shutdown(&self.store).map_err(s)
    }
}

/// Message `call` from `from` (deterministic bytes).
fn message(call: usize, from: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u64 * 131 + call as u64 * 7 + from as u64 * 1_000_003) as u8)
        .collect()
}

/// Every rank sends to the next and receives from the one before, in both roles at once, over
/// messages that fit a slot, wrap the ring and wait for credits; every byte checked. Then
/// rank 0 sends 100 B to rank 1, which expects 200 B: both sides must see the refusal.
pub fn route(info: RankInfo) -> R {
    let r = RouteRank::new(&info)?;
    let (me, world) = (r.me(), r.store.world_size());
    let (next, prev) = ((me + 1) % world, (me + world - 1) % world);
    let sizes = [
        8usize,
        4099,
        3 * SLOT_BYTES as usize + 5,
        1,
        2 * SLOT_BYTES as usize,
    ];
    let calls = 3 * sizes.len();
    for call in 0..calls {
        let len = sizes[call % sizes.len()];
        let mine = message(call, me, len);
        let got = std::thread::scope(|sc| {
            let sender = sc.spawn(|| r.send(next, &mine));
            let got = r.recv(prev, len);
            sender
                .join()
                .map_err(|_| "send thread panicked".to_string())??;
            got
        })?;
        if got != message(call, prev, len) {
            let k = got
                .iter()
                .zip(message(call, prev, len))
                .position(|(a, b)| *a != b);
            return Err(format!(
                "rank {me} call {call} ({len} B): byte {k:?} differs"
            ));
        }
    }
    println!("rank {me}: route {calls} calls verified");
    r.store.barrier("route/mismatch", T).map_err(s)?;
    match me {
        0 => match r.send(1, &message(99, 0, 100)) {
            Err(e) if e.contains("refused by peer 1: field 2, 200") => {
                println!("rank 0: refusal seen: {e}")
            }
            other => return Err(format!("rank 0: expected the refusal, got {other:?}")),
        },
        1 => match r.recv(0, 200) {
            Err(e) if e.contains("field 2 is 200 here, 100 there") => {
                println!("rank 1: mismatch seen: {e}")
            }
            other => return Err(format!("rank 1: expected a mismatch, got {other:?}")),
        },
        _ => {}
    }
    r.store.barrier("route/done", T).map_err(s)?;
    r.finish()
}
