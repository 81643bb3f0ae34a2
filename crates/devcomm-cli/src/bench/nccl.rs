//! NCCL as the reference: one communicator over all ranks, on the benchmark's stream.

use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use cudarc::nccl::result as nccl_result;
use cudarc::nccl::safe::{Comm as NcclComm, Id, NcclType};

use crate::bench::time_pair;
use crate::selftest::Ctx;

/// An NCCL communicator over the same ranks and stream as devcomm's.
pub(crate) struct NcclPair {
    comm: NcclComm,
}

impl std::fmt::Debug for NcclPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclPair")
    }
}

impl NcclPair {
    /// Collective: rank 0 makes the unique id and shares it through devcomm's store.
    pub(crate) fn new(cx: &Ctx) -> Result<Self, String> {
        let id = shared_id(cx)?;
        let comm = NcclComm::from_rank(cx.stream.clone(), cx.comm.rank(), cx.comm.world_size(), id)
            .map_err(|e| format!("ncclCommInitRank: {e:?}"))?;
        Ok(Self { comm })
    }

    /// The NCCL communicator.
    pub(crate) fn comm(&self) -> &NcclComm {
        &self.comm
    }

    /// All-to-all as a PyTorch user gets it (`all_to_all_single`): one NCCL group of a send and
    /// a receive with every rank, itself included. `send[sends[p]]` goes to rank `p`;
    /// `recv[recvs[p]]` comes from rank `p`.
    pub(crate) fn all_to_all<T: NcclType>(
        &self,
        send: &CudaView<'_, T>,
        recv: &mut CudaViewMut<'_, T>,
        sends: &[Range<usize>],
        recvs: &[Range<usize>],
    ) -> Result<(), String> {
        let err = |e| format!("NCCL: {e:?}");
        nccl_result::group_start().map_err(err)?;
        for (p, (s, r)) in sends.iter().zip(recvs).enumerate() {
            self.comm
                .send(&send.slice(s.clone()), p as i32)
                .map_err(err)?;
            self.comm
                .recv(&mut recv.slice_mut(r.clone()), p as i32)
                .map_err(err)?;
        }
        nccl_result::group_end().map_err(err)?;
        Ok(())
    }

    /// Median time of `bytes` sent from rank 0 to rank 1 (the slower of the two ranks' medians;
    /// every rank returns it). Ranks start each repetition together after a host barrier.
    pub(crate) fn time_send_recv(
        &self,
        cx: &Ctx,
        src: &CudaSlice<u8>,
        dst: &mut CudaSlice<u8>,
        bytes: usize,
        warmup: usize,
        iters: usize,
    ) -> Result<f64, String> {
        let rank = cx.comm.rank();
        time_pair(cx, warmup, iters, 1, "nccl_sendrecv", &mut || match rank {
            0 => self
                .comm
                .send(&src.slice(..bytes), 1)
                .map_err(|e| format!("ncclSend: {e:?}")),
            _ => self
                .comm
                .recv(&mut dst.slice_mut(..bytes), 0)
                .map(|_| ())
                .map_err(|e| format!("ncclRecv: {e:?}")),
        })
    }
}

/// Collective: a fresh NCCL unique id, made by rank 0 and shared through devcomm's store
/// (each call its own key, so several communicators can be made in one run).
pub(crate) fn shared_id(cx: &Ctx) -> Result<Id, String> {
    ensure_nccl()?;
    let store = cx.comm.store();
    let key = format!("__devcomm_cli/nccl_id/{}", rand_tag(cx));
    if cx.comm.rank() == 0 {
        let id = Id::new().map_err(|e| format!("ncclGetUniqueId: {:?}", e.0))?;
        let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
        store.set(&key, &bytes).map_err(|e| e.to_string())?;
        Ok(id)
    } else {
        let bytes = store
            .get(&key, cx.comm.setup_timeout())
            .map_err(|e| e.to_string())?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(&bytes) {
            *d = *s as std::ffi::c_char;
        }
        Ok(Id::uninit(internal))
    }
}

/// All ranks contribute a value; every rank gets the maximum.
pub(crate) fn max_over_ranks(cx: &Ctx, what: &str, value: f64) -> Result<f64, String> {
    let tag = format!("__devcomm_cli/max/{what}/{}", rand_tag(cx));
    let all = cx
        .comm
        .store()
        .all_gather(&tag, &value.to_le_bytes(), cx.comm.setup_timeout())
        .map_err(|e| e.to_string())?;
    Ok(all
        .iter()
        .filter_map(|b| {
            b.get(..8)
                .and_then(|s| s.try_into().ok())
                .map(f64::from_le_bytes)
        })
        .fold(f64::MIN, f64::max))
}

fn rand_tag(cx: &Ctx) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let _ = cx;
    N.fetch_add(1, Ordering::Relaxed)
}

/// `Ok` when libnccl loads: cudarc loads it lazily and panics inside its loader when it is
/// missing, so every use of NCCL starts here (through [`shared_id`]).
fn ensure_nccl() -> Result<(), String> {
    // SAFETY: loading libnccl runs only its own initialisers; a missing one is `false`.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Ok(());
    }
    let mut names: Vec<String> = Vec::new();
    for name in cudarc::get_lib_name_candidates("nccl") {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Err(format!(
        "NCCL (libnccl) could not be loaded: searched for {names:?} through dlopen \
         (LD_LIBRARY_PATH: {}, then the system's library path); the benchmarks time it as \
         their reference",
        std::env::var("LD_LIBRARY_PATH").unwrap_or_else(|_| "not set".into())
    ))
}
