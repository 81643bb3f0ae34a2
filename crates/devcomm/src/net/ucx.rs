//! Safe owners of UCX objects: the context, the worker, endpoints, memory registrations and
//! remote keys, and the polling of requests. Built on the function table of `ucx_ffi`; the
//! rest of the network layer never calls UCX directly.
//!
//! Threading: the worker is created `UCS_THREAD_MODE_SERIALIZED`; the transport keeps the
//! worker, its endpoints and remote keys behind one mutex, so calls on them never overlap.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ucx_ffi::*;
use crate::error::net::{NetError, Result};

/// A loaded libucp and an initialised UCP context (RMA).
#[derive(Debug)]
pub(crate) struct Ucx {
    api: UcpApi,
    context: UcpContext,
    rank: i32,
}

// SAFETY: a UCP context may be used from any thread for mem_map/unmap/rkey_pack (UCX guards
// its context-level registration cache); worker-level objects are serialised by the owner.
unsafe impl Send for Ucx {}
// SAFETY: as above.
unsafe impl Sync for Ucx {}

impl Ucx {
    /// Loads libucp (see `ucx_ffi::candidates`) and initialises a context.
    pub(crate) fn new(lib: Option<&str>, rank: usize) -> Result<Arc<Self>> {
        let api = UcpApi::load(lib)?;
        let rank = i32::try_from(rank).unwrap_or(i32::MAX);
        let mut config: UcpConfig = std::ptr::null_mut();
        // SAFETY: null prefix and file mean the defaults (UCX_ variables); valid out-pointer.
        let status = unsafe { (api.config_read)(std::ptr::null(), std::ptr::null(), &mut config) };
        check_status(&api, status, rank, -1, "ucp_config_read")?;
        let params = UcpParams {
            field_mask: UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
            features: UCP_FEATURE_RMA,
            name: c"devcomm".as_ptr(),
            ..UcpParams::default()
        };
        let mut context: UcpContext = std::ptr::null_mut();
        // SAFETY: params and config are valid for the call; the API version is the one the
        // structs were transcribed from.
        let status = unsafe {
            (api.init_version)(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &mut context)
        };
        // SAFETY: config came from ucp_config_read and is released once.
        unsafe { (api.config_release)(config) };
        check_status(&api, status, rank, -1, "ucp_init")?;
        Ok(Arc::new(Self { api, context, rank }))
    }

    /// The function table.
    pub(crate) fn api(&self) -> &UcpApi {
        &self.api
    }

    /// Registers `len` bytes at `base` for remote reads and writes.
    ///
    /// # Safety
    /// The memory must stay allocated until the returned region is dropped.
    pub(crate) unsafe fn map(
        self: &Arc<Self>,
        base: u64,
        len: u64,
        cuda: bool,
    ) -> Result<MemRegion> {
        let params = UcpMemMapParams {
            field_mask: UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                | UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | UCP_MEM_MAP_PARAM_FIELD_PROT
                | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
            address: base as *mut c_void,
            length: len as usize,
            prot: UCP_MEM_MAP_PROT_LOCAL_READ
                | UCP_MEM_MAP_PROT_LOCAL_WRITE
                | UCP_MEM_MAP_PROT_REMOTE_READ
                | UCP_MEM_MAP_PROT_REMOTE_WRITE,
            memory_type: if cuda {
                UCS_MEMORY_TYPE_CUDA
            } else {
                UCS_MEMORY_TYPE_HOST
            },
            ..UcpMemMapParams::default()
        };
        let mut memh: UcpMem = std::ptr::null_mut();
        // SAFETY: valid params and out-pointer; the caller keeps the memory alive.
        let status = unsafe { (self.api.mem_map)(self.context, &params, &mut memh) };
        check_status(&self.api, status, self.rank, -1, "ucp_mem_map")?;
        Ok(MemRegion {
            ucx: self.clone(),
            memh,
            base,
            len,
        })
    }
}

impl Drop for Ucx {
    fn drop(&mut self) {
        // SAFETY: every worker and region holds an Arc to this value, so none is left.
        unsafe { (self.api.cleanup)(self.context) };
    }
}

