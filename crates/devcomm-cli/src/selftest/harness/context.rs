//! The context every check runs in: the communicator, a stream of its own, the seed all ranks
//! agreed on, and host barriers named after the running check.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use devcomm::{Comm, CommBuilder};
use rand::{RngCore, SeedableRng};

/// Context shared by the checks.
pub(crate) struct Ctx {
    pub(crate) comm: Comm,
    /// Host barriers are named after the running check and counted within it, so a rank that
    /// leaves a check early cannot shift the names of every later barrier.
    phase: std::cell::RefCell<(String, u64)>,
    /// The rank that sits out the running check's host barriers (the odd last rank of a
    /// pairwise check): its barriers return at once and the others' leave it out.
    sits_out: std::cell::Cell<Option<usize>>,
    pub(crate) stream: Arc<CudaStream>,
    /// Agreed by all ranks, fresh each run: data are derived from it.
    pub(crate) seed: u64,
    /// Whether the context was in cudarc's multi-stream mode right after the communicator was
    /// made (before this context made its own stream): devcomm must leave it out.
    pub(crate) multi_stream_after_init: bool,
}

impl Ctx {
    /// A context on the communicator of the environment (`Comm::from_env`).
    pub(crate) fn new() -> Result<Self, String> {
        Self::with_comm(Comm::from_env().map_err(|e| e.to_string())?)
    }

    /// A context on a communicator of the environment's rank and settings, built with what
    /// `configure` adds (alike on every rank).
    pub(crate) fn built(
        configure: impl FnOnce(CommBuilder) -> CommBuilder,
    ) -> Result<Self, String> {
        let info = devcomm_bootstrap::RankInfo::from_env().map_err(|e| e.to_string())?;
        let comm = Comm::builder(info)
            .and_then(|b| configure(b).build())
            .map_err(|e| e.to_string())?;
        Self::with_comm(comm)
    }

    /// A context on `comm`.
    fn with_comm(comm: Comm) -> Result<Self, String> {
        let multi_stream_after_init = comm.context().is_in_multi_stream_mode();
        let stream = comm.context().new_stream().map_err(|e| e.to_string())?;
        // Every check runs on this stream: bound now rather than by the first call.
        comm.bind_stream(&stream).map_err(|e| e.to_string())?;
        let mine = rand::random::<u64>().to_le_bytes();
        let all = comm
            .store()
            .all_gather("__devcomm_cli/seed", &mine, comm.setup_timeout())
            .map_err(|e| e.to_string())?;
        let seed = u64::from_le_bytes(all[0][..8].try_into().map_err(|_| "bad seed")?);
        Ok(Self {
            comm,
            stream,
            seed,
            multi_stream_after_init,
            phase: std::cell::RefCell::new(("start".into(), 0)),
            sits_out: std::cell::Cell::new(None),
        })
    }

    /// Deterministic bytes for (sender, tag): every rank can regenerate any sender's data.
    pub(crate) fn data_of(&self, sender: usize, tag: u64, len: usize) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(
            self.seed ^ (sender as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ tag.rotate_left(17),
        );
        let mut v = vec![0u8; len];
        rng.fill_bytes(&mut v);
        v
    }

    pub(crate) fn foundation(&self) -> Result<Arc<devcomm::jit::LoadedModule>, String> {
        self.comm
            .jit()
            .load(self.comm.context(), &crate::foundation_kernels::spec())
            .map_err(|e| e.to_string())
    }

    /// Copies a device slice to a raw device address (e.g. a window's data) and waits.
    pub(crate) fn copy_to_ptr(&self, dst: u64, src: &CudaSlice<u8>) -> Result<(), String> {
        let (sp, _g) = src.device_ptr(&self.stream);
        // SAFETY: the caller passes a device address with room for `src.len()` bytes (a
        // window's or registered buffer's data); `src` is live; the copy is waited for below.
        unsafe { devcomm::testing::memcpy_dtod_async(dst, sp, src.len(), &self.stream) }
            .map_err(|e| e.to_string())?;
        self.sync()
    }

