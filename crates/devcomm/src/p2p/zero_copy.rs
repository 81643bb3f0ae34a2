//! Zero-copy send/recv into registered buffers (docs/PROTOCOL.md, "Zero-copy"): the route of
//! each role, `p2p_zc_kernel`, and the copy-engine route with its pacer.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream};

use super::copy_engine::launch_one_warp;
use super::defaults::{zero_copy_route, ZcRoute};
use super::kernels::{KernelKey, ZC_THREADS};
use super::{Counter, Transfer, P2P};
use crate::abi::{P2PLaunch, P2PSide, ZcLaunch};
use crate::abi::{CE_DONE, CE_GO};
use crate::cuda::{launch_struct, linear_launch};
use crate::error::{CudaResultExt, Error, Result};
use crate::group::Group;
use crate::jit::Jit;

/// One role of a zero-copy call: `bytes` between `buf` (the source when sending, this rank's
/// destination when receiving) and `peer`, landing in registration `reg` at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZcRole {
    pub buf: u64,
    pub bytes: u64,
    pub peer: usize,
    pub reg: u64,
    pub offset: u64,
    /// Sending: the destination as mapped here (`peer`'s registered buffer plus `offset`).
    /// Receiving: unused (0).
    pub remote: u64,
}

impl P2P {
    /// Zero-copy send, receive or both into registered buffers, each role by the route of its
    /// size ([`zero_copy_route`], the same on both ranks): the ordinary send/recv path into
    /// the registered destination (low-latency lines, or staged chunks where they measured
    /// faster than writing straight into the peer's buffer), SM blocks of `p2p_zc_kernel`, or
    /// the copy engine. The caller has checked that each range lies inside its registered
    /// buffer; peers are checked here. Roles on the ordinary path launch first, on both ranks,
    /// so the launches of the two ranks cannot wait on each other.
    pub(crate) fn launch_zero_copy(
        &self,
        group: &Group,
        jit: &Jit,
        send: Option<ZcRole>,
        recv: Option<ZcRole>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        group.errors.check_before_launch()?;
        self.bind(group, stream)?;
        // Both roles are checked before either route launches anything.
        if let Some(t) = send {
            self.check_peer(group, "send_registered", t.peer)?;
            crate::abi::check_message_bytes("send_registered", t.bytes)?;
        }
        if let Some(t) = recv {
            self.check_peer(group, "recv_registered", t.peer)?;
            crate::abi::check_message_bytes("recv_registered", t.bytes)?;
        }
        let peer = |t: Option<ZcRole>| t.map_or(-1, |t| t.peer as i32);
        self.ready(group, jit, [peer(send), peer(recv)])?;
        let route = |t: &ZcRole| zero_copy_route(t.bytes, &self.limits, &self.switches);
        let staged = |t: &ZcRole| route(t) == ZcRoute::Staged;
        let ordinary = |t: ZcRole| Transfer {
            ptr: t.buf,
            bytes: t.bytes,
            peer: t.peer,
            config: None,
        };
        let (o_send, o_recv) = (
            send.filter(staged).map(ordinary),
            recv.filter(staged).map(ordinary),
        );
        if o_send.is_some() || o_recv.is_some() {
            self.launch(group, jit, o_send, o_recv, stream)?;
        }
        let send = send.filter(|t| !staged(t));
        let recv = recv.filter(|t| !staged(t));
        let z = self.zc_launch(group.world_size, send, recv);
        match send {
            Some(t) if route(&t) == ZcRoute::CopyEngine => {
                self.launch_zero_copy_ce(group, jit, z, stream)
            }
            _ => self.launch_zc_kernel(group, jit, z, stream),
        }
    }

    /// The zero-copy kernels' arguments for these roles (neither on the staged route).
    fn zc_launch(&self, world: usize, send: Option<ZcRole>, recv: Option<ZcRole>) -> ZcLaunch {
        // The copy-engine route has one DONE slot: the receiver waits for one "block".
        let side = |t: ZcRole, counter: Counter| P2PSide {
            buf: t.buf,
            bytes: t.bytes,
            steps: self.counter_ptr(counter, t.peer, world),
            peer: t.peer as i32,
            blocks: match zero_copy_route(t.bytes, &self.limits, &self.switches) {
                ZcRoute::Blocks(b) => b,
                ZcRoute::CopyEngine | ZcRoute::Staged => 1,
            },
            ..P2PSide::unused()
        };
        let mut z = ZcLaunch {
            p: P2PLaunch {
                send: send.map_or(P2PSide::unused(), |t| side(t, Counter::ZcSend)),
                recv: recv.map_or(P2PSide::unused(), |t| side(t, Counter::ZcRecv)),
                ..self.base_launch()
            },
            zc_slot0: self.limits.zc_slot0(world) as u64,
            ..Default::default()
        };
        if let Some(t) = send {
            (z.send_dst, z.send_reg, z.send_offset) = (t.remote, t.reg, t.offset);
        }
        if let Some(t) = recv {
            (z.recv_reg, z.recv_offset) = (t.reg, t.offset);
        }
        z
    }