fn check_status(
    api: &UcpApi,
    status: UcsStatus,
    rank: i32,
    peer: i32,
    call: &'static str,
) -> Result<()> {
    if status == UCS_OK {
        Ok(())
    } else {
        Err(NetError::Ucx {
            rank,
            peer,
            call,
            status,
            message: api.describe(status),
        })
    }
}

/// A registered memory range (`ucp_mem_map`); unmapped on drop.
#[derive(Debug)]
pub(crate) struct MemRegion {
    ucx: Arc<Ucx>,
    memh: UcpMem,
    /// Local address.
    pub(crate) base: u64,
    /// Bytes.
    pub(crate) len: u64,
}

// SAFETY: the handle is only passed to context-level calls (rkey_pack, mem_unmap).
unsafe impl Send for MemRegion {}

impl MemRegion {
    /// The packed remote key for peers.
    pub(crate) fn pack_rkey(&self) -> Result<Vec<u8>> {
        let api = self.ucx.api();
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: memh is live; valid out-pointers.
        let status = unsafe { (api.rkey_pack)(self.ucx.context, self.memh, &mut buf, &mut size) };
        check_status(api, status, self.ucx.rank, -1, "ucp_rkey_pack")?;
        // SAFETY: UCX returned `size` readable bytes at `buf`.
        let out = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) }.to_vec();
        // SAFETY: the buffer came from ucp_rkey_pack and is released once.
        unsafe { (api.rkey_buffer_release)(buf) };
        Ok(out)
    }
}

impl Drop for MemRegion {
    fn drop(&mut self) {
        let api = self.ucx.api();
        // SAFETY: memh came from ucp_mem_map on this context and is unmapped once; remote
        // keys of peers stay valid handles on their side (writes to an unmapped region fail
        // there, they do not touch this memory).
        let status = unsafe { (api.mem_unmap)(self.ucx.context, self.memh) };
        if status != UCS_OK {
            log::warn!(
                "rank {}: ucp_mem_unmap: {}",
                self.ucx.rank,
                api.describe(status)
            );
        }
    }
}

/// The UCP worker of one transport.
#[derive(Debug)]
pub(crate) struct Worker {
    ucx: Arc<Ucx>,
    worker: UcpWorker,
}

// SAFETY: created SERIALIZED; the transport calls it only under its mutex.
unsafe impl Send for Worker {}

/// Called by UCX (from `ucp_worker_progress`, on the thread holding the worker) when an
/// endpoint fails; `arg` is the peer's status word.
unsafe extern "C" fn on_ep_error(arg: *mut c_void, _ep: UcpEp, status: UcsStatus) {
    // SAFETY: `arg` is the AtomicI32 the endpoint was created with; it outlives the endpoint.
    let word = unsafe { &*arg.cast::<AtomicI32>() };
    let _ = word.compare_exchange(0, i32::from(status), Ordering::AcqRel, Ordering::Acquire);
}

impl Worker {
    /// Creates the worker.
    pub(crate) fn new(ucx: &Arc<Ucx>) -> Result<Self> {
        let params = UcpWorkerParams {
            field_mask: UCP_WORKER_PARAM_FIELD_THREAD_MODE,
            thread_mode: UCS_THREAD_MODE_SERIALIZED,
            ..UcpWorkerParams::default()
        };
        let mut worker: UcpWorker = std::ptr::null_mut();
        // SAFETY: valid params and out-pointer; the context is live.
        let status = unsafe { (ucx.api().worker_create)(ucx.context, &params, &mut worker) };
        check_status(ucx.api(), status, ucx.rank, -1, "ucp_worker_create")?;
        Ok(Self {
            ucx: ucx.clone(),
            worker,
        })
    }

