//! The send/recv kernels' source, their name expressions and the kernel spec that
//! instantiates every one of them.

use super::window::MAX_ROLE_THREADS;
use crate::jit::KernelSpec;

/// The send/recv kernels' source: one translation unit in five files (each under 600 lines),
/// in this order.
pub const SENDRECV_SOURCE: &str = concat!(
    include_str!("../../cuda/kernels/sendrecv.cu"),
    include_str!("../../cuda/kernels/sendrecv_zc.cu"),
    include_str!("../../cuda/kernels/sendrecv_ce.cu"),
    include_str!("../../cuda/kernels/sendrecv_negotiated.cu"),
    include_str!("../../cuda/kernels/sendrecv_net.cu"),
);

/// Threads per role that kernels are instantiated for.
const ROLE_THREADS: [u32; 3] = [0, 256, 512];

fn kernel_expression(send_threads: u32, recv_threads: u32) -> String {
    format!("devcomm::p2p::p2p_kernel<{send_threads}, {recv_threads}>")
}

fn split_expression(threads: u32, interleave: bool) -> String {
    format!("devcomm::p2p::p2p_split_kernel<{threads}, {interleave}>")
}

/// A loaded kernel of the send/recv module; its name expression is made only on a cache miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum KernelKey {
    /// `p2p_kernel<SEND_THREADS, RECV_THREADS>`.
    Fused(u32, u32),
    /// `p2p_split_kernel<THREADS, INTERLEAVE>`.
    Split(u32, bool),
    /// `p2p_zc_kernel<ZC_THREADS>`.
    ZeroCopy,
    /// `p2p_ce_send_kernel<CE_SEND_THREADS>` (the copy-engine pacer and outbox fillers).
    CeSend,
    /// `p2p_ce_recv_kernel<THREADS>`.
    CeRecv(u32),
    /// `p2p_zc_ce_kernel` (the pacer of a zero-copy send by copy engine).
    ZeroCopyCe,
    /// `p2p_negotiated_kernel<MAX_ROLE_THREADS, INTERLEAVE>` (a launch with two roles and a
    /// negotiated large message).
    Negotiated(bool),
    /// `p2p_barrier_kernel` (`Comm::barrier` on the agreement ring).
    Barrier,
    /// `p2p_net_kernel<NET_THREADS>` (send/recv with network peers, `net_p2p.cuh`).
    Net,
}

impl KernelKey {
    pub(crate) fn expression(self) -> String {
        match self {
            Self::Fused(s, r) => kernel_expression(s, r),
            Self::Split(t, i) => split_expression(t, i),
            Self::ZeroCopy => zc_expression(),
            Self::CeSend => ce_send_expression(),
            Self::CeRecv(t) => ce_recv_expression(t),
            Self::ZeroCopyCe => ZC_CE_EXPRESSION.to_owned(),
            Self::Negotiated(i) => negotiated_expression(i),
            Self::Barrier => BARRIER_EXPRESSION.to_owned(),
            Self::Net => net_expression(),
        }
    }
}

/// Threads per block of the network send/recv kernel (one block per role).
pub(crate) const NET_THREADS: u32 = 512;

fn net_expression() -> String {
    format!("devcomm::p2p::p2p_net_kernel<{NET_THREADS}>")
}

/// Threads per block of the zero-copy kernel.
pub(crate) const ZC_THREADS: u32 = 512;

fn zc_expression() -> String {
    format!("devcomm::p2p::p2p_zc_kernel<{ZC_THREADS}>")
}

/// Threads per block of the copy-engine sender (block 0's first warp paces, the other blocks
/// copy pulled chunks into the outbox).
pub(crate) const CE_SEND_THREADS: u32 = 512;
fn ce_send_expression() -> String {
    format!("devcomm::p2p::p2p_ce_send_kernel<{CE_SEND_THREADS}>")
}
const ZC_CE_EXPRESSION: &str = "devcomm::p2p::p2p_zc_ce_kernel";
const BARRIER_EXPRESSION: &str = "devcomm::p2p::p2p_barrier_kernel";
fn negotiated_expression(interleave: bool) -> String {
    format!("devcomm::p2p::p2p_negotiated_kernel<{MAX_ROLE_THREADS}, {interleave}>")
}

fn ce_recv_expression(threads: u32) -> String {
    format!("devcomm::p2p::p2p_ce_recv_kernel<{threads}>")
}

/// The kernel spec with every (send threads, recv threads) instantiation, without the
/// configuration's options (`crate::kernels::kernel_spec` adds `DEVCOMM_P2P_OPTIONS`).
pub(crate) fn sendrecv_spec() -> KernelSpec {
    let mut spec = KernelSpec::new("sendrecv", SENDRECV_SOURCE)
        .name_expression(zc_expression())
        .name_expression(ce_send_expression())
        .name_expression(ZC_CE_EXPRESSION.to_owned())
        .name_expression(BARRIER_EXPRESSION.to_owned())
        .name_expression(net_expression())
        .name_expression(negotiated_expression(true))
        .name_expression(negotiated_expression(false));
    for t in [256, 512] {
        spec = spec
            .name_expression(split_expression(t, true))
            .name_expression(split_expression(t, false))
            .name_expression(ce_recv_expression(t));
    }
    for s in ROLE_THREADS {
        for r in ROLE_THREADS {
            if s + r > 0 {
                spec = spec.name_expression(kernel_expression(s, r));
            }
        }
    }
    spec
}
