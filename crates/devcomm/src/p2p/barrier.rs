//! `Comm::barrier` as a call on the send/recv agreement ring (`p2p_barrier_kernel`,
//! docs/PROTOCOL.md, "Agreement"): every rank's barrier is numbered with its send/recv calls
//! and collectives, so a peer that makes another call instead is named by a `CallMismatch`.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::kernels::KernelKey;
use super::P2P;
use crate::cuda::{launch_struct, linear_launch};
use crate::error::{CudaResultExt, Result};
use crate::group::Group;
use crate::jit::Jit;

impl P2P {
    /// Enqueues the barrier on `stream` (the namespace's stream): kernels after it on any rank
    /// start only once every NVLink peer's work before it has finished.
    pub(crate) fn launch_barrier(
        &self,
        group: &Group,
        jit: &Jit,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        group.errors.check_before_launch()?;
        self.bind(group, stream)?;
        let func = self.function(group, jit, KernelKey::Barrier)?;
        self.gate.pass(group, group.topology.nvl_peers())?;
        let launch = self.base_launch();
        let _scope = group.call_scope(stream, || crate::trace::CallInfo {
            op: "barrier",
            bytes: 0,
            peers: group.topology.nvl_peers(),
            algorithm: "agreement ring".into(),
        });
        // SAFETY: p2p_barrier_kernel(P2PLaunch) takes exactly this struct by value and enters
        // through enter_after_previous_kernel; it writes only this namespace's agreement words
        // (own pad, and each NVLink peer's ring word for this rank).
        unsafe { launch_struct(stream, &func, linear_launch(1, 32), &launch, group.pdl) }
            .cuda(group.rank as i32, "cuLaunchKernelEx (barrier)")?;
        Ok(())
    }
}