    /// The worker's address, for peers to connect to.
    pub(crate) fn address(&self) -> Result<Vec<u8>> {
        let api = self.ucx.api();
        let mut addr: UcpAddress = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: live worker, valid out-pointers.
        let status = unsafe { (api.worker_get_address)(self.worker, &mut addr, &mut len) };
        check_status(api, status, self.ucx.rank, -1, "ucp_worker_get_address")?;
        // SAFETY: UCX returned `len` bytes at `addr`.
        let out = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) }.to_vec();
        // SAFETY: released once, with the worker that gave it.
        unsafe { (api.worker_release_address)(self.worker, addr) };
        Ok(out)
    }

    /// Makes progress; returns the number of events processed.
    pub(crate) fn progress(&self) -> u32 {
        // SAFETY: live worker; the owner serialises calls.
        unsafe { (self.ucx.api().worker_progress)(self.worker) }
    }

    /// Connects to the peer whose worker address is `address`. Failures of the endpoint are
    /// stored (first one wins) into `failed`, which must outlive the endpoint.
    pub(crate) fn connect(
        &self,
        peer: usize,
        address: &[u8],
        failed: &AtomicI32,
    ) -> Result<Endpoint> {
        let params = UcpEpParams {
            field_mask: UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | UCP_EP_PARAM_FIELD_ERR_HANDLER,
            address: address.as_ptr().cast(),
            err_mode: UCP_ERR_HANDLING_MODE_PEER,
            err_handler: UcpErrHandler {
                cb: Some(on_ep_error),
                arg: std::ptr::from_ref(failed).cast_mut().cast(),
            },
            ..UcpEpParams::default()
        };
        let mut ep: UcpEp = std::ptr::null_mut();
        // SAFETY: valid params (the address bytes live through the call; UCX copies what it
        // needs) and out-pointer; `failed` outlives the endpoint (caller's contract).
        let status = unsafe { (self.ucx.api().ep_create)(self.worker, &params, &mut ep) };
        check_status(
            self.ucx.api(),
            status,
            self.ucx.rank,
            peer as i32,
            "ucp_ep_create",
        )?;
        Ok(Endpoint { ep, peer })
    }

    /// Unpacks a peer's remote key on its endpoint.
    pub(crate) fn unpack_rkey(&self, ep: &Endpoint, packed: &[u8]) -> Result<RemoteKey> {
        let mut rkey: UcpRkey = std::ptr::null_mut();
        // SAFETY: live endpoint of this worker; the buffer is a packed key from a peer.
        let status =
            unsafe { (self.ucx.api().ep_rkey_unpack)(ep.ep, packed.as_ptr().cast(), &mut rkey) };
        check_status(
            self.ucx.api(),
            status,
            self.ucx.rank,
            ep.peer as i32,
            "ucp_ep_rkey_unpack",
        )?;
        Ok(RemoteKey {
            ucx: self.ucx.clone(),
            rkey,
        })
    }

    /// Starts a put of `bytes` from local `src` to the peer's `remote` address.
    pub(crate) fn put(
        &self,
        ep: &Endpoint,
        src: u64,
        bytes: u64,
        remote: u64,
        rkey: &RemoteKey,
    ) -> Result<Request> {
        let param = UcpRequestParam::default();
        // SAFETY: live endpoint and key; `src` is inside a registered region (the proxy
        // checked the descriptor); UCX reads it until the request completes, and the producer
        // keeps it unchanged until a later flush completes (contract in net.cuh).
        let p = unsafe {
            (self.ucx.api().put_nbx)(
                ep.ep,
                src as *const c_void,
                bytes as usize,
                remote,
                rkey.rkey,
                &param,
            )
        };
        self.request(p, ep.peer, "ucp_put_nbx", None)
    }

    /// Starts an 8-byte put of `value` to the peer's word at `remote` (the operand is kept
    /// by the request).
    pub(crate) fn put_word(
        &self,
        ep: &Endpoint,
        value: u64,
        remote: u64,
        rkey: &RemoteKey,
    ) -> Result<Request> {
        let operand = Box::new([value, 0u64]);
        let param = UcpRequestParam::default();
        // SAFETY: live endpoint and key; the 8 source bytes live in `operand`, which the
        // returned request keeps until it completes.
        let p = unsafe {
            (self.ucx.api().put_nbx)(ep.ep, operand.as_ptr().cast(), 8, remote, rkey.rkey, &param)
        };
        self.request(p, ep.peer, "ucp_put_nbx", Some(operand))
    }

    /// Starts a flush of the endpoint: completes once every earlier put and atomic on it
    /// completed at the target.
    pub(crate) fn flush(&self, ep: &Endpoint) -> Result<Request> {
        let param = UcpRequestParam::default();
        // SAFETY: live endpoint.
        let p = unsafe { (self.ucx.api().ep_flush_nbx)(ep.ep, &param) };
        self.request(p, ep.peer, "ucp_ep_flush_nbx", None)
    }

    fn request(
        &self,
        p: UcsStatusPtr,
        peer: usize,
        call: &'static str,
        hold: Option<Box<[u64; 2]>>,
    ) -> Result<Request> {
        match status_ptr(p) {
            Ok(None) => Ok(Request {
                ptr: std::ptr::null_mut(),
                peer,
                call,
                _hold: hold,
            }),
            Ok(Some(ptr)) => Ok(Request {
                ptr,
                peer,
                call,
                _hold: hold,
            }),
            Err(status) => {
                Err(
                    check_status(self.ucx.api(), status, self.ucx.rank, peer as i32, call)
                        .unwrap_err(),
                )
            }
        }
    }

    /// Polls a request: `None` while in progress, else its final status (freeing it).
    pub(crate) fn poll(&self, req: &mut Request) -> Option<Result<()>> {
        if req.ptr.is_null() {
            return Some(Ok(()));
        }
        let api = self.ucx.api();
        // SAFETY: a live request of this worker.
        let status = unsafe { (api.request_check_status)(req.ptr) };
        if status == UCS_INPROGRESS {
            return None;
        }
        // SAFETY: completed; freed once, then forgotten.
        unsafe { (api.request_free)(req.ptr) };
        req.ptr = std::ptr::null_mut();
        Some(check_status(
            api,
            status,
            self.ucx.rank,
            req.peer as i32,
            req.call,
        ))
    }

    /// Closes endpoints, progressing until done or `timeout` (then forcing the rest).
    pub(crate) fn close(&self, eps: Vec<Endpoint>, force: bool, timeout: Duration) {
        let api = self.ucx.api();
        let mut pending = Vec::new();
        for ep in eps {
            let param = UcpRequestParam {
                op_attr_mask: UCP_OP_ATTR_FIELD_FLAGS,
                flags: if force { UCP_EP_CLOSE_FLAG_FORCE } else { 0 },
                ..UcpRequestParam::default()
            };
            // SAFETY: live endpoint, closed once (consumed here).
            let p = unsafe { (api.ep_close_nbx)(ep.ep, &param) };
            if let Ok(Some(ptr)) = status_ptr(p) {
                pending.push(Request {
                    ptr,
                    peer: ep.peer,
                    call: "ucp_ep_close_nbx",
                    _hold: None,
                });
            }
        }
        let deadline = Instant::now() + timeout;
        while !pending.is_empty() && Instant::now() < deadline {
            self.progress();
            pending.retain_mut(|r| self.poll(r).is_none());
        }
        for r in &pending {
            log::warn!(
                "rank {}: closing the endpoint to peer {} did not finish in {timeout:?}",
                self.ucx.rank,
                r.peer
            );
        }
        // Requests not finished are released with the worker.
        std::mem::forget(pending);
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SAFETY: the owner closed every endpoint and dropped every remote key first.
        unsafe { (self.ucx.api().worker_destroy)(self.worker) };
    }
}

