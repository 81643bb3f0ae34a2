//! Rust twins of `cuda/devcomm/p2p.cuh`.

use std::mem::{offset_of, size_of};

use cudarc::driver::DeviceRepr;

use crate::handles::DeviceWindow;

/// One direction of a send/recv launch. `peer < 0` means the role is unused.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct P2PSide {
    /// Source (send) or destination (recv) device address.
    pub buf: u64,
    /// Message size in bytes.
    pub bytes: u64,
    /// Device `u64[max_channels]`: bulk step counter per channel for this peer.
    pub steps: u64,
    /// Device `u64[max_blocks]`: low-latency call counter per block for this peer.
    pub ll_steps: u64,
    /// Bulk bytes per pipeline step.
    pub chunk_bytes: u64,
    /// The peer, or -1.
    pub peer: i32,
    /// Blocks of this role.
    pub blocks: u32,
    /// 1: low-latency lines; 0: staged bulk.
    pub low_latency: u32,
    /// Send side of a bulk message. 0: push (staging in the receiver's window); 1: pull
    /// (staging in the sender's window, read by the receiver over NVLink). The receiver reads
    /// the sender's choice per chunk from the signal pad. Copy-engine message, either side:
    /// 1 moves this side's copy-engine half by SMs (a local choice, `ce_by_sm`).
    pub pull: u32,
}

impl P2PSide {
    /// A role the launch does not have (`peer = -1`).
    pub(crate) fn unused() -> Self {
        Self {
            peer: -1,
            ..Default::default()
        }
    }
}

/// Everything one send/recv launch needs.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct P2PLaunch {
    /// The p2p window.
    pub w: DeviceWindow,
    /// The send role.
    pub send: P2PSide,
    /// The receive role.
    pub recv: P2PSide,
    /// Bytes between two staging slots.
    pub slot_stride: u64,
    /// One sender's region in a receiver's window.
    pub region_bytes: u64,
    /// Offset of the low-latency lines inside a region.
    pub ll_offset: u64,
    /// Bytes of one parity's lines.
    pub ll_parity_bytes: u64,
    /// Most blocks per direction (low-latency credit slots).
    pub max_blocks: u32,
    /// Staging slots per channel.
    pub depth: u32,
    /// Most bulk channels (warps) per direction.
    pub max_channels: u32,
    /// First MODE user slot (per sender, channel and staging slot: pushed or pulled).
    pub mode_slot0: u32,
}

// SAFETY: plain #[repr(C)] integers whose layout equals the C++ struct (asserted below and in
// tests/layout.rs).
unsafe impl DeviceRepr for P2PLaunch {}

/// A zero-copy send/recv launch: the p2p launch plus the destination of the send role and the
/// descriptor the receive role posts (`cuda/devcomm/p2p.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZcLaunch {
    /// Roles, window and sizes; `steps` of each side points at the zero-copy call counters.
    pub p: P2PLaunch,
    /// The destination as mapped here (the peer's registered buffer plus the offset).
    pub send_dst: u64,
    /// Registration id of the send destination.
    pub send_reg: u64,
    /// Byte offset of the send destination in its registration.
    pub send_offset: u64,
    /// Registration id of the receive destination (this rank's buffer).
    pub recv_reg: u64,
    /// Byte offset of the receive destination.
    pub recv_offset: u64,
    /// First zero-copy user slot of the p2p window.
    pub zc_slot0: u64,
}

// SAFETY: as for P2PLaunch.
unsafe impl DeviceRepr for ZcLaunch {}

/// A launch with two roles at least one of which is a negotiated large message
/// (`p2p_negotiated_kernel`, `cuda/devcomm/p2p.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct P2PNegotiated {
    /// Window, sizes and each role's staged side (a negotiated one carries `P2P_SIDE_GATED`).
    pub a: P2PLaunch,
    /// The copy-engine side of a negotiated send (moved by SMs), else unused.
    pub ce_send: P2PSide,
    /// The copy-engine side of a negotiated receive (moved by SMs), else unused.
    pub ce_recv: P2PSide,
    /// Threads per block of each role (send, recv); a negotiated role's are the kernel's.
    pub threads: [u32; 2],
}

// SAFETY: as for P2PLaunch.
unsafe impl DeviceRepr for P2PNegotiated {}