    /// Captures what `work` enqueues on this stream into a CUDA graph (thread-local capture
    /// mode). Capture always ends, so an error from `work` leaves the stream usable.
    pub(crate) fn capture<E: std::fmt::Display>(
        &self,
        work: impl FnOnce() -> Result<(), E>,
    ) -> Result<cudarc::driver::CudaGraph, String> {
        devcomm::testing::begin_capture(&self.stream).map_err(|e| e.to_string())?;
        let captured = work();
        let graph = devcomm::testing::end_capture(&self.stream).map_err(|e| e.to_string());
        captured.map_err(|e| e.to_string())?;
        graph
    }

    /// Reads `bytes` at a raw device address back to the host.
    pub(crate) fn read_ptr(&self, src: u64, bytes: usize) -> Result<Vec<u8>, String> {
        let mut tmp = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| e.to_string())?;
        {
            let (dp, _g) = tmp.device_ptr_mut(&self.stream);
            // SAFETY: `tmp` holds `bytes`; the caller passes a device address readable for
            // `bytes`; `clone_dtoh` below waits for the copy on the same stream.
            unsafe { devcomm::testing::memcpy_dtod_async(dp, src, bytes, &self.stream) }
                .map_err(|e| e.to_string())?;
        }
        self.stream.clone_dtoh(&tmp).map_err(|e| e.to_string())
    }

    pub(crate) fn sync(&self) -> Result<(), String> {
        self.comm
            .synchronize(&self.stream)
            .map_err(|e| e.to_string())
    }

    /// Waits until every rank of the running check (all but the one that sits out, if any)
    /// has reached the same point; returns at once on the rank that sits out.
    pub(crate) fn host_barrier(&self) -> Result<(), String> {
        let tag = {
            let mut phase = self.phase.borrow_mut();
            phase.1 += 1;
            format!("__devcomm_cli/{}/{}", phase.0, phase.1)
        };
        let store = self.comm.store();
        let timeout = self.comm.setup_timeout();
        let Some(out) = self.sits_out.get() else {
            return store.barrier(&tag, timeout).map_err(|e| e.to_string());
        };
        let rank = self.comm.rank();
        if rank == out {
            return Ok(());
        }
        let key = |r: usize| format!("{tag}/without-{out}/{r}");
        store.set(&key(rank), &[]).map_err(|e| e.to_string())?;
        let keys: Vec<String> = (0..self.comm.world_size())
            .filter(|&r| r != out)
            .map(key)
            .collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        store.wait(&keys, timeout).map_err(|e| e.to_string())
    }

    /// Ends a check that a rank sat out: every rank waits here until all have finished it. The
    /// rank that sat out arrives early and waits as long as the pairs take, up to an hour
    /// (each pair's own waits are bounded by the setup and device timeouts).
    pub(crate) fn leave_phase(&self) -> Result<(), String> {
        let tag = format!("__devcomm_cli/{}/leave", self.phase.borrow().0);
        let timeout = self.comm.setup_timeout().max(Duration::from_secs(3600));
        self.comm
            .store()
            .barrier(&tag, timeout)
            .map_err(|e| e.to_string())
    }

    /// Starts a new phase (a check): every rank enters it together, whatever happened before.
    /// `sits_out` names the rank whose host barriers the check leaves out.
    pub(crate) fn enter_phase(&self, name: &str, sits_out: Option<usize>) -> Result<(), String> {
        *self.phase.borrow_mut() = (name.to_owned(), 0);
        self.sits_out.set(sits_out);
        let tag = format!("__devcomm_cli/{name}/enter");
        self.comm
            .store()
            .barrier(&tag, self.comm.setup_timeout())
            .map_err(|e| e.to_string())
    }
}