/// An endpoint to one peer. Closed through [`Worker::close`].
#[derive(Debug)]
pub(crate) struct Endpoint {
    ep: UcpEp,
    /// The peer's rank.
    pub(crate) peer: usize,
}

// SAFETY: used only under the transport's mutex, with its worker.
unsafe impl Send for Endpoint {}

/// A peer's unpacked remote key; destroyed on drop (before its endpoint is closed).
#[derive(Debug)]
pub(crate) struct RemoteKey {
    ucx: Arc<Ucx>,
    rkey: UcpRkey,
}

// SAFETY: used only under the transport's mutex.
unsafe impl Send for RemoteKey {}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        // SAFETY: from ucp_ep_rkey_unpack, destroyed once.
        unsafe { (self.ucx.api().rkey_destroy)(self.rkey) };
    }
}

/// An operation in flight (or one that completed at once: null pointer).
#[derive(Debug)]
pub(crate) struct Request {
    ptr: *mut c_void,
    peer: usize,
    call: &'static str,
    /// Operand and reply words of an atomic, alive until completion.
    _hold: Option<Box<[u64; 2]>>,
}

// SAFETY: used only under the transport's mutex, with its worker.
unsafe impl Send for Request {}

impl Request {
    /// True once UCX is done with it (completed at once, or polled to completion).
    pub(crate) fn finished(&self) -> bool {
        self.ptr.is_null()
    }
}