/// Field offsets for the layout test, as in `handles::LAYOUT` (all of them: [`crate::abi::layout`]).
pub const LAYOUT: &[(&str, &str, usize, usize)] = &[
    (
        "P2PSide",
        "buf",
        offset_of!(P2PSide, buf),
        size_of::<P2PSide>(),
    ),
    (
        "P2PSide",
        "bytes",
        offset_of!(P2PSide, bytes),
        size_of::<P2PSide>(),
    ),
    (
        "P2PSide",
        "steps",
        offset_of!(P2PSide, steps),
        size_of::<P2PSide>(),
    ),
    (
        "P2PSide",
        "ll_steps",
        offset_of!(P2PSide, ll_steps),
        size_of::<P2PSide>(),
    ),
    (
        "P2PSide",
        "chunk_bytes",
        offset_of!(P2PSide, chunk_bytes),
        size_of::<P2PSide>(),
    ),
    (
        "P2PSide",
        "peer",
        offset_of!(P2PSide, peer),
        size_of::<P2PSide>(),
    ),
    (
        "P2PSide",
        "blocks",
        offset_of!(P2PSide, blocks),
        size_of::<P2PSide>(),
    ),
    (
        "P2PSide",
        "low_latency",
        offset_of!(P2PSide, low_latency),
        size_of::<P2PSide>(),
    ),
    (
        "P2PSide",
        "pull",
        offset_of!(P2PSide, pull),
        size_of::<P2PSide>(),
    ),
    (
        "P2PLaunch",
        "w",
        offset_of!(P2PLaunch, w),
        size_of::<P2PLaunch>(),
    ),
    (
        "P2PLaunch",
        "send",
        offset_of!(P2PLaunch, send),
        size_of::<P2PLaunch>(),
    ),
    (
        "P2PLaunch",
        "recv",
        offset_of!(P2PLaunch, recv),
        size_of::<P2PLaunch>(),
    ),
    (
        "P2PLaunch",
        "slot_stride",
        offset_of!(P2PLaunch, slot_stride),
        size_of::<P2PLaunch>(),
    ),
    (
        "P2PLaunch",
        "region_bytes",
        offset_of!(P2PLaunch, region_bytes),
        size_of::<P2PLaunch>(),
    ),
    (
        "P2PLaunch",
        "ll_offset",
        offset_of!(P2PLaunch, ll_offset),
        size_of::<P2PLaunch>(),
    ),
    (
        "P2PLaunch",
        "ll_parity_bytes",
        offset_of!(P2PLaunch, ll_parity_bytes),
        size_of::<P2PLaunch>(),
    ),
    (
        "P2PLaunch",
        "max_blocks",
        offset_of!(P2PLaunch, max_blocks),
        size_of::<P2PLaunch>(),
    ),
    (
        "P2PLaunch",
        "depth",
        offset_of!(P2PLaunch, depth),
        size_of::<P2PLaunch>(),
    ),
    (
        "P2PLaunch",
        "mode_slot0",
        offset_of!(P2PLaunch, mode_slot0),
        size_of::<P2PLaunch>(),
    ),
    (
        "ZcLaunch",
        "send_dst",
        offset_of!(ZcLaunch, send_dst),
        size_of::<ZcLaunch>(),
    ),
    (
        "ZcLaunch",
        "send_offset",
        offset_of!(ZcLaunch, send_offset),
        size_of::<ZcLaunch>(),
    ),
    (
        "ZcLaunch",
        "recv_reg",
        offset_of!(ZcLaunch, recv_reg),
        size_of::<ZcLaunch>(),
    ),
    (
        "ZcLaunch",
        "zc_slot0",
        offset_of!(ZcLaunch, zc_slot0),
        size_of::<ZcLaunch>(),
    ),
    (
        "P2PNegotiated",
        "ce_send",
        offset_of!(P2PNegotiated, ce_send),
        size_of::<P2PNegotiated>(),
    ),
    (
        "P2PNegotiated",
        "ce_recv",
        offset_of!(P2PNegotiated, ce_recv),
        size_of::<P2PNegotiated>(),
    ),
    (
        "P2PNegotiated",
        "threads",
        offset_of!(P2PNegotiated, threads),
        size_of::<P2PNegotiated>(),
    ),
];

const _: () = {
    assert!(size_of::<ZcLaunch>() == 288);
    assert!(size_of::<P2PNegotiated>() == 360);
    assert!(offset_of!(P2PNegotiated, ce_recv) == 296);
    assert!(offset_of!(ZcLaunch, send_dst) == 240);
    assert!(offset_of!(ZcLaunch, recv_reg) == 264);
    assert!(size_of::<P2PSide>() == 56);
    assert!(offset_of!(P2PSide, chunk_bytes) == 32);
    assert!(offset_of!(P2PSide, peer) == 40);
    assert!(offset_of!(P2PSide, low_latency) == 48);
    assert!(size_of::<P2PLaunch>() == 240);
    assert!(offset_of!(P2PLaunch, max_channels) == 232);
    assert!(offset_of!(P2PLaunch, send) == 80);
    assert!(offset_of!(P2PLaunch, recv) == 136);
    assert!(offset_of!(P2PLaunch, slot_stride) == 192);
    assert!(offset_of!(P2PLaunch, max_blocks) == 224);
    assert!(offset_of!(P2PLaunch, mode_slot0) == 236);
    assert!(offset_of!(P2PSide, pull) == 52);
};
