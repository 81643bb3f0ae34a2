//! Plain `#[repr(C)]` structs that kernels receive, twins of `cuda/devcomm/handles.cuh`.
//!
//! Each struct's size and field offsets are asserted here at compile time and in the C++ header
//! with `static_assert`; `tests/layout.rs` compiles the header with the host C++ compiler and
//! compares the two. Change both sides together.

use std::mem::{offset_of, size_of};

use cudarc::driver::DeviceRepr;

/// What a bounded device wait was doing when it gave up (`DeviceOp` in the C++ header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceOp {
    /// `wait_signal` on a window slot.
    WaitSignal,
    /// The cross-rank barrier.
    Barrier,
    /// A sender waiting for the receiver to free a staging slot (HEAD).
    SendSlotFree,
    /// A receiver waiting for the sender to fill a staging slot (TAIL).
    RecvSlotFull,
    /// All-to-all-v waiting for a peer's counts.
    CountExchange,
    /// All-to-all-v counts outside the send or receive buffer (no wait involved).
    CountOverflow,
    /// A zero-copy sender waiting for the receiver's descriptor.
    ZeroCopyReady,
    /// A zero-copy receiver waiting for the sender's data.
    ZeroCopyDone,
    /// A zero-copy call whose two sides disagree (no wait involved).
    ZeroCopyMismatch,
    /// A copy-engine chunk whose id or message size is not the one the receiver expected (the
    /// two sides posted different calls, or the sender gave up and overwrote a slot).
    CopyEngineMismatch,
    /// A call whose two sides differ (no wait involved; `cuda/devcomm/agree.cuh`).
    CallMismatch,
    /// A MoE dispatch waiting for a rank's rows (the direct path; `slot` is the rank).
    MoeDispatch,
    /// A MoE combine waiting for a rank's sums (the direct path; `slot` is world + the rank).
    MoeCombine,
    /// A producer of the network transport waited for a free queue entry and gave up.
    NetQueueFull,
    /// The network proxy found the peer failed (died, link broken, operation timed out).
    NetPeerFailed,
    /// A flush of a network queue was not completed in time.
    NetFlush,
    /// The network proxy refused a descriptor outside its registration.
    NetBadDescriptor,
    /// A wait issued by user code through the raw window operations.
    User,
    /// A code this version does not know.
    Unknown(u32),
}

impl DeviceOp {
    /// Decodes the value a kernel wrote into [`ErrorRecord::op`].
    pub fn from_code(code: u32) -> Self {
        match code {
            1 => Self::WaitSignal,
            2 => Self::Barrier,
            3 => Self::SendSlotFree,
            4 => Self::RecvSlotFull,
            5 => Self::CountExchange,
            6 => Self::CountOverflow,
            7 => Self::ZeroCopyReady,
            8 => Self::ZeroCopyDone,
            9 => Self::ZeroCopyMismatch,
            10 => Self::CopyEngineMismatch,
            11 => Self::CallMismatch,
            12 => Self::MoeDispatch,
            13 => Self::MoeCombine,
            20 => Self::NetQueueFull,
            21 => Self::NetPeerFailed,
            22 => Self::NetFlush,
            23 => Self::NetBadDescriptor,
            100 => Self::User,
            other => Self::Unknown(other),
        }
    }
}

impl std::fmt::Display for DeviceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::WaitSignal => f.write_str("wait_signal"),
            Self::Barrier => f.write_str("barrier"),
            Self::SendSlotFree => f.write_str(
                "send (waiting for the receiver to free a staging slot: did the peer post the \
                 matching recv, of the same size, on its stream?)",
            ),
            Self::RecvSlotFull => f.write_str(
                "recv (waiting for the sender to fill a staging slot: did the peer post the \
                 matching send, of the same size, on its stream?)",
            ),
            Self::CountExchange => f.write_str(
                "all-to-all-v count exchange (waiting for the peer's counts: did every rank \
                 call the same collective on its stream?)",
            ),
            Self::CountOverflow => f.write_str("all-to-all-v count check"),
            Self::ZeroCopyReady => f.write_str(
                "send_registered (waiting for the receiver's descriptor: did the peer post the \
                 matching recv_registered on its stream?)",
            ),
            Self::ZeroCopyDone => f.write_str(
                "recv_registered (waiting for the sender's data: did the peer post the matching \
                 send_registered on its stream?)",
            ),
            Self::ZeroCopyMismatch => f.write_str("zero-copy descriptor check"),
            Self::CopyEngineMismatch => f.write_str(
                "copy-engine recv (the chunk in the slot is not the expected one: did the peer \
                 post the matching send, of the same size, on its stream?)",
            ),
            Self::CallMismatch => f.write_str("call agreement check"),
            Self::MoeDispatch => f.write_str(
                "MoE dispatch (waiting for the rank's rows: did every rank call dispatch on the \
                 same layer, on its stream?)",
            ),
            Self::MoeCombine => f.write_str(
                "MoE combine (waiting for the rank's sums: did every rank call combine on the \
                 same layer, on its stream?)",
            ),
            Self::NetQueueFull => f.write_str("network queue (waiting for a free entry)"),
            Self::NetPeerFailed => f.write_str("network proxy (peer failed)"),
            Self::NetFlush => f.write_str("network queue flush"),
            Self::NetBadDescriptor => f.write_str("network descriptor check"),
            Self::User => f.write_str("user wait"),
            Self::Unknown(code) => write!(f, "device op {code}"),
        }
    }
}

