//! NCCL as the reductions' reference, through its C API: a communicator of its own (cudarc's
//! safe one hides the handle that window registration needs), calls on raw device addresses
//! with a run-time element type, and buffers registered as symmetric windows (`ncclMemAlloc`
//! and `ncclCommWindowRegister`, NCCL 2.27 and later). The window functions are looked up in
//! the libnccl that is already loaded, so an NCCL without them yields a "not available"
//! reason instead of a failure (cudarc's own bindings of them panic when a symbol is missing).

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cudarc::driver::CudaStream;
use cudarc::nccl::result as nccl_result;
use cudarc::nccl::sys::{self, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclWindow_t};

use super::types::Coll;
use crate::bench::nccl::{max_over_ranks, shared_id};
use crate::selftest::Ctx;

/// An NCCL communicator over the same ranks as devcomm's.
pub(crate) struct NcclColl {
    comm: ncclComm_t,
}

impl std::fmt::Debug for NcclColl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclColl")
    }
}

impl NcclColl {
    /// Collective: every rank makes its communicator from one shared id.
    pub(crate) fn new(cx: &Ctx) -> Result<Self, String> {
        let id = sys::ncclUniqueId {
            internal: *shared_id(cx)?.internal(),
        };
        let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: ncclCommInitRank writes the communicator on success only, which is when it
        // is read; every rank passes the same id, its own rank and the world size.
        let comm = unsafe {
            nccl_result::comm_init_rank(comm.as_mut_ptr(), world as c_int, id, rank as c_int)
                .map_err(|e| format!("ncclCommInitRank on rank {rank}: {:?}", e.0))?;
            comm.assume_init()
        };
        Ok(Self { comm })
    }

    /// Enqueues one `coll` on `stream`; `count` is NCCL's count argument (the all-reduce
    /// buffer, the reduce-scatter output, the all-gather input, in elements).
    ///
    /// # Safety
    /// `input` and `output` are device addresses of this rank's context holding the call's
    /// input and output (`Coll::in_out`), alive until the stream has run the call.
    pub(crate) unsafe fn call(
        &self,
        coll: Coll,
        (input, output): (u64, u64),
        count: usize,
        (dtype, op): (ncclDataType_t, ncclRedOp_t),
        stream: &CudaStream,
    ) -> Result<(), String> {
        let s = stream.cu_stream() as sys::cudaStream_t;
        let (i, o) = (input as *const c_void, output as *mut c_void);
        // SAFETY: the caller's contract; the communicator is alive.
        let r = unsafe {
            match coll {
                Coll::AllReduce => nccl_result::all_reduce(i, o, count, dtype, op, self.comm, s),
                Coll::ReduceScatter => {
                    nccl_result::reduce_scatter(i, o, count, dtype, op, self.comm, s)
                }
                Coll::AllGather => nccl_result::all_gather(i, o, count, dtype, self.comm, s),
            }
        };
        r.map(|_| ())
            .map_err(|e| format!("NCCL {} of {count} elements: {:?}", coll.name(), e.0))
    }
}

impl Drop for NcclColl {
    fn drop(&mut self) {
        // SAFETY: the communicator is valid and dropped once; the benchmark synchronises its
        // stream before dropping it.
        if let Err(e) = unsafe { nccl_result::comm_destroy(self.comm) } {
            log::warn!("ncclCommDestroy: {:?}", e.0);
        }
    }
}

type MemAllocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type MemFreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegisterFn =
    unsafe extern "C" fn(ncclComm_t, *mut c_void, usize, *mut ncclWindow_t, c_int) -> c_int;
type DeregisterFn = unsafe extern "C" fn(ncclComm_t, ncclWindow_t) -> c_int;

/// `NCCL_WIN_COLL_SYMMETRIC`: the buffer has the same size on every rank and the collectives'
/// symmetric kernels may read and write it in place.
const WIN_COLL_SYMMETRIC: c_int = 1;

/// The window functions of the loaded libnccl.
#[derive(Clone, Copy)]
struct WindowApi {
    alloc: MemAllocFn,
    free: MemFreeFn,
    register: RegisterFn,
    deregister: DeregisterFn,
}

impl WindowApi {
    fn load() -> Result<Self, String> {
        // SAFETY: the types are the C signatures of these functions in nccl.h (2.27+); the
        // library stays loaded for the process's life (cudarc's static).
        unsafe {
            Ok(Self {
                alloc: symbol("ncclMemAlloc")?,
                free: symbol("ncclMemFree")?,
                register: symbol("ncclCommWindowRegister")?,
                deregister: symbol("ncclCommWindowDeregister")?,
            })
        }
    }
}

/// A function of the libnccl cudarc loaded (dlsym).
///
/// # Safety
/// `F` must be the function's C signature.
unsafe fn symbol<F: Copy>(name: &str) -> Result<F, String> {
    // SAFETY: culib() opens libnccl once (the communicator has already made it load); the
    // caller vouches for the type.
    unsafe {
        let lib = sys::culib();
        lib.get::<F>(name.as_bytes())
            .map(|s| *s)
            .map_err(|e| format!("{name} is not in the loaded libnccl ({e})"))
    }
}

