//! Network peers: a proxy transport on UCX (docs/NETWORK.md).
//!
//! A producer (a kernel, through `cuda/devcomm/net.cuh`; in the CPU tests a host thread
//! through [`queue::QueueRef::enqueue`]) writes fixed-size descriptors into a queue per (peer,
//! channel) in host memory; one proxy thread per transport drains the queues in order and
//! performs each operation through UCX: puts from registered memory into the peer's
//! registered memory, and signals ordered after the data. Failures become the abort record
//! that device waits write, so the host call returns an error naming the peer.
//!
//! Send/recv with network peers uses it through host staging (`route`, the kernel in
//! `cuda/kernels/sendrecv_net.cu`, the send/recv family's `p2p/net.rs`); the collectives do
//! not yet (docs/NETWORK.md, "Not built yet").
//!
//! Files: `ucx_ffi` (the dlopen'd libucp table), `ucx` (safe owners of UCX objects), `queue`
//! (descriptor rings and credits), `proxy` (the progress thread), `record` (the abort record),
//! `host` (host-side waits), `route` (send/recv's route and staging layout, pure); the structs
//! shared with `net.cuh` are in `abi::net`.
//!
//! The module is crate-private; the network tests reach the transport through
//! `devcomm::testing::net`, which re-exports what they drive (the items marked `pub` here).

pub mod host;
mod proxy;
pub(crate) mod queue;
pub(crate) mod record;
pub(crate) mod route;
mod ucx;
#[cfg(test)]
mod ucx_abi_test;
mod ucx_ffi;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use devcomm_bootstrap::Store;

pub(crate) use crate::abi::net::{NetQueuesHandle, WindowNetHandle};
pub(crate) use crate::error::net::{NetError, Result};
pub(crate) use queue::QueueMemory;
pub(crate) use record::ErrorSink;
use ucx::{Endpoint, MemRegion, RemoteKey, Ucx, Worker};

/// The variable naming libucp (a file, or the directory holding it).
pub const UCX_LIB_ENV: &str = "DEVCOMM_UCX_LIB";

/// Loads libucp as a transport would (`lib`: see [`NetConfig::library`]) and returns where
/// it was found and its version; the error names every path tried.
pub fn probe_library(lib: Option<&str>) -> Result<(std::path::PathBuf, (u32, u32, u32))> {
    let api = ucx_ffi::UcpApi::load(lib)?;
    Ok((api.path.clone(), api.version()))
}

/// Settings of one transport (every rank must pass the same).
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Queues per peer.
    pub channels: u32,
    /// Descriptors per queue.
    pub capacity: u32,
    /// Bound of every store exchange during setup.
    pub setup_timeout: Duration,
    /// How long the proxy lets one UCX operation run before it declares the peer failed.
    pub op_timeout: Duration,
    /// Where libucp is: a file or the directory holding it (only there); `None`: the loader's
    /// search (`LD_LIBRARY_PATH`, the system cache). [`NetConfig::from_config`] takes
    /// `DEVCOMM_UCX_LIB`.
    pub library: Option<String>,
    /// Prefix of this transport's store keys (unique among the transports of a job).
    pub tag: String,
}

impl NetConfig {
    /// The defaults, with the library the configuration names (`DEVCOMM_UCX_LIB`), its setup
    /// timeout, queue capacity and operation timeout.
    pub fn from_config(config: &crate::Config) -> Self {
        Self {
            library: config.ucx_lib.as_ref().map(|p| p.display().to_string()),
            setup_timeout: config.setup_timeout,
            capacity: config.net_queue_capacity,
            op_timeout: config.net_op_timeout,
            ..Self::default()
        }
    }
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            channels: 1,
            capacity: 64,
            setup_timeout: Duration::from_secs(30),
            op_timeout: Duration::from_secs(10),
            library: None,
            tag: "net".to_owned(),
        }
    }
}

/// A registration: the local region and each peer's (base, length, remote key).
pub(crate) struct Registration {
    pub(crate) local: MemRegion,
    pub(crate) remote: Vec<Option<(u64, u64, RemoteKey)>>,
}

/// What the proxy and the host share under the lock. Field order is drop order: remote keys
/// go before the endpoints, the endpoints (closed explicitly) before the worker.
pub(crate) struct Inner {
    pub(crate) regs: BTreeMap<u32, Registration>,
    pub(crate) eps: Vec<Option<Endpoint>>,
    pub(crate) worker: Worker,
}