    /// `p2p_zc_kernel` for the roles of `z` (either may be unused): `send.blocks` sender blocks
    /// and one receiving block.
    fn launch_zc_kernel(
        &self,
        group: &Group,
        jit: &Jit,
        z: ZcLaunch,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let send_blocks = if z.p.send.peer >= 0 {
            z.p.send.blocks
        } else {
            0
        };
        let blocks = send_blocks + u32::from(z.p.recv.peer >= 0);
        if blocks == 0 {
            return Ok(());
        }
        let func = self.function(group, jit, KernelKey::ZeroCopy)?;
        let cfg = linear_launch(blocks, ZC_THREADS);
        // SAFETY: p2p_zc_kernel<512>(ZcLaunch) takes exactly this struct by value and enters
        // through enter_after_previous_kernel. The send role writes `bytes` at `send_dst`,
        // which the caller checked lies inside the peer's registered buffer as mapped here,
        // and only after the receiver's descriptor matched; the source range is the caller's;
        // counters and signal slots are this namespace's.
        unsafe { launch_struct(stream, &func, cfg, &z, group.pdl) }
            .cuda(group.rank as i32, "cuLaunchKernelEx (zero-copy)")?;
        Ok(())
    }

    /// A zero-copy call whose send role goes by copy engine (docs/PROTOCOL.md, "Zero-copy by
    /// copy engine"): forks the pacing stream and the first copy stream from `stream`; the
    /// copy stream waits for GO, copies the whole message into the receiver's registered
    /// buffer, then writes GO = 0 and DONE = 1; the pacer (`p2p_zc_ce_kernel`) checks the
    /// receiver's descriptor, releases GO and announces DONE. A receive role runs in
    /// `p2p_zc_kernel` on `stream` meanwhile; both streams are joined back into `stream`.
    fn launch_zero_copy_ce(
        &self,
        group: &Group,
        jit: &Jit,
        z: ZcLaunch,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let rank = group.rank;
        let pace_fn = self.function(group, jit, KernelKey::ZeroCopyCe)?;
        if z.p.recv.peer >= 0 {
            // Resolved before anything is enqueued, so a load failure leaves the streams as
            // they were.
            self.function(group, jit, KernelKey::ZeroCopy)?;
        }
        let (pace, copy) = (&self.ce.pace, &self.ce.copy[0]);
        let forked = stream
            .record_event(None)
            .cuda(rank as i32, "cuEventRecord (fork)")?;
        for st in [pace, copy] {
            st.wait(&forked)
                .cuda(rank as i32, "cuStreamWaitEvent (fork)")?;
        }
        // The receive role first: it posts the descriptor the peer's pacer waits for, and the
        // copy stream's wait below (`cuStreamWaitValue`) can hold a hardware queue that the
        // caller's stream shares, so a receive kernel submitted after it could wait behind it
        // while the peer waits for its descriptor (a ring of such calls would then stall).
        if z.p.recv.peer >= 0 {
            self.launch_zc_kernel(group, jit, recv_only(z), stream)?;
        }
        self.enqueue_zc_ce_send(group, &pace_fn, z, pace, copy)?;
        for st in [pace, copy] {
            stream
                .join(st)
                .cuda(rank as i32, "cuStreamWaitEvent (join)")?;
        }
        Ok(())
    }

    /// The send role of `z` by copy engine, without fork or join: the pacer on `pace`, the
    /// copy stream's wait for GO, the copy and its GO = 0, DONE = 1 on `copy`.
    fn enqueue_zc_ce_send(
        &self,
        group: &Group,
        pace_fn: &CudaFunction,
        z: ZcLaunch,
        pace: &Arc<CudaStream>,
        copy: &Arc<CudaStream>,
    ) -> Result<()> {
        let rank = group.rank;
        let s = z.p.send;
        let word = |w: usize| self.ce_word(group.world_size, s.peer as usize, w);
        let pacer = ZcLaunch {
            p: P2PLaunch {
                recv: P2PSide::unused(),
                ..z.p
            },
            ..z
        };
        // SAFETY: p2p_zc_ce_kernel(ZcLaunch) takes exactly this struct by value; it reads and
        // writes only this namespace's signal words (its pad, the receiver's DONE slots) and
        // zero-copy counters. The copy below is the only writer of data.
        unsafe { launch_one_warp(pace, pace_fn, &pacer, group.pdl) }
            .cuda(rank as i32, "cuLaunchKernelEx (zero-copy pacer)")?;
        let ctx = |e: Error| crate::cuda::with_rank(e, rank);
        crate::cuda::stream_wait_geq(copy, word(CE_GO), 1).map_err(ctx)?;
        // `send_dst` .. + bytes lies inside the peer's registered buffer (checked by the
        // caller against the registration's size).
        crate::cuda::memcpy_dtod_async(z.send_dst, s.buf, s.bytes as usize, copy).map_err(ctx)?;
        crate::cuda::stream_write(copy, word(CE_GO), 0).map_err(ctx)?;
        crate::cuda::stream_write(copy, word(CE_DONE), 1).map_err(ctx)
    }
}

/// `z` with its send role removed.
fn recv_only(z: ZcLaunch) -> ZcLaunch {
    ZcLaunch {
        p: P2PLaunch {
            send: P2PSide::unused(),
            ..z.p
        },
        ..z
    }
}