/// An NCCL result code, named.
fn code_name(code: c_int) -> String {
    let name = match code {
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "unknown result",
    };
    format!("{name} ({code})")
}

/// An input and an output buffer from `ncclMemAlloc`, registered as symmetric windows on every
/// rank; deregistered (collectively) and freed on drop.
pub(crate) struct WindowBuffers<'a> {
    nccl: &'a NcclColl,
    api: WindowApi,
    stream: Arc<CudaStream>,
    /// Allocations, input first.
    allocs: Vec<*mut c_void>,
    windows: Vec<ncclWindow_t>,
}

impl std::fmt::Debug for WindowBuffers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WindowBuffers({:?})", self.allocs)
    }
}

impl<'a> WindowBuffers<'a> {
    /// Collective. `Ok(Err(reason))` where this NCCL or platform has no window buffers (every
    /// rank then has the same answer); `Err` for a failure that ends the run.
    pub(crate) fn new(
        cx: &Ctx,
        nccl: &'a NcclColl,
        bytes: [usize; 2],
    ) -> Result<Result<Self, String>, String> {
        let rank = cx.comm.rank();
        let api = WindowApi::load();
        if let Some(reason) = agree(cx, "window-api", api.as_ref().err())? {
            return Ok(Err(reason));
        }
        let api = api?;
        let mut me = Self {
            nccl,
            api,
            stream: cx.stream.clone(),
            allocs: Vec::new(),
            windows: Vec::new(),
        };
        let mut failed = None;
        for &b in &bytes {
            let mut p = std::ptr::null_mut();
            // SAFETY: ncclMemAlloc writes one device pointer of `b` bytes on success.
            let r = unsafe { (api.alloc)(&mut p, b) };
            if r != 0 || p.is_null() {
                failed = Some(format!(
                    "ncclMemAlloc({b}) on rank {rank}: {}",
                    code_name(r)
                ));
                break;
            }
            me.allocs.push(p);
        }
        if let Some(reason) = agree(cx, "window-alloc", failed.as_ref())? {
            return Ok(Err(reason));
        }
        // One registration at a time, agreed before the next: a rank that failed must not
        // leave the others waiting inside the next collective registration.
        for (i, (&p, &b)) in me.allocs.iter().zip(&bytes).enumerate() {
            let mut w: ncclWindow_t = std::ptr::null_mut();
            // SAFETY: collective; every rank registers its allocation of the same size in the
            // same order; `p` holds `b` bytes from ncclMemAlloc.
            let r = unsafe { (api.register)(nccl.comm, p, b, &mut w, WIN_COLL_SYMMETRIC) };
            let failed = (r != 0 || w.is_null()).then(|| {
                format!(
                    "ncclCommWindowRegister({b} B) on rank {rank}: {}",
                    if r != 0 {
                        code_name(r)
                    } else {
                        "no window returned".into()
                    }
                )
            });
            if !w.is_null() {
                me.windows.push(w);
            }
            if let Some(reason) = agree(cx, &format!("window-register-{i}"), failed.as_ref())? {
                // Dropping `me` deregisters what was registered (on every rank alike where
                // the failure was, as usual, the same everywhere).
                return Ok(Err(reason));
            }
        }
        Ok(Ok(me))
    }

    /// The input's and output's device addresses.
    pub(crate) fn ptrs(&self) -> (u64, u64) {
        (self.allocs[0] as u64, self.allocs[1] as u64)
    }
}

impl Drop for WindowBuffers<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.stream.synchronize() {
            log::warn!("window buffers: stream synchronize before freeing: {e}");
        }
        for &w in &self.windows {
            // SAFETY: collective, as the registration was: every rank drops its buffers at
            // the same point of the run; the window was registered on this communicator.
            let r = unsafe { (self.api.deregister)(self.nccl.comm, w) };
            if r != 0 {
                log::warn!("ncclCommWindowDeregister: {}", code_name(r));
            }
        }
        for &p in &self.allocs {
            // SAFETY: from ncclMemAlloc, freed once, after the stream has finished with it.
            let r = unsafe { (self.api.free)(p) };
            if r != 0 {
                log::warn!("ncclMemFree: {}", code_name(r));
            }
        }
    }
}

/// Every rank's answer to one step: `None` where every rank succeeded, else a reason (this
/// rank's own, or that another rank failed), the same on every rank.
fn agree(cx: &Ctx, step: &str, mine: Option<&String>) -> Result<Option<String>, String> {
    let any = max_over_ranks(cx, step, f64::from(u8::from(mine.is_some())))?;
    Ok((any > 0.0).then(|| match mine {
        Some(reason) => reason.clone(),
        None => format!("{step} failed on another rank"),
    }))
}
