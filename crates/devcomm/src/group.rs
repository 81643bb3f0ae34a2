//! The process group every layer above bootstrap works in: rank, store, CUDA context,
//! topology and the host-mapped error state. Owned by [`crate::Comm`]; windows and
//! registrations hold an `Arc<Group>` so they can release peers' mappings in order on drop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use devcomm_bootstrap::Store;

use crate::config::Config;
use crate::cuda::ErrorState;
use crate::error::{Error, Result};
use crate::topology::Topology;

/// Shared state of one communicator.
#[derive(Debug)]
pub(crate) struct Group {
    /// Global rank.
    pub(crate) rank: usize,
    /// Number of ranks.
    pub(crate) world_size: usize,
    /// The job's store.
    pub(crate) store: Store,
    /// This rank's CUDA context (device `local_rank` unless configured otherwise).
    pub(crate) ctx: Arc<CudaContext>,
    /// Link kind of every peer.
    pub(crate) topology: Topology,
    /// Each peer's transport, decided at setup: what the operation families ask.
    pub(crate) mesh: crate::mesh::Mesh,
    /// Host-mapped error record and abort flag shared by all of this communicator's kernels.
    pub(crate) errors: ErrorState,
    /// Bound of every device wait.
    pub(crate) device_timeout: Duration,
    /// Bound of every host-side setup step (store operations).
    pub(crate) setup_timeout: Duration,
    /// Launch devcomm's kernels with programmatic dependent launch: the GPU supports it
    /// (compute capability 9.0 or newer) and `DEVCOMM_PDL` is not `0` (`cuda::launch_struct`).
    pub(crate) pdl: bool,
    /// The communicator's settings (docs/CONFIG.md), fixed when it was built.
    pub(crate) config: Arc<Config>,
    /// Sequence number that makes collective setup tags unique (same order on every rank).
    seq: AtomicU64,
    /// Whether this rank marked its failure in the store ([`Group::teardown_barrier`]).
    marked_failed: std::sync::atomic::AtomicBool,
    /// The trace ring and host calls (`DEVCOMM_TRACE=1`), set once at build.
    pub(crate) trace: std::sync::OnceLock<crate::trace::DeviceTrace>,
}

impl Group {
    pub(crate) fn new(
        rank: usize,
        world_size: usize,
        store: Store,
        ctx: Arc<CudaContext>,
        (topology, mesh): (Topology, crate::mesh::Mesh),
        errors: ErrorState,
        config: Arc<Config>,
    ) -> Self {
        let pdl = config.pdl && ctx.compute_capability().is_ok_and(|(major, _)| major >= 9);
        Self {
            pdl,
            device_timeout: config.device_timeout,
            setup_timeout: config.setup_timeout,
            config,
            rank,
            world_size,
            store,
            ctx,
            topology,
            mesh,
            errors,
            seq: AtomicU64::new(0),
            marked_failed: false.into(),
            trace: std::sync::OnceLock::new(),
        }
    }