/// The first failure a kernel of this process recorded.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorRecord {
    /// 0 while empty, 1 once claimed.
    pub flag: u32,
    /// [`DeviceOp`] code, written last: 0 while the claimer writes the other fields.
    pub op: u32,
    /// Rank that waited.
    pub rank: i32,
    /// Peer whose signal never came, or -1.
    pub peer: i32,
    /// Signal slot index.
    pub slot: u64,
    /// Value waited for.
    pub expected: u64,
    /// Last value read.
    pub seen: u64,
    /// How long the wait lasted, in nanoseconds.
    pub elapsed_ns: u64,
}

/// Host-mapped state shared by every kernel of one communicator.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceErrorState {
    /// Non-zero: every device wait returns at once.
    pub abort: u32,
    /// Padding; keep zero.
    pub reserved: u32,
    /// The first failure.
    pub record: ErrorRecord,
    /// Device address of the communicator's abort mirror: a u64 in device memory that the
    /// first failure recorded by a kernel sets to its launch's token (`%gridid`, top bit set)
    /// along with `abort`, so that a later launch can tell from one device-memory load at its
    /// start that it must not announce a call (docs/PROTOCOL.md, "Agreement"). Set by the host
    /// at creation; 0: none.
    pub mirror: u64,
}

/// A symmetric window as kernels see it; passed to kernels by value.
///
/// Signal pad layout: `world_size` barrier slots, then `signal_count` user slots.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceWindow {
    /// This rank's data region.
    pub data: u64,
    /// Bytes in the data region (same on every rank).
    pub data_bytes: u64,
    /// This rank's signal pad (`u64*`), barrier slots first.
    pub signals: u64,
    /// User slots per pad.
    pub signal_count: u64,
    /// Device `u64[world_size]`: each rank's data region as mapped here (0 without NVLink).
    pub peer_data: u64,
    /// Device `u64[world_size]`: each rank's signal pad as mapped here (0 without NVLink).
    pub peer_signals: u64,
    /// `DeviceErrorState*` in host-mapped memory.
    pub error_state: u64,
    /// Bound of every wait on this window, in nanoseconds.
    pub timeout_ns: u64,
    /// Device `u64[2]`: `[0]` this rank's barrier counter (not visible to peers), `[1]` the
    /// address of the communicator's abort mirror ([`DeviceErrorState::mirror`]).
    pub barrier_epoch: u64,
    /// This rank.
    pub rank: i32,
    /// Number of ranks.
    pub world_size: i32,
}

/// Peer addresses of a registered user buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevicePeerTable {
    /// Device `u64[world_size]`: the buffer's base as mapped here, 0 where unreachable.
    pub peer_base: u64,
    /// This rank.
    pub rank: i32,
    /// Number of ranks.
    pub world_size: i32,
}

/// The registered-buffer handle (layout fixed by the source documents).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegisteredBuffer {
    /// Base address of the user's buffer on this rank.
    pub base_ptr: u64,
    /// Size in bytes.
    pub size: u64,
    /// `DevicePeerTable*` for NVLink registrations.
    pub backend_window: u64,
    /// The buffer's key with the network transport (a job with network links whose UCX can
    /// register GPU memory: docs/NETWORK.md); 0 otherwise (NVLink only).
    pub lkey: u32,
    /// Padding; keep zero.
    pub reserved: u32,
}

// SAFETY: all of these are plain `#[repr(C)]` integers with no padding that the device could
// misread; their layout equals the C++ structs (asserted below and in tests/layout.rs).
unsafe impl DeviceRepr for DeviceWindow {}
// SAFETY: as above.
unsafe impl DeviceRepr for DevicePeerTable {}
// SAFETY: as above.
unsafe impl DeviceRepr for RegisteredBuffer {}
// SAFETY: as above.
unsafe impl DeviceRepr for DeviceErrorState {}

