//! The communicator behind an `ncclComm_t`: a devcomm [`Comm`] (when it could be built), the
//! real NCCL's communicator beside it (when NCCL was found), and the registry of live handles,
//! so that a stale or foreign `ncclComm_t` is refused instead of dereferenced.

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::CudaStream;
use devcomm::{Comm, CommBuilder, LinkKind};
use devcomm_bootstrap::{RankInfo, Store};

use crate::error::Failure;
use crate::fallback::{self, Nccl};
use crate::ffi::{self, CudaStreamT, NcclCommT, NcclConfig, NcclResult, NcclUniqueId};
use crate::route::{Forced, Job, FORCE_ENV};
use crate::unique_id;

/// The store key under which rank 0 publishes the real NCCL's unique id (or "none").
const NCCL_ID_KEY: &str = "devcomm-nccl/nccl-id";

/// One communicator of the NCCL API.
#[derive(Debug)]
pub struct ShimComm {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// CUDA device ordinal.
    pub device: i32,
    /// devcomm's communicator (`None`: it could not be built; every call goes to NCCL).
    pub dc: Option<Comm>,
    /// The real NCCL's communicator (0: none).
    nccl: usize,
    /// What the routing of this communicator's calls knows.
    pub job: Job,
    /// The stream devcomm's last call ran on (borrowed from the caller).
    stream: Mutex<Option<Arc<CudaStream>>>,
    /// The first asynchronous error (an NCCL result code; 0: none).
    async_error: AtomicI32,
    /// Splits of this communicator so far (their store keys).
    pub(crate) splits: AtomicU64,
    /// Its windows (`ncclCommWindowRegister`).
    pub(crate) windows: crate::window::Windows,
}

// The raw NCCL communicator is an opaque pointer NCCL lets any thread use.
impl ShimComm {
    /// The real NCCL and its communicator, or why a call cannot go there.
    pub fn nccl(&self, call: &str) -> Result<(&'static Nccl, NcclCommT), Failure> {
        if self.nccl == 0 {
            let why = match fallback::get() {
                Err(e) => e.to_string(),
                Ok(_) => "the real NCCL's communicator was not created".to_string(),
            };
            return Err(Failure::invalid_usage(format!(
                "{call}: devcomm does not answer this call and there is no NCCL to fall back \
                 to: {why}"
            )));
        }
        let lib = fallback::get().map_err(Failure::system)?;
        Ok((lib, self.nccl as NcclCommT))
    }

    /// The raw NCCL communicator (null: none).
    pub fn nccl_raw(&self) -> NcclCommT {
        self.nccl as NcclCommT
    }

    /// devcomm's communicator and the borrowed stream `raw` wrapped for it, moving devcomm's
    /// send/recv namespace onto that stream if the last call used another.
    pub fn dc_stream(
        &self,
        call: &str,
        raw: CudaStreamT,
    ) -> Result<(&Comm, Arc<CudaStream>), Failure> {
        let dc = self
            .dc
            .as_ref()
            .ok_or_else(|| Failure::invalid_usage(format!("{call}: no devcomm communicator")))?;
        let mut cur = self
            .stream
            .lock()
            .map_err(|_| Failure::system(format!("{call}: a thread panicked in devcomm")))?;
        if let Some(s) = cur.as_ref() {
            if std::ptr::eq(s.cu_stream(), raw as cudarc::driver::sys::CUstream) {
                return Ok((dc, s.clone()));
            }
        }
        // SAFETY: the caller's stream belongs to the device's primary context (NCCL's rule:
        // the stream of the communicator's device) and outlives the calls made on it.
        let new = unsafe {
            dc.context()
                .wrap_borrowed_stream(raw as cudarc::driver::sys::CUstream)
        };
        if let Some(old) = cur.as_ref() {
            // SAFETY: `old` is the stream the previous call ran on (the bound one, checked by
            // address) and alive by the same rule.
            unsafe { dc.rebind_stream(old, &new) }.map_err(|e| Failure::from_devcomm(call, &e))?;
        }
        *cur = Some(new.clone());
        Ok((dc, new))
    }