    /// The host side of one call launched on `stream` ([`crate::trace::CallScope`]): its
    /// NVTX range and, tracing on, its record and id.
    pub(crate) fn call_scope(
        &self,
        stream: &cudarc::driver::CudaStream,
        info: impl FnOnce() -> crate::trace::CallInfo,
    ) -> crate::trace::CallScope<'_> {
        crate::trace::CallScope::open(self.trace.get(), stream, info)
    }

    /// Runs `load` (a kernel's compile: no GPU work, see `kernel_load::load`) with this rank
    /// marked as loading in the store (a counter other ranks read, [`KernelGate`]): a peer
    /// waiting at a gate keeps waiting while this rank loads, and gives up within the device
    /// timeout once it does not.
    pub(crate) fn loading<T>(&self, load: impl FnOnce() -> Result<T>) -> Result<T> {
        let key = loading_key(self.rank);
        self.store.add(&key, 1)?;
        let result = load();
        self.store.add(&key, -1)?;
        result
    }

    /// The barrier of a tear-down step `tag`: every rank arrives before any frees what peers
    /// may still use. Once this communicator has failed it does not wait (a peer may be dead,
    /// and each barrier would hold for the setup timeout: a communicator has several); it marks
    /// the failure in the store instead, and a healthy rank waiting at a tear-down barrier
    /// stops waiting when it sees that mark (its peer will not come).
    pub(crate) fn teardown_barrier(&self, tag: &str) -> Result<()> {
        self.teardown_arrive(tag)?;
        self.teardown_wait(tag)
    }

    /// The arrival half of [`teardown_barrier`](Self::teardown_barrier): marks this rank as
    /// arrived at step `tag` and returns at once. A rank that releases something alone (a
    /// registration dropped on one rank) arrives this way, so that peers meeting at the same
    /// step later count it and never wait for it.
    pub(crate) fn teardown_arrive(&self, tag: &str) -> Result<()> {
        if self.mark_failure_instead()? {
            return Ok(());
        }
        teardown_arrive(&self.store, self.rank, tag)
    }

    /// The waiting half of [`teardown_barrier`](Self::teardown_barrier), after
    /// [`teardown_arrive`](Self::teardown_arrive): returns once every rank arrived at `tag`
    /// (or a peer marked its failure); an error naming the ranks that did not arrive within the
    /// setup timeout.
    pub(crate) fn teardown_wait(&self, tag: &str) -> Result<()> {
        if self.errors.is_aborted() {
            return Ok(());
        }
        teardown_wait(
            &self.store,
            self.rank,
            self.world_size,
            tag,
            self.setup_timeout,
        )
    }

    /// A failed communicator marks its failure in the store (once) instead of meeting its
    /// peers at a tear-down step; true when it did.
    fn mark_failure_instead(&self) -> Result<bool> {
        if !self.errors.is_aborted() {
            return Ok(false);
        }
        if !self.marked_failed.swap(true, Ordering::AcqRel) {
            self.store.add(FAILED_KEY, 1)?;
        }
        Ok(true)
    }

    /// A tag unique to this collective call: every rank makes setup calls in the same order,
    /// so the n-th call has the same tag everywhere.
    pub(crate) fn next_tag(&self, what: &str) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{what}#{n}")
    }

    /// Ends a collective setup step with an agreement: every rank shares whether its part
    /// succeeded; if any failed, every rank returns [`Error::Setup`] naming the failed ranks.
    /// A rank whose own part failed gets that same error (its own message included).
    pub(crate) fn agree<T>(&self, step: &str, local: Result<T>) -> Result<T> {
        let tag = self.next_tag(&format!("agree/{step}"));
        agree_on(&self.store, &tag, step, local, self.setup_timeout)
    }
}

/// The agreement protocol, usable before a `Group` exists: every rank all-gathers its status
/// under `tag` (empty for success, `!` + message for failure); if any rank failed, every rank
/// returns [`Error::Setup`] naming the failed ranks and their messages.
pub(crate) fn agree_on<T>(
    store: &Store,
    tag: &str,
    step: &str,
    local: Result<T>,
    timeout: Duration,
) -> Result<T> {
    let status = match &local {
        Ok(_) => Vec::new(),
        Err(e) => format!("!{e}").into_bytes(),
    };
    let all = store.all_gather(tag, &status, timeout)?;
    let failures: Vec<(usize, String)> = all
        .iter()
        .enumerate()
        .filter(|(_, s)| s.first() == Some(&b'!'))
        .map(|(r, s)| (r, String::from_utf8_lossy(&s[1..]).into_owned()))
        .collect();
    if failures.is_empty() {
        local
    } else {
        Err(Error::Setup {
            step: step.to_owned(),
            failures,
        })
    }
}

/// The store counter of kernel loads in progress on `rank` ([`Group::loading`]).
fn loading_key(rank: usize) -> String {
    format!("__devcomm/kernel-loading/{rank}")
}

/// The store counter of ranks that tore down after a failure ([`Group::teardown_barrier`]).
const FAILED_KEY: &str = "__devcomm/teardown-failed";

/// A healthy rank's tear-down barrier: arrives at `tag`, then waits for every rank, or until a
/// rank marks a failure ([`FAILED_KEY`]), at most `timeout`.
/// The store key of `rank`'s arrival at tear-down step `tag`.
fn arrival_key(tag: &str, rank: usize) -> String {
    format!("{tag}/arrived/{rank}")
}

/// Marks `rank` as arrived at tear-down step `tag`.
fn teardown_arrive(store: &Store, rank: usize, tag: &str) -> Result<()> {
    Ok(store.set(&arrival_key(tag, rank), b"1")?)
}

/// Waits until every rank arrived at tear-down step `tag`, or a peer marked its failure;
/// after `timeout`, an error naming the ranks that have not arrived.
fn teardown_wait(
    store: &Store,
    rank: usize,
    world_size: usize,
    tag: &str,
    timeout: Duration,
) -> Result<()> {
    let keys: Vec<String> = (0..world_size).map(|r| arrival_key(tag, r)).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let start = std::time::Instant::now();
    loop {
        if store.wait(&keys, GATE_POLL).is_ok() {
            return Ok(());
        }
        if store.add(FAILED_KEY, 0)? > 0 {
            return Ok(()); // a peer failed and tears down alone
        }
        if start.elapsed() >= timeout {
            let missing: Vec<usize> = (0..world_size)
                .filter(|&r| store.wait(&[keys[r]], Duration::ZERO).is_err())
                .collect();
            return Err(Error::Setup {
                step: format!("tear-down barrier `{tag}`"),
                failures: vec![(
                    rank,
                    format!(
                        "rank(s) {missing:?} did not arrive within the setup timeout ({timeout:?})"
                    ),
                )],
            });
        }
    }
}

