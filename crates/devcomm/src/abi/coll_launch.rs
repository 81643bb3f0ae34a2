//! Rust twin of `CollLaunch` in `cuda/devcomm/collective.cuh`.

use std::mem::{offset_of, size_of};

use cudarc::driver::DeviceRepr;

use super::net::NetP2PLaunch;
use super::p2p_launch::P2PLaunch;

/// Launch arguments of the collective kernel (see the header for each field's meaning).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollLaunch {
    /// The p2p window and staging constants; `p.send` and `p.recv` are unused.
    pub p: P2PLaunch,
    /// Send buffer.
    pub input: u64,
    /// Receive buffer.
    pub output: u64,
    /// Device `u64[W]` rows for each peer, or 0 (every peer gets `rows`).
    pub send_counts: u64,
    /// Device `u64[W]` first row for each peer, or 0 (packed in rank order).
    pub send_offsets: u64,
    /// Device `u64[W]` written: rows received from each peer, or 0.
    pub recv_counts: u64,
    /// Device `u64[W]` written: first row of each peer's data, or 0.
    pub recv_offsets: u64,
    /// Rows per peer when `send_counts` is 0.
    pub rows: u64,
    /// Elements per row.
    pub row_len: u64,
    /// Rows in the send buffer.
    pub send_capacity: u64,
    /// Rows the receive buffer holds.
    pub recv_capacity: u64,
    /// User arguments for the hooks.
    pub user: u64,
    /// The p2p counters.
    pub counters: u64,
    /// Device `u64[4]`: variable calls done, arrivals, overflow flag.
    pub state: u64,
    /// Blocks per (peer, role).
    pub blocks_per_peer: u32,
    /// Bit q: peer q is tuned as a network peer.
    pub net_peers: u32,
    /// First user slot of the count exchange.
    pub count_slot0: u32,
    /// 0: `rows` for every peer; 1: `peer_rows`; 2: device counts.
    pub mode: u32,
    /// Mode 1: rows sent to (`[0]`) and received from (`[1]`) each peer.
    pub peer_rows: [[u64; 32]; 2],
    /// Blocks of the own chunk's role.
    pub self_blocks: u32,
    /// Bit q: peer q is reached over the network (kernels instantiated with `NET`).
    pub net_links: u32,
    /// The network staging and queues (`NET` kernels); its role fields are unused.
    pub net: NetP2PLaunch,
    /// What the call is, as both ends compare it: `mode + 1`, or a reduction's step with
    /// network peers ([`crate::reduce::net_plan::step_code`]). NVLink agreements carry its low 4
    /// bits, network chunk headers all of it.
    pub op: u32,
    /// Padding.
    pub op_pad: u32,
}

/// `CollLaunch::mode` values.
pub const MODE_UNIFORM: u32 = 0;
/// Host-given rows per peer.
pub const MODE_PEER_ROWS: u32 = 1;
/// Device-resident counts (all-to-all-v).
pub const MODE_DEVICE_COUNTS: u32 = 2;

// SAFETY: plain #[repr(C)] integers whose layout equals the C++ struct (asserted below and in
// tests/layout.rs).
unsafe impl DeviceRepr for CollLaunch {}

/// Field offsets for the layout test, as in [`crate::handles::LAYOUT`]. The C++ names of
/// `input`/`output` are `in`/`out`.
pub(crate) const LAYOUT: &[(&str, &str, usize, usize)] = &[
    (
        "CollLaunch",
        "p",
        offset_of!(CollLaunch, p),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "in",
        offset_of!(CollLaunch, input),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "out",
        offset_of!(CollLaunch, output),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "send_counts",
        offset_of!(CollLaunch, send_counts),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "send_offsets",
        offset_of!(CollLaunch, send_offsets),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "recv_counts",
        offset_of!(CollLaunch, recv_counts),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "recv_offsets",
        offset_of!(CollLaunch, recv_offsets),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "rows",
        offset_of!(CollLaunch, rows),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "row_len",
        offset_of!(CollLaunch, row_len),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "send_capacity",
        offset_of!(CollLaunch, send_capacity),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "recv_capacity",
        offset_of!(CollLaunch, recv_capacity),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "user",
        offset_of!(CollLaunch, user),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "counters",
        offset_of!(CollLaunch, counters),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "state",
        offset_of!(CollLaunch, state),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "blocks_per_peer",
        offset_of!(CollLaunch, blocks_per_peer),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "net_peers",
        offset_of!(CollLaunch, net_peers),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "count_slot0",
        offset_of!(CollLaunch, count_slot0),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "self_blocks",
        offset_of!(CollLaunch, self_blocks),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "net_links",
        offset_of!(CollLaunch, net_links),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "net",
        offset_of!(CollLaunch, net),
        size_of::<CollLaunch>(),
    ),
    (
        "CollLaunch",
        "op",
        offset_of!(CollLaunch, op),
        size_of::<CollLaunch>(),
    ),
];

const _: () = {
    assert!(size_of::<CollLaunch>() == 1008);
    assert!(offset_of!(CollLaunch, op) == 1000);
    assert!(offset_of!(CollLaunch, net) == 880);
    assert!(offset_of!(CollLaunch, self_blocks) == 872);
    assert!(offset_of!(CollLaunch, peer_rows) == 360);
    assert!(offset_of!(CollLaunch, input) == 240);
    assert!(offset_of!(CollLaunch, state) == 336);
    assert!(offset_of!(CollLaunch, blocks_per_peer) == 344);
    assert!(offset_of!(CollLaunch, count_slot0) == 352);
};