    /// Records `code` as the communicator's asynchronous error (the first one stays).
    pub fn set_async_error(&self, code: NcclResult) {
        let _ = self
            .async_error
            .compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// `ncclCommGetAsyncError`: a recorded error, devcomm's device error state, then NCCL's.
    pub fn async_error(&self) -> NcclResult {
        let recorded = self.async_error.load(Ordering::SeqCst);
        if recorded != 0 {
            return recorded;
        }
        if let Some(Err(e)) = self.dc.as_ref().map(Comm::check) {
            let f = Failure::from_devcomm("ncclCommGetAsyncError", &e);
            crate::error::record(&f);
            self.set_async_error(f.code);
            return f.code;
        }
        if let Ok((lib, c)) = self.nccl("ncclCommGetAsyncError") {
            if let Some(get) = lib.comm_get_async_error {
                let mut r = ffi::SUCCESS;
                // SAFETY: `c` is a live NCCL communicator; one result written.
                if unsafe { get(c, &mut r) } == ffi::SUCCESS {
                    return r;
                }
            }
        }
        ffi::SUCCESS
    }
}

/// Whether `[a, a + a_bytes)` and `[b, b + b_bytes)` share a byte.
pub fn overlap(a: u64, a_bytes: u64, b: u64, b_bytes: u64) -> bool {
    a_bytes > 0 && b_bytes > 0 && a < b.saturating_add(b_bytes) && b < a.saturating_add(a_bytes)
}

/// Runs `f` with a copy of `[src, src + bytes)` made on `stream` in memory of its own (a call
/// whose input and output share memory, which NCCL allows and devcomm's kernels refuse: the
/// copy is what the kernel reads). The copy is freed in stream order after `f`'s work.
pub fn staged<R>(
    call: &str,
    stream: &Arc<CudaStream>,
    src: u64,
    bytes: usize,
    f: impl FnOnce(u64) -> Result<R, Failure>,
) -> Result<R, Failure> {
    use cudarc::driver::DevicePtr;
    let cuda = |e: cudarc::driver::DriverError| {
        Failure::new(
            ffi::UNHANDLED_CUDA_ERROR,
            format!("{call}: staging the input: {e}"),
        )
    };
    // SAFETY: every byte is written by the copy below before the kernel reads it.
    let copy = unsafe { stream.alloc::<u8>(bytes) }.map_err(cuda)?;
    let (ptr, _guard) = copy.device_ptr(stream);
    // SAFETY: `copy` holds `bytes`; `src` is the caller's buffer of `bytes` (NCCL's contract).
    unsafe { devcomm::testing::memcpy_dtod_async(ptr, src, bytes, stream) }
        .map_err(|e| Failure::from_devcomm(call, &e))?;
    f(ptr)
}

/// The live communicators by handle.
static LIVE: Mutex<Option<HashMap<usize, Arc<ShimComm>>>> = Mutex::new(None);

/// Registers `c` and returns its handle.
pub fn register(c: ShimComm) -> NcclCommT {
    let c = Arc::new(c);
    let handle = Arc::as_ptr(&c) as usize;
    if let Ok(mut live) = LIVE.lock() {
        live.get_or_insert_with(HashMap::new).insert(handle, c);
    }
    handle as NcclCommT
}

/// The communicator of `handle`, or `ncclInvalidArgument` for a null, destroyed or foreign one.
pub fn lookup(call: &str, handle: NcclCommT) -> Result<Arc<ShimComm>, Failure> {
    let live = LIVE
        .lock()
        .map_err(|_| Failure::system(format!("{call}: a thread panicked in devcomm-nccl")))?;
    live.as_ref()
        .and_then(|m| m.get(&(handle as usize)).cloned())
        .ok_or_else(|| {
            Failure::invalid_argument(format!(
                "{call}: communicator {handle:p} is null, destroyed or not one of this library's"
            ))
        })
}

/// The real NCCL's communicators made beside this library's. The real NCCL calls some of
/// its own exported functions through names this library also exports, so the dynamic
/// linker sends them here with these handles: `ncclCommGetAsyncError` before every
/// operation, `ncclBroadcast` from `ncclBcast`, `ncclCommRegister` and
/// `ncclCommDeregister` for windows. Such calls are handed back to the real NCCL unchanged.
static INNER: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// What an `ncclComm_t` given to an exported call is.
#[derive(Debug)]
pub enum Handle {
    /// One of this library's communicators.
    Shim(Arc<ShimComm>),
    /// The real NCCL's communicator beside one of them (a call from inside the real NCCL).
    Inner(NcclCommT),
}

/// Records `nc` as a live communicator of the real NCCL (`0`: none).
fn add_inner(nc: usize) {
    if nc == 0 {
        return;
    }
    if let Ok(mut inner) = INNER.lock() {
        inner.get_or_insert_with(HashSet::new).insert(nc);
    }
}

/// Forgets `nc` (its communicator is being destroyed).
fn remove_inner(nc: usize) {
    if let Ok(mut inner) = INNER.lock() {
        inner.as_mut().map(|s| s.remove(&nc));
    }
}

/// The communicator of `handle`: this library's, or the real NCCL's beside one of them;
/// `ncclInvalidArgument` for a null, destroyed or foreign one.
pub fn resolve(call: &str, handle: NcclCommT) -> Result<Handle, Failure> {
    let inner = INNER
        .lock()
        .map(|s| s.as_ref().is_some_and(|s| s.contains(&(handle as usize))))
        .unwrap_or(false);
    if inner {
        return Ok(Handle::Inner(handle));
    }
    lookup(call, handle).map(Handle::Shim)
}

/// Runs `f` on the real NCCL with communicator `nc`, its result code as a `Result` with the
/// real NCCL's message (`None` from `f`: the library lacks the entry point).
pub fn nccl_call(
    call: &str,
    nc: NcclCommT,
    f: impl FnOnce(&'static Nccl, NcclCommT) -> Option<NcclResult>,
) -> Result<(), Failure> {
    let lib = fallback::get().map_err(Failure::system)?;
    match f(lib, nc) {
        None => Err(Failure::invalid_usage(format!(
            "{call}: the real NCCL ({}) lacks it",
            lib.path
        ))),
        Some(ffi::SUCCESS) => Ok(()),
        Some(r) => Err(Failure::new(
            r,
            format!("{call} (NCCL): {}", nccl_last(lib)),
        )),
    }
}

/// Removes `handle` from the registry, returning its communicator.
pub fn unregister(call: &str, handle: NcclCommT) -> Result<Arc<ShimComm>, Failure> {
    let c = lookup(call, handle)?;
    if let Ok(mut live) = LIVE.lock() {
        live.as_mut().map(|m| m.remove(&(handle as usize)));
    }
    Ok(c)
}

/// How long store steps of the communicator's setup may take (devcomm's setup timeout).
pub fn setup_timeout() -> Duration {
    devcomm::Config::from_env()
        .map(|c| c.setup_timeout)
        .unwrap_or(Duration::from_secs(120))
}

/// The forced operations of this process's environment.
fn forced() -> Result<Forced, Failure> {
    Forced::parse(&std::env::var(FORCE_ENV).unwrap_or_default()).map_err(Failure::invalid_argument)
}

/// The CUDA device current on this thread (NCCL's rule: the communicator's device is the one
/// `cudaSetDevice` chose before `ncclCommInitRank`).
pub fn current_device() -> Result<i32, Failure> {
    devcomm::ensure_driver().map_err(|e| Failure::from_devcomm("ncclCommInitRank", &e))?;
    let ctx = cudarc::driver::result::ctx::get_current()
        .map_err(|e| Failure::new(ffi::UNHANDLED_CUDA_ERROR, format!("cuCtxGetCurrent: {e}")))?;
    if ctx.is_none() {
        // No context yet: CUDA's runtime would use device 0 too.
        return Ok(0);
    }
    let mut dev: c_int = 0;
    // SAFETY: a context is current; one int written.
    let r = unsafe { cudarc::driver::sys::cuCtxGetDevice(&mut dev) };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(Failure::new(
            ffi::UNHANDLED_CUDA_ERROR,
            format!("cuCtxGetDevice failed: {r:?}"),
        ));
    }
    Ok(dev)
}

/// Joins the store of `id` as `rank` of `nranks` (rank 0 hosts it on the id's port): the
/// rendezvous of `ncclCommInitRank`, without any GPU.
pub fn join_store(id: &NcclUniqueId, nranks: usize, rank: usize) -> Result<Store, Failure> {
    let call = "ncclCommInitRank";
    if nranks == 0 || rank >= nranks {
        return Err(Failure::invalid_argument(format!(
            "{call}: rank {rank} is not a rank of {nranks} ranks"
        )));
    }
    let bytes: [u8; ffi::UNIQUE_ID_BYTES] = id.internal.map(|c| c as u8);
    let address = unique_id::decode(&bytes)?.address;
    let t = setup_timeout();
    let store = if rank == 0 {
        let info = RankInfo::new(0, nranks)
            .with_master(address.addr.clone(), address.port)
            .with_token(Some(address.token.clone()));
        Store::connect(&info, t)
    } else {
        Store::join_address(&RankInfo::new(rank, nranks), &address, t)
    };
    store.map_err(|e| Failure::from_devcomm(call, &devcomm::Error::Bootstrap(e)))
}

/// Shares the real NCCL's unique id through `store` (rank 0 makes it): `None` when rank 0 has
/// no NCCL (then no rank creates an NCCL communicator, alike everywhere).
pub fn share_nccl_id(store: &Store) -> Result<Option<NcclUniqueId>, Failure> {
    let call = "ncclCommInitRank";
    let map =
        |e: devcomm_bootstrap::Error| Failure::from_devcomm(call, &devcomm::Error::Bootstrap(e));
    if store.rank() == 0 {
        let id = fallback::get().ok().and_then(|lib| {
            let get = lib.get_unique_id?;
            let mut id = NcclUniqueId {
                internal: [0; ffi::UNIQUE_ID_BYTES],
            };
            // SAFETY: writes the 128-byte id.
            (unsafe { get(&mut id) } == ffi::SUCCESS).then_some(id)
        });
        let blob: Vec<u8> = match &id {
            Some(id) => id.internal.iter().map(|&c| c as u8).collect(),
            None => b"none".to_vec(),
        };
        store.set(NCCL_ID_KEY, &blob).map_err(map)?;
        return Ok(id);
    }
    let blob = store.get(NCCL_ID_KEY, setup_timeout()).map_err(map)?;
    if blob.len() != ffi::UNIQUE_ID_BYTES {
        return Ok(None);
    }
    let mut id = NcclUniqueId {
        internal: [0; ffi::UNIQUE_ID_BYTES],
    };
    for (d, s) in id.internal.iter_mut().zip(&blob) {
        *d = *s as _;
    }
    Ok(Some(id))
}

/// The real NCCL's communicator of `rank` of `nranks` on `id`, on the calling thread's
/// current device.
fn nccl_init(
    id: NcclUniqueId,
    nranks: usize,
    rank: usize,
    config: *mut NcclConfig,
) -> Result<usize, Failure> {
    let lib = fallback::get().map_err(Failure::system)?;
    let mut c: NcclCommT = std::ptr::null_mut();
    // SAFETY: NCCL writes the communicator; `config` is the caller's (or null).
    let r = unsafe {
        match (lib.comm_init_rank_config, config.is_null()) {
            (Some(f), false) => f(&mut c, nranks as c_int, id, rank as c_int, config),
            _ => match lib.comm_init_rank {
                Some(f) => f(&mut c, nranks as c_int, id, rank as c_int),
                None => ffi::SYSTEM_ERROR,
            },
        }
    };
    if r != ffi::SUCCESS {
        return Err(Failure::new(
            r,
            format!(
                "ncclCommInitRank: the real NCCL's init failed on rank {rank}: {}",
                nccl_last(lib)
            ),
        ));
    }
    Ok(c as usize)
}

/// The real NCCL's last error text.
pub fn nccl_last(lib: &Nccl) -> String {
    let Some(f) = lib.get_last_error else {
        return String::new();
    };
    // SAFETY: NCCL returns a NUL-terminated string it owns (or null).
    let p = unsafe { f(std::ptr::null_mut()) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: as above.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// Builds the communicator of `rank` on `store` for device `device`: devcomm's (a failure,
/// alike on every rank through devcomm's agreements, leaves NCCL to answer everything), then
/// the real NCCL's on the id shared through the store, or `existing` (a split's).
pub fn build(
    store: Store,
    device: i32,
    config: *mut NcclConfig,
    existing: Option<usize>,
) -> Result<ShimComm, Failure> {
    let (rank, nranks) = (store.rank(), store.world_size());
    let forced = forced()?;
    let nccl_id = match existing {
        Some(_) => None,
        None => share_nccl_id(&store)?,
    };
    let dc = CommBuilder::on_store(store)
        .map(|b| b.local_rank_from_topology().device(device.max(0) as usize))
        .and_then(CommBuilder::build);
    let dc = match dc {
        Ok(c) => Some(c),
        Err(e) => {
            // Always said: every call then goes to NCCL, which a user of this library must know.
            eprintln!(
                "devcomm-nccl WARN rank {rank}: no devcomm communicator, NCCL answers every \
                 call: {e}"
            );
            log::warn!("devcomm-nccl: rank {rank}: no devcomm communicator: {e}");
            None
        }
    };
    // NCCL's init below uses the thread's current device: the device's primary context.
    let ctx = match &dc {
        Some(c) => Ok(c.context().clone()),
        None => cudarc::driver::CudaContext::new(device.max(0) as usize),
    };
    ctx.and_then(|c| c.bind_to_thread())
        .map_err(|e| Failure::new(ffi::UNHANDLED_CUDA_ERROR, format!("cuCtxSetCurrent: {e}")))?;
    let nccl = match (existing, nccl_id) {
        (Some(c), _) => c,
        (None, Some(id)) => nccl_init(id, nranks, rank, config)?,
        (None, None) => 0,
    };
    add_inner(nccl);
    if dc.is_none() && nccl == 0 {
        return Err(Failure::system(format!(
            "ncclCommInitRank: rank {rank}: neither devcomm nor a real NCCL could make a \
             communicator ({})",
            fallback::get().err().unwrap_or("see the log")
        )));
    }
    let nvlink_only = dc.as_ref().is_some_and(|c| {
        (0..nranks).all(|p| matches!(c.topology().kind(p), LinkKind::SelfLink | LinkKind::Nvl))
    });
    Ok(ShimComm {
        rank,
        nranks,
        device,
        job: Job {
            devcomm: dc.is_some(),
            nvlink_only,
            forced,
        },
        dc,
        nccl,
        stream: Mutex::new(None),
        async_error: AtomicI32::new(0),
        splits: AtomicU64::new(0),
        windows: crate::window::Windows::default(),
    })
}

/// The checks of `ncclCommInitRank`'s arguments made before anything connects or touches
/// CUDA: the rank is one of `nranks`, and the id is whole (a damaged or foreign id is
/// refused).
pub fn check_init(nranks: c_int, id: &NcclUniqueId, rank: c_int) -> Result<(), Failure> {
    if nranks < 1 || rank < 0 || rank >= nranks {
        return Err(Failure::invalid_argument(format!(
            "ncclCommInitRank: rank {rank} is not a rank of {nranks} ranks"
        )));
    }
    unique_id::decode(&id.internal.map(|c| c as u8))?;
    Ok(())
}

/// `ncclCommInitRank(Config)` on the calling thread's device (or `device`).
pub fn init_rank(
    nranks: c_int,
    id: &NcclUniqueId,
    rank: c_int,
    config: *mut NcclConfig,
    device: Option<i32>,
) -> Result<NcclCommT, Failure> {
    check_init(nranks, id, rank)?;
    let device = match device {
        Some(d) => d,
        None => current_device()?,
    };
    let store = join_store(id, nranks as usize, rank as usize)?;
    Ok(register(build(store, device, config, None)?))
}

/// Destroys `c` (devcomm's teardown, then NCCL's destroy or abort).
pub fn destroy(c: Arc<ShimComm>, abort: bool) -> NcclResult {
    if abort {
        if let Some(dc) = &c.dc {
            dc.abort();
        }
    }
    let nccl = c.nccl;
    // The last reference normally: devcomm's teardown runs here.
    drop(c);
    if nccl == 0 {
        return ffi::SUCCESS;
    }
    let Ok(lib) = fallback::get() else {
        return ffi::SUCCESS;
    };
    let f = if abort {
        lib.comm_abort
    } else {
        lib.comm_destroy
    };
    // SAFETY: a live NCCL communicator, destroyed once (the handle left the registry).
    let r = f.map_or(ffi::SUCCESS, |f| unsafe { f(nccl as NcclCommT) });
    // Only now: the real NCCL's destroy asks `ncclCommGetAsyncError` about it on the way.
    remove_inner(nccl);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_overlap_when_they_share_a_byte() {
        assert!(overlap(100, 10, 105, 10));
        assert!(overlap(100, 10, 95, 6));
        assert!(!overlap(100, 10, 110, 10));
        assert!(!overlap(100, 10, 90, 10));
        assert!(!overlap(100, 0, 100, 10));
        assert!(overlap(100, 10, 100, 10));
    }

    #[test]
    fn the_real_nccl_s_own_communicators_resolve_to_it_until_destroyed() {
        // An address no allocation of this test owns.
        let nc = 0x7fff_0000_1230_usize;
        let foreign = resolve("t", nc as NcclCommT).unwrap_err();
        assert_eq!(foreign.code, ffi::INVALID_ARGUMENT);
        assert!(
            foreign.message.contains("not one of this library's"),
            "{foreign:?}"
        );
        add_inner(nc);
        assert!(matches!(resolve("t", nc as NcclCommT), Ok(Handle::Inner(h)) if h as usize == nc));
        assert!(resolve("t", std::ptr::null_mut()).is_err());
        remove_inner(nc);
        assert!(resolve("t", nc as NcclCommT).is_err());
        // No real NCCL made none.
        add_inner(0);
        assert!(resolve("t", std::ptr::null_mut()).is_err());
    }
}