/// Waits until no rank of the `world` is loading a kernel ([`Group::loading`]); an error naming
/// the ranks still loading after `timeout`.
fn wait_while_loading(store: &Store, rank: usize, world: usize, timeout: Duration) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        let mut loading = Vec::new();
        for r in (0..world).filter(|&r| r != rank) {
            if store.add(&loading_key(r), 0)? > 0 {
                loading.push(r);
            }
        }
        if loading.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(Error::Setup {
                step: "kernel load gate".into(),
                failures: vec![(
                    rank,
                    format!(
                        "rank(s) {loading:?} still loading kernels after the setup timeout \
                         ({timeout:?})"
                    ),
                )],
            });
        }
        std::thread::sleep(GATE_POLL);
    }
}

/// How often a gate looks at the store while it waits.
const GATE_POLL: Duration = Duration::from_millis(50);

/// What a gate does after one look at a peer that has not announced the kernel: pass on
/// waiting, or give up (pure; the heart of [`KernelGate::pass`]). A peer that is loading a
/// kernel (any) may take long: it is waited for up to the setup timeout. A peer that loads
/// nothing and still has not announced this kernel `device_timeout` after it was last seen
/// loading (or after the wait began) is in another call: give up then.
pub(crate) fn gate_gives_up(
    waited: Duration,
    idle: Duration,
    setup_timeout: Duration,
    device_timeout: Duration,
) -> Option<&'static str> {
    if waited >= setup_timeout {
        Some("did not load it within the setup timeout")
    } else if idle >= device_timeout {
        Some(
            "loads no kernel and has not loaded this one within the device timeout (it makes \
             another call)",
        )
    } else {
        None
    }
}

/// Kernels are compiled by NVRTC on each rank's first use (or read from the disk cache), so
/// ranks can be ready to launch a new kernel seconds apart: a rank that compiles while its
/// peer already waits on the device for it would make the peer's kernel time out (the device
/// wait bound is [`Group::device_timeout`], 10 s by default, and a compile can take longer).
/// A gate per loaded kernel closes that gap on the host: after loading, a rank announces it
/// in the store, and before its first launch towards a peer it waits until that peer has
/// announced too: up to the setup timeout while the peer is loading kernels (it marks that in
/// the store, [`Group::loading`]), and only up to the device timeout once it loads none (a
/// peer in another call: [`gate_gives_up`]). After the first launch towards every peer the
/// check is one atomic load per peer.
///
/// The announcement's key names the kernel and the rank. It needs no communicator id: every
/// communicator joins a store of its own (`CommBuilder::build` connects to the store server
/// that its rank 0 starts on the job's port, or is given a fresh one by
/// `CommBuilder::on_store`), so no two communicators share keys.
#[derive(Debug)]
pub(crate) struct KernelGate {
    name: String,
    announced: std::sync::atomic::AtomicBool,
    ready: Vec<std::sync::atomic::AtomicBool>,
}

impl KernelGate {
    /// A gate for the kernel `name` (unique per kernel source and instantiation).
    pub(crate) fn new(name: impl Into<String>, world_size: usize) -> Self {
        Self {
            name: name.into(),
            announced: false.into(),
            ready: (0..world_size).map(|_| false.into()).collect(),
        }
    }

    fn key(&self, rank: usize) -> String {
        format!("__devcomm/kernel-loaded/{}/{rank}", self.name)
    }

    /// Announces this rank's load (once), then waits until every rank of `peers` has
    /// announced its own. Call after loading the kernel, before launching it.
    pub(crate) fn pass(&self, group: &Group, peers: impl IntoIterator<Item = usize>) -> Result<()> {
        let limits = (group.setup_timeout, group.device_timeout);
        self.pass_with(&group.store, group.rank, limits, peers)
    }