/// State shared with the proxy thread.
pub(crate) struct Shared {
    inner: Mutex<Inner>,
    pub(crate) stop: AtomicBool,
    pub(crate) paused: AtomicBool,
    /// Per peer: the first error status UCX reported for its endpoint (0: none).
    pub(crate) failed: Box<[AtomicI32]>,
    pub(crate) sink: ErrorSink,
    pub(crate) rank: usize,
    pub(crate) op_timeout: Duration,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The network transport of one communicator: UCX worker, endpoints to every network peer,
/// registrations with their remote keys, the descriptor queues and the proxy thread.
pub struct NetTransport {
    ucx: Arc<Ucx>,
    shared: Arc<Shared>,
    queues: Arc<QueueMemory>,
    proxy: Option<JoinHandle<()>>,
    rank: usize,
    world: usize,
    /// The key the next registration gets (registrations are collective and in the same
    /// order everywhere, so keys agree on every rank).
    next_key: Mutex<u32>,
    config: NetConfig,
}

impl std::fmt::Debug for NetTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetTransport")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("library", &self.ucx.api().path)
            .field("config", &self.config)
            .finish()
    }
}

impl NetTransport {
    /// Collective: loads UCX, creates the worker, exchanges worker addresses through `store`
    /// and connects to every rank in `peers` (network peers), then starts the proxy.
    ///
    /// # Safety
    /// `sink` must stay valid until the transport is dropped (see [`ErrorSink::new`]).
    pub unsafe fn new(
        store: &Store,
        peers: &[usize],
        sink: ErrorSink,
        config: NetConfig,
    ) -> Result<Self> {
        let queues = QueueMemory::new(store.world_size() as u32, config.channels, config.capacity);
        // SAFETY: the caller's contract is the one `with_queues` needs.
        unsafe { Self::with_queues(store, peers, sink, config, queues) }
    }