/// Field offsets as `(struct, field, offset, size_of struct)`, for the layout test.
pub(crate) const LAYOUT: &[(&str, &str, usize, usize)] = &[
    (
        "ErrorRecord",
        "flag",
        offset_of!(ErrorRecord, flag),
        size_of::<ErrorRecord>(),
    ),
    (
        "ErrorRecord",
        "op",
        offset_of!(ErrorRecord, op),
        size_of::<ErrorRecord>(),
    ),
    (
        "ErrorRecord",
        "rank",
        offset_of!(ErrorRecord, rank),
        size_of::<ErrorRecord>(),
    ),
    (
        "ErrorRecord",
        "peer",
        offset_of!(ErrorRecord, peer),
        size_of::<ErrorRecord>(),
    ),
    (
        "ErrorRecord",
        "slot",
        offset_of!(ErrorRecord, slot),
        size_of::<ErrorRecord>(),
    ),
    (
        "ErrorRecord",
        "expected",
        offset_of!(ErrorRecord, expected),
        size_of::<ErrorRecord>(),
    ),
    (
        "ErrorRecord",
        "seen",
        offset_of!(ErrorRecord, seen),
        size_of::<ErrorRecord>(),
    ),
    (
        "ErrorRecord",
        "elapsed_ns",
        offset_of!(ErrorRecord, elapsed_ns),
        size_of::<ErrorRecord>(),
    ),
    (
        "DeviceErrorState",
        "abort",
        offset_of!(DeviceErrorState, abort),
        size_of::<DeviceErrorState>(),
    ),
    (
        "DeviceErrorState",
        "record",
        offset_of!(DeviceErrorState, record),
        size_of::<DeviceErrorState>(),
    ),
    (
        "DeviceErrorState",
        "mirror",
        offset_of!(DeviceErrorState, mirror),
        size_of::<DeviceErrorState>(),
    ),
    (
        "DeviceWindow",
        "data",
        offset_of!(DeviceWindow, data),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "data_bytes",
        offset_of!(DeviceWindow, data_bytes),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "signals",
        offset_of!(DeviceWindow, signals),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "signal_count",
        offset_of!(DeviceWindow, signal_count),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "peer_data",
        offset_of!(DeviceWindow, peer_data),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "peer_signals",
        offset_of!(DeviceWindow, peer_signals),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "error_state",
        offset_of!(DeviceWindow, error_state),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "timeout_ns",
        offset_of!(DeviceWindow, timeout_ns),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "barrier_epoch",
        offset_of!(DeviceWindow, barrier_epoch),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "rank",
        offset_of!(DeviceWindow, rank),
        size_of::<DeviceWindow>(),
    ),
    (
        "DeviceWindow",
        "world_size",
        offset_of!(DeviceWindow, world_size),
        size_of::<DeviceWindow>(),
    ),
    (
        "DevicePeerTable",
        "peer_base",
        offset_of!(DevicePeerTable, peer_base),
        size_of::<DevicePeerTable>(),
    ),
    (
        "DevicePeerTable",
        "rank",
        offset_of!(DevicePeerTable, rank),
        size_of::<DevicePeerTable>(),
    ),
    (
        "DevicePeerTable",
        "world_size",
        offset_of!(DevicePeerTable, world_size),
        size_of::<DevicePeerTable>(),
    ),
    (
        "RegisteredBuffer",
        "base_ptr",
        offset_of!(RegisteredBuffer, base_ptr),
        size_of::<RegisteredBuffer>(),
    ),
    (
        "RegisteredBuffer",
        "size",
        offset_of!(RegisteredBuffer, size),
        size_of::<RegisteredBuffer>(),
    ),
    (
        "RegisteredBuffer",
        "backend_window",
        offset_of!(RegisteredBuffer, backend_window),
        size_of::<RegisteredBuffer>(),
    ),
    (
        "RegisteredBuffer",
        "lkey",
        offset_of!(RegisteredBuffer, lkey),
        size_of::<RegisteredBuffer>(),
    ),
];

const _: () = {
    assert!(size_of::<ErrorRecord>() == 48);
    assert!(offset_of!(ErrorRecord, slot) == 16);
    assert!(offset_of!(ErrorRecord, elapsed_ns) == 40);
    assert!(size_of::<DeviceErrorState>() == 64);
    assert!(offset_of!(DeviceErrorState, mirror) == 56);
    assert!(offset_of!(DeviceErrorState, record) == 8);
    assert!(size_of::<DeviceWindow>() == 80);
    assert!(offset_of!(DeviceWindow, peer_data) == 32);
    assert!(offset_of!(DeviceWindow, barrier_epoch) == 64);
    assert!(offset_of!(DeviceWindow, rank) == 72);
    assert!(size_of::<DevicePeerTable>() == 16);
    assert!(size_of::<RegisteredBuffer>() == 32);
    assert!(offset_of!(RegisteredBuffer, backend_window) == 16);
    assert!(offset_of!(RegisteredBuffer, lkey) == 24);
};

#[cfg(test)]
mod tests {
    use super::DeviceOp;

    /// Every code of `DeviceOp` in the C++ header (but `kOpNone`) decodes to a named op.
    #[test]
    fn every_device_op_of_the_header_decodes() {
        let header = include_str!("../cuda/devcomm/handles.cuh");
        let body = header
            .split("enum DeviceOp : dc_u32 {")
            .nth(1)
            .and_then(|b| b.split("};").next())
            .expect("DeviceOp in handles.cuh");
        let codes: Vec<(String, u32)> = body
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.trim().split_once('=')?;
                let code = rest.trim().split(',').next()?.trim().parse().ok()?;
                Some((name.trim().to_owned(), code))
            })
            .collect();
        assert!(codes.len() >= 19, "{codes:?}");
        for (name, code) in codes {
            let op = DeviceOp::from_code(code);
            assert_eq!(
                matches!(op, DeviceOp::Unknown(_)),
                name == "kOpNone",
                "{name} = {code} decodes to {op:?}"
            );
        }
    }
}