    fn pass_with(
        &self,
        store: &Store,
        rank: usize,
        (setup_timeout, device_timeout): (Duration, Duration),
        peers: impl IntoIterator<Item = usize>,
    ) -> Result<()> {
        if !self.announced.load(Ordering::Acquire) {
            store.set(&self.key(rank), b"1")?;
            self.announced.store(true, Ordering::Release);
        }
        let mut first = false;
        for peer in peers {
            let Some(flag) = self.ready.get(peer) else {
                continue; // out of range: the caller's own checks report it
            };
            if peer == rank || flag.load(Ordering::Acquire) {
                continue;
            }
            self.wait_for(store, peer, setup_timeout, device_timeout)?;
            flag.store(true, Ordering::Release);
            first = true;
        }
        if first {
            // A peer may itself wait at a gate for a rank that compiles (a ring: this rank
            // receives from a peer that receives from the compiling rank): this kernel's
            // device waits would then time out behind that compile. So a first launch also
            // waits until no rank of the group is loading a kernel.
            wait_while_loading(store, rank, self.ready.len(), setup_timeout)?;
        }
        Ok(())
    }
}

impl KernelGate {
    /// Waits until `peer` announced the kernel ([`gate_gives_up`] says how long).
    fn wait_for(
        &self,
        store: &Store,
        peer: usize,
        setup_timeout: Duration,
        device_timeout: Duration,
    ) -> Result<()> {
        let start = std::time::Instant::now();
        let mut last_busy = start;
        loop {
            if store.wait(&[&self.key(peer)], GATE_POLL).is_ok() {
                return Ok(());
            }
            if store.add(&loading_key(peer), 0)? > 0 {
                last_busy = std::time::Instant::now();
            }
            let reason = gate_gives_up(
                start.elapsed(),
                last_busy.elapsed(),
                setup_timeout,
                device_timeout,
            );
            if let Some(reason) = reason {
                return Err(Error::Setup {
                    step: format!("kernel `{}` loaded on every peer", self.name),
                    failures: vec![(
                        peer,
                        format!(
                            "{reason} (waited {:.1} s); does every rank make the same call?",
                            start.elapsed().as_secs_f64()
                        ),
                    )],
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devcomm_bootstrap::RankInfo;

    const T: Duration = Duration::from_secs(20);

    /// Rank 0 and rank 1 (a thread) on one store.
    fn two_stores() -> (Store, RankInfo) {
        let info0 = RankInfo::new(0, 2).with_master("127.0.0.1", 0);
        let s0 = Store::connect(&info0, T).expect("rank 0 store");
        let info1 = RankInfo::new(1, 2).with_master("127.0.0.1", s0.master_port());
        (s0, info1)
    }

    #[test]
    fn a_gate_waits_for_a_peer_that_loads_late() {
        let (s0, info1) = two_stores();
        let late = std::thread::spawn(move || {
            let s1 = Store::connect(&info1, T).expect("rank 1 store");
            std::thread::sleep(Duration::from_millis(300)); // "compiling"
            let gate = KernelGate::new("k", 2);
            gate.pass_with(&s1, 1, (T, T), [0]).map(|_| s1)
        });
        let gate = KernelGate::new("k", 2);
        let t0 = std::time::Instant::now();
        gate.pass_with(&s0, 0, (T, T), [0, 1])
            .expect("rank 0 passes");
        assert!(
            t0.elapsed() >= Duration::from_millis(250),
            "rank 0 did not wait"
        );
        let _s1 = late.join().expect("rank 1 thread").expect("rank 1 passes");
    }

    #[test]
    fn a_gate_names_the_peer_that_never_loads() {
        let (s0, info1) = two_stores();
        let s1 = Store::connect(&info1, T).expect("rank 1 store");
        let gate = KernelGate::new("other", 2);
        let short = Duration::from_millis(200);
        let err = gate
            .pass_with(&s0, 0, (short, T), [1])
            .expect_err("rank 1 never announces");
        let Error::Setup { step, failures } = err else {
            panic!("expected a setup error, got {err}");
        };
        assert!(step.contains("`other`"), "{step}");
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].0, 1);
        drop(s1);
    }

    #[test]
    fn a_gate_gives_up_within_the_device_timeout_on_a_peer_in_another_call() {
        let (s0, info1) = two_stores();
        let s1 = Store::connect(&info1, T).expect("rank 1 store");
        let gate = KernelGate::new("elsewhere", 2);
        let t0 = std::time::Instant::now();
        let err = gate
            .pass_with(&s0, 0, (T, Duration::from_millis(300)), [1])
            .expect_err("rank 1 loads nothing and never announces");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(err.to_string().contains("device timeout"), "{err}");
        drop(s1);
    }

    #[test]
    fn a_gate_waits_past_the_device_timeout_for_a_peer_that_is_loading() {
        let (s0, info1) = two_stores();
        let slow = std::thread::spawn(move || {
            let s1 = Store::connect(&info1, T).expect("rank 1 store");
            s1.add(&loading_key(1), 1).expect("mark loading");
            std::thread::sleep(Duration::from_millis(1500)); // a compile longer than the bound
            s1.add(&loading_key(1), -1).expect("unmark");
            let gate = KernelGate::new("slow", 2);
            gate.pass_with(&s1, 1, (T, T), [0]).map(|_| s1)
        });
        std::thread::sleep(Duration::from_millis(100)); // rank 1 marks itself first
        let gate = KernelGate::new("slow", 2);
        gate.pass_with(&s0, 0, (T, Duration::from_millis(500)), [1])
            .expect("rank 0 waits for the loading peer");
        let _s1 = slow.join().expect("thread").expect("rank 1 passes");
    }

    #[test]
    fn the_gate_decision() {
        let s = Duration::from_secs;
        assert_eq!(gate_gives_up(s(1), s(1), s(120), s(10)), None);
        assert!(gate_gives_up(s(11), s(10), s(120), s(10))
            .is_some_and(|r| r.contains("device timeout")));
        assert_eq!(gate_gives_up(s(60), s(2), s(120), s(10)), None);
        assert!(
            gate_gives_up(s(120), s(0), s(120), s(10)).is_some_and(|r| r.contains("setup timeout"))
        );
    }

    #[test]
    fn a_teardown_barrier_meets_every_rank_or_stops_at_a_failed_one() {
        let (s0, info1) = two_stores();
        let peer = std::thread::spawn(move || {
            let s1 = Store::connect(&info1, T).expect("rank 1 store");
            teardown_arrive(&s1, 1, "a").expect("arrive");
            teardown_wait(&s1, 1, 2, "a", T).expect("healthy barrier");
            std::thread::sleep(Duration::from_millis(200));
            s1.add(FAILED_KEY, 1).expect("mark failed"); // then tears "b" down alone
            s1
        });
        teardown_arrive(&s0, 0, "a").expect("arrive");
        teardown_wait(&s0, 0, 2, "a", T).expect("healthy barrier");
        let t0 = std::time::Instant::now();
        teardown_arrive(&s0, 0, "b").expect("arrive");
        teardown_wait(&s0, 0, 2, "b", T).expect("stops at the failed peer's mark");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        let _s1 = peer.join().expect("thread");
        let err = teardown_wait(&s0, 0, 3, "c", Duration::from_millis(10));
        assert!(err.is_ok(), "the failure mark stays: {err:?}");
    }

    #[test]
    fn a_rank_that_arrives_alone_is_counted_and_a_missing_one_is_named() {
        let (s0, info1) = two_stores();
        let s1 = Store::connect(&info1, T).expect("rank 1 store");
        // Rank 1 releases alone (a dropped registration): it marks its arrival, waits for none.
        let t0 = std::time::Instant::now();
        teardown_arrive(&s1, 1, "r").expect("arrive");
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        // Rank 0's collective release later finds it counted.
        teardown_arrive(&s0, 0, "r").expect("arrive");
        teardown_wait(&s0, 0, 2, "r", T).expect("rank 1 counted");
        // A step that rank 1 never reaches: rank 0's wait names it.
        teardown_arrive(&s0, 0, "never").expect("arrive");
        let err = teardown_wait(&s0, 0, 2, "never", Duration::from_millis(100))
            .expect_err("rank 1 never arrives")
            .to_string();
        assert!(err.contains("[1]") && err.contains("never"), "{err}");
    }

    #[test]
    fn a_first_pass_waits_while_any_rank_loads() {
        let (s0, info1) = two_stores();
        let s1 = Store::connect(&info1, T).expect("rank 1 store");
        // Rank 1 announces the kernel, then marks itself loading another one for 300 ms.
        let gate1 = KernelGate::new("ring", 2);
        gate1.pass_with(&s1, 1, (T, T), []).expect("announce");
        s1.add(&loading_key(1), 1).expect("mark loading");
        let loader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            s1.add(&loading_key(1), -1).expect("unmark");
            s1
        });
        let gate0 = KernelGate::new("ring", 2);
        let t0 = std::time::Instant::now();
        gate0
            .pass_with(&s0, 0, (T, T), [1])
            .expect("passes once rank 1 loads nothing");
        assert!(
            t0.elapsed() >= Duration::from_millis(250),
            "{:?}",
            t0.elapsed()
        );
        let _s1 = loader.join().expect("thread");
        // Later passes look at nothing.
        let t1 = std::time::Instant::now();
        gate0.pass_with(&s0, 0, (T, T), [1]).expect("second pass");
        assert!(t1.elapsed() < Duration::from_millis(50));
    }
}