    /// [`new`](Self::new) with queues the caller laid out (e.g. with
    /// [`QueueMemory::borrowed`] in host-mapped memory for GPU producers). A rank whose
    /// `queues` is an error, or does not match the world and `config`, fails the setup of
    /// every rank.
    ///
    /// # Safety
    /// As for [`new`](Self::new).
    pub(crate) unsafe fn with_queues(
        store: &Store,
        peers: &[usize],
        sink: ErrorSink,
        config: NetConfig,
        queues: Result<QueueMemory>,
    ) -> Result<Self> {
        let rank = store.rank();
        let world = store.world_size();
        let queues = queues.and_then(|q| {
            if let Some(&p) = peers.iter().find(|&&p| p >= world || p == rank) {
                return Err(NetError::InvalidArgument {
                    op: "network transport",
                    reason: format!(
                        "peer {p} is this rank ({rank}) or outside the world of {world}"
                    ),
                });
            }
            let shape = (q.world_size() as usize, q.channels(), q.capacity());
            if shape != (world, config.channels, config.capacity) {
                return Err(NetError::InvalidArgument {
                    op: "network transport",
                    reason: format!(
                        "queues for (world, channels, capacity) = {shape:?}, expected \
                         ({world}, {}, {})",
                        config.channels, config.capacity
                    ),
                });
            }
            Ok(Arc::new(q))
        });
        // Every rank loads and publishes, even one that fails, so nobody waits for it in vain.
        let local = queues.and_then(|queues| {
            let ucx = Ucx::new(config.library.as_deref(), rank)?;
            let worker = Worker::new(&ucx)?;
            let addr = worker.address()?;
            Ok((ucx, worker, addr, queues))
        });
        let payload = local
            .as_ref()
            .map(|(_, _, addr, _)| addr.clone())
            .map_err(ToString::to_string);
        let all = agree(
            store,
            &config,
            "load UCX and publish the worker address",
            payload,
        )?;
        let (ucx, worker, _, queues) = local?;
        let failed: Box<[AtomicI32]> = (0..world).map(|_| AtomicI32::new(0)).collect();
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                regs: BTreeMap::new(),
                eps: (0..world).map(|_| None).collect(),
                worker,
            }),
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            failed,
            sink,
            rank,
            op_timeout: config.op_timeout,
        });
        let connected: std::result::Result<Vec<u8>, String> = (|| {
            let mut inner = shared.lock();
            for &p in peers {
                let ep = inner.worker.connect(p, &all[p], &shared.failed[p])?;
                inner.eps[p] = Some(ep);
            }
            Ok(Vec::new())
        })()
        .map_err(|e: NetError| e.to_string());
        agree(store, &config, "connect", connected)?;
        let mut queue_refs = Vec::new();
        for &p in peers {
            for c in 0..config.channels as usize {
                queue_refs.push(queues.queue(p, c)?);
            }
        }
        let proxy_shared = shared.clone();
        let _keep = queues.clone();
        let proxy = std::thread::Builder::new()
            .name(format!("devcomm-net-proxy-{rank}"))
            .spawn(move || {
                let _queues = _keep;
                proxy::run(proxy_shared, queue_refs)
            })
            .map_err(|e| NetError::InvalidArgument {
                op: "network transport",
                reason: format!("could not start the proxy thread: {e}"),
            })?;
        Ok(Self {
            ucx,
            shared,
            queues,
            proxy: Some(proxy),
            rank,
            world,
            next_key: Mutex::new(1),
            config,
        })
    }

    /// The queues (for producers).
    pub fn queues(&self) -> &QueueMemory {
        &self.queues
    }

    /// Where libucp was loaded from, and its version.
    pub(crate) fn library(&self) -> (std::path::PathBuf, (u32, u32, u32)) {
        (self.ucx.api().path.clone(), self.ucx.api().version())
    }

    /// Stops (`true`) or resumes the proxy's draining of the queues (it keeps progressing
    /// UCX); for tests and diagnostics of a stuck proxy.
    pub fn set_paused(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::Release);
    }

    /// Collective: registers `len` bytes at `base` (host memory, or device memory with
    /// `cuda`) with UCX and exchanges the remote keys through `store`. Every rank registers
    /// the same sequence of buffers; the returned key (the `lkey` of `RegisteredBuffer`,
    /// never 0) is the same on every rank and names the buffer in descriptors.
    ///
    /// # Safety
    /// The memory must stay allocated until [`deregister`](Self::deregister) (or the drop of
    /// the transport).
    pub unsafe fn register(&self, store: &Store, base: u64, len: u64, cuda: bool) -> Result<u32> {
        // Every rank takes the key before anything can fail, so a failed registration (on
        // every rank alike: the steps agree) never reuses its store tags.
        let key = {
            let mut next_key = self.next_key.lock().unwrap_or_else(PoisonError::into_inner);
            *next_key += 1;
            *next_key - 1
        };
        // SAFETY: the caller keeps the memory alive until deregistration.
        let local = unsafe { self.ucx.map(base, len, cuda) }.and_then(|r| Ok((r.pack_rkey()?, r)));
        let payload = local
            .as_ref()
            .map(|(packed, _)| [&base.to_le_bytes()[..], &len.to_le_bytes(), packed].concat())
            .map_err(ToString::to_string);
        let step = format!("register buffer {key}");
        let all = agree(store, &self.config, &step, payload)?;
        let (_, local) = local?;
        let unpacked = self.unpack(&all);
        let ok = unpacked
            .as_ref()
            .map(|_| Vec::new())
            .map_err(ToString::to_string);
        agree(
            store,
            &self.config,
            &format!("{step}: unpack the remote keys"),
            ok,
        )?;
        let remote = unpacked?;
        let mut inner = self.shared.lock();
        inner.regs.insert(key, Registration { local, remote });
        Ok(key)
    }

    /// Unpacks every peer's `(base, len, packed key)` on its endpoint.
    fn unpack(&self, all: &[Vec<u8>]) -> Result<Vec<Option<(u64, u64, RemoteKey)>>> {
        let inner = self.shared.lock();
        let mut remote: Vec<Option<(u64, u64, RemoteKey)>> =
            (0..self.world).map(|_| None).collect();
        for (p, blob) in all.iter().enumerate() {
            let Some(ep) = inner.eps[p].as_ref() else {
                continue;
            };
            if blob.len() < 16 {
                return Err(NetError::InvalidArgument {
                    op: "network registration",
                    reason: format!("rank {p} published {} bytes, fewer than 16", blob.len()),
                });
            }
            let word = |i: usize| u64::from_le_bytes(blob[i..i + 8].try_into().expect("8 bytes"));
            let rkey = inner.worker.unpack_rkey(ep, &blob[16..])?;
            remote[p] = Some((word(0), word(8), rkey));
        }
        Ok(remote)
    }

    /// Collective: forgets registration `key` on every rank (a barrier first, so that no
    /// peer still starts operations on it), releasing the remote keys and the UCX mapping.
    /// Producers must have flushed their operations on it.
    pub fn deregister(&self, store: &Store, key: u32) -> Result<()> {
        if !self.shared.lock().regs.contains_key(&key) {
            return Err(NetError::InvalidArgument {
                op: "network deregistration",
                reason: format!("rank {}: no registration with key {key}", self.rank),
            });
        }
        self.releaser().release(store, key)
    }

    /// What releases registrations without borrowing the transport: an owner of registered
    /// memory that may outlive the transport's owner (a window) keeps it. After the
    /// transport is gone, releasing forgets nothing (its close released every registration).
    pub(crate) fn releaser(&self) -> KeyReleaser {
        KeyReleaser {
            shared: self.shared.clone(),
            tag: self.config.tag.clone(),
            timeout: self.config.setup_timeout,
        }
    }

    /// `Ok(())` while no failure was recorded; else the failure (naming the peer).
    pub fn check(&self) -> Result<()> {
        self.shared.sink.check(self.rank)
    }

    /// Collective shutdown: a barrier (every rank's operations done), stops the proxy, a second
    /// barrier (every proxy stopped, so closing raises no failure), closes the endpoints.
    /// Without a clean shutdown (drop), endpoints are closed by force.
    pub fn shutdown(self, store: &Store) -> Result<()> {
        let t = self.config.setup_timeout;
        self.shutdown_by(|tag| Ok(store.barrier(tag, t)?))
    }

    /// [`shutdown`](Self::shutdown) with the caller's barrier (given each barrier's tag): a
    /// communicator passes its tear-down barrier, which stops waiting for a failed peer.
    /// A failed barrier leaves the endpoints to be closed by force (drop).
    pub(crate) fn shutdown_by(mut self, mut barrier: impl FnMut(&str) -> Result<()>) -> Result<()> {
        barrier(&format!("{}/fini/1", self.config.tag))?;
        self.stop_proxy();
        barrier(&format!("{}/fini/2", self.config.tag))?;
        self.close(false);
        Ok(())
    }

    fn stop_proxy(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(h) = self.proxy.take() {
            if h.join().is_err() {
                log::error!("rank {}: the network proxy thread panicked", self.rank);
            }
        }
    }

    fn close(&mut self, force: bool) {
        let mut inner = self.shared.lock();
        inner.regs.clear();
        let eps: Vec<Endpoint> = inner.eps.iter_mut().filter_map(Option::take).collect();
        inner.worker.close(eps, force, Duration::from_secs(2));
    }
}

