//! Carrying out a send/recv [`Plan`]: the guard, the SM kernel (fused, split or negotiated),
//! and a call with copy-engine roles forked onto the copy-engine streams and joined back.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::kernels::KernelKey;
use super::plan::{plan, Grid, Plan, PlanInputs, PlannedSide};
use super::{Counter, Transfer, P2P};
use crate::abi::{P2PLaunch, P2PNegotiated, P2PSide};
use crate::cuda::{launch_struct, linear_launch};
use crate::error::{CudaResultExt, Result};
use crate::group::Group;
use crate::jit::Jit;

impl P2P {
    /// What [`plan`] needs from this namespace: its window, its tuning table and the
    /// environment switches.
    pub(super) fn plan_inputs(&self) -> PlanInputs<'_> {
        PlanInputs {
            limits: &self.limits,
            tune: self.tune.as_ref(),
            switches: self.switches,
        }
    }

    /// The guard before launch, then the launch. Nothing is written when it returns an error.
    pub(crate) fn launch(
        &self,
        group: &Group,
        jit: &Jit,
        send: Option<Transfer>,
        recv: Option<Transfer>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        group.errors.check_before_launch()?;
        self.bind(group, stream)?;
        let p = plan(send, recv, &self.plan_inputs(), |op, peer| {
            self.check_peer(group, op, peer)
        })?;
        if p.is_empty() {
            return Ok(()); // nothing to move
        }
        self.ready(group, jit, p.peers())?;
        let _scope = group.call_scope(stream, || {
            let sides: Vec<_> = (0..2)
                .filter_map(|i| p.sm[i].or(p.negotiated[i]).or(p.ce[i]))
                .collect();
            crate::trace::CallInfo {
                op: "sendrecv",
                bytes: p.sm[0]
                    .or(p.negotiated[0])
                    .or(p.ce[0])
                    .map_or(0, |s| s.bytes),
                peers: sides.iter().map(|s| s.peer).collect(),
                algorithm: sides
                    .iter()
                    .map(|s| format!("{:?}", s.config.protocol))
                    .collect::<Vec<_>>()
                    .join("+"),
            }
        });
        if p.ce_send.is_some() || p.ce_recv.is_some() {
            return self.launch_with_copy_engine(group, jit, &p, stream);
        }
        self.launch_sm(group, jit, &p, stream)
    }

    /// Role `i` (0 send, 1 receive) of a plan as the kernels take it: the planned side with
    /// this namespace's counters for its peer, or an unused role.
    fn side(&self, group: &Group, i: usize, s: Option<PlannedSide>) -> P2PSide {
        let Some(s) = s else {
            return P2PSide::unused();
        };
        let world = group.world_size;
        let kind = if i == 0 {
            (Counter::SendSteps, Counter::LlSend)
        } else {
            (Counter::RecvSteps, Counter::LlRecv)
        };
        let low_latency = s.config.protocol.line_kind();
        P2PSide {
            buf: s.buf,
            bytes: s.bytes,
            steps: self.counter_ptr(kind.0, s.peer, world),
            ll_steps: self.counter_ptr(kind.1, s.peer, world),
            chunk_bytes: s.config.chunk_bytes,
            peer: s.peer as i32,
            blocks: s.config.blocks,
            low_latency,
            pull: s.flags,
        }
    }

    /// Both roles of `sides` as the kernels take them.
    fn sides(&self, group: &Group, sides: [Option<PlannedSide>; 2]) -> [P2PSide; 2] {
        [self.side(group, 0, sides[0]), self.side(group, 1, sides[1])]
    }

    /// Launches the plan's SM kernel (`p.sm_kernel`): the fused or split kernel, or
    /// `p2p_negotiated_kernel` when a role is negotiated (each such role decides its layout
    /// on the GPU).
    fn launch_sm(
        &self,
        group: &Group,
        jit: &Jit,
        p: &Plan,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let Some(Grid {
            kernel,
            blocks,
            threads,
        }) = p.sm_kernel
        else {
            return Ok(());
        };
        let [send, recv] = self.sides(group, p.sm);
        let args = P2PLaunch {
            send,
            recv,
            ..self.base_launch()
        };
        let func = self.function(group, jit, kernel)?;
        let cfg = linear_launch(blocks, threads);
        if let KernelKey::Negotiated(_) = kernel {
            let [ce_send, ce_recv] = self.sides(group, p.negotiated);
            let n = P2PNegotiated {
                a: args,
                ce_send,
                ce_recv,
                threads: p.sm_threads,
            };
            // SAFETY: p2p_negotiated_kernel<512, I>(P2PNegotiated) takes exactly this struct
            // by value and enters through enter_after_previous_kernel; as for the SM kernel,
            // its pointers are the p2p window, this communicator's counters and the caller's
            // buffers (sized by the caller), and the guard checked both sides of each
            // negotiated role against the window: whichever layout a role takes, it writes
            // only inside the receiver's region for this sender, this rank's outbox for the
            // receiver and the destination.
            unsafe { launch_struct(stream, &func, cfg, &n, group.pdl) }
                .cuda(group.rank as i32, "cuLaunchKernelEx (sendrecv, negotiated)")?;
            return Ok(());
        }
        // SAFETY: p2p_kernel<S, R>(P2PLaunch) takes exactly this struct by value and enters
        // through enter_after_previous_kernel; its pointers are the p2p window (alive as long
        // as `self`), this communicator's counters, and the caller's buffers, whose sizes the
        // caller vouched for (the safe wrappers take them from cudarc slices). The guard above
        // checked peers, blocks and chunk against the window, so the kernel writes only inside
        // the receiver's region for this sender.
        unsafe { launch_struct(stream, &func, cfg, &args, group.pdl) }
            .cuda(group.rank as i32, "cuLaunchKernelEx (sendrecv)")?;
        Ok(())
    }

    /// A call with a copy-engine role (docs/PROTOCOL.md, "Copy engine"): forks from `stream`
    /// onto the copy-engine streams, enqueues the pacing kernel and the copies of a send, the
    /// receiving kernel of a receive and the SM kernel of any other role, then joins them back
    /// into `stream`, so the call is one unit in stream order (and in a captured graph).
    fn launch_with_copy_engine(
        &self,
        group: &Group,
        jit: &Jit,
        p: &Plan,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let rank = group.rank as i32;
        let streams = &self.ce;
        let base = self.base_launch();
        // The roles by copy engine.
        let sides = self.sides(group, p.ce);
        let mut joins: Vec<&Arc<CudaStream>> = Vec::new();
        // One event marks the fork point for every stream that starts from it.
        let forked = stream
            .record_event(None)
            .cuda(rank, "cuEventRecord (fork)")?;
        let fork = |s: &Arc<CudaStream>| s.wait(&forked).cuda(rank, "cuStreamWaitEvent (fork)");
        // Every kernel is resolved before anything is enqueued, so a load failure leaves the
        // streams untouched.
        let pace = match p.ce_send {
            Some(g) => Some((self.function(group, jit, g.kernel)?, g)),
            None => None,
        };
        let recv = match p.ce_recv {
            Some(g) => Some((self.function(group, jit, g.kernel)?, g)),
            None => None,
        };
        if let Some((func, g)) = pace {
            let args = P2PLaunch {
                send: sides[0],
                ..base
            };
            fork(&streams.pace)?;
            let cfg = linear_launch(g.blocks, g.threads);
            // SAFETY: p2p_ce_send_kernel<512>(P2PLaunch) takes this struct by value and enters
            // through enter_after_previous_kernel; it touches this namespace's signal pad, the
            // peer's pad words of this pair and the staging step counters (read), reads the
            // caller's source (`bytes`, sized by the caller) and writes only the outbox slots
            // of this receiver (the guard checked the chunk against a slot).
            unsafe { launch_struct(&streams.pace, &func, cfg, &args, group.pdl) }
                .cuda(rank, "cuLaunchKernelEx (copy-engine sender)")?;
            joins.push(&streams.pace);
            if p.pushes_by_copy_engine() {
                for c in &streams.copy {
                    fork(c)?;
                    joins.push(c);
                }
                self.enqueue_copies(group, sides[0], &streams.copy)?;
            }
        }
        let sm_used = p.sm_kernel.is_some();
        if sm_used {
            self.launch_sm(group, jit, p, stream)?;
        }
        if let Some((func, g)) = recv {
            let args = P2PLaunch {
                recv: sides[1],
                ..base
            };
            let on = if sm_used {
                fork(&streams.recv)?;
                joins.push(&streams.recv);
                &streams.recv
            } else {
                stream
            };
            let cfg = linear_launch(g.blocks, g.threads);
            // SAFETY: p2p_ce_recv_kernel<T>(P2PLaunch) takes this struct by value and enters
            // through enter_after_previous_kernel; it writes `bytes` at the caller's
            // destination (sized by the caller) and this namespace's own pad words, and reads
            // the staging region of the sender.
            unsafe { launch_struct(on, &func, cfg, &args, group.pdl) }
                .cuda(rank, "cuLaunchKernelEx (copy-engine receiver)")?;
            if p.pulls_by_copy_engine() {
                fork(&streams.pull)?;
                joins.push(&streams.pull);
                self.enqueue_pulls(group, sides[1], &streams.pull)?;
            }
        }
        for s in joins {
            stream.join(s).cuda(rank, "cuStreamWaitEvent (join)")?;
        }
        Ok(())
    }
}