/// Releases registrations of a transport ([`NetTransport::releaser`]).
pub(crate) struct KeyReleaser {
    shared: Arc<Shared>,
    tag: String,
    timeout: Duration,
}

impl std::fmt::Debug for KeyReleaser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyReleaser")
            .field("tag", &self.tag)
            .finish()
    }
}

impl KeyReleaser {
    /// Collective: a barrier (no peer starts operations on `key` after it), then forgets
    /// registration `key` here (its remote keys and UCX mapping).
    pub(crate) fn release(&self, store: &Store, key: u32) -> Result<()> {
        store.barrier(&self.barrier_tag(key), self.timeout)?;
        self.forget(key);
        Ok(())
    }

    /// The store tag of the barrier before `key` is forgotten (for callers with a barrier of
    /// their own, such as a communicator's tear-down barrier).
    pub(crate) fn barrier_tag(&self, key: u32) -> String {
        format!("{}/dereg/{key}", self.tag)
    }

    /// Forgets registration `key` here, without a barrier (the caller had one).
    pub(crate) fn forget(&self, key: u32) {
        self.shared.lock().regs.remove(&key);
    }
}

/// One setup step's agreement: every rank publishes its outcome (`Ok(payload)` or its error)
/// and gets every rank's payload, or, if any rank failed, the same [`NetError::Setup`] naming
/// every failed rank.
fn agree(
    store: &Store,
    config: &NetConfig,
    step: &str,
    outcome: std::result::Result<Vec<u8>, String>,
) -> Result<Vec<Vec<u8>>> {
    let blob = match &outcome {
        Ok(p) => [&[1u8][..], p].concat(),
        Err(e) => [&[0u8][..], e.as_bytes()].concat(),
    };
    let tag = format!("{}/agree/{step}", config.tag);
    let all = store.all_gather(&tag, &blob, config.setup_timeout)?;
    let failures: Vec<(usize, String)> = all
        .iter()
        .enumerate()
        .filter(|(_, b)| b.first() != Some(&1))
        .map(|(r, b)| {
            (
                r,
                String::from_utf8_lossy(b.get(1..).unwrap_or(&[])).into_owned(),
            )
        })
        .collect();
    if !failures.is_empty() {
        return Err(NetError::Setup {
            step: step.to_owned(),
            failures,
        });
    }
    Ok(all.into_iter().map(|mut b| b.split_off(1)).collect())
}

impl Drop for NetTransport {
    fn drop(&mut self) {
        self.stop_proxy();
        self.close(true);
    }
}
