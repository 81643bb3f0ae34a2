//! The structs shared with `cuda/devcomm/net.cuh` and `net_p2p.cuh`: descriptors, the queue
//! header, the handles kernels receive and the network send/recv kernel's argument, with their
//! layout asserted here (const), in the headers (`static_assert`) and compared by
//! `tests/net_layout.rs`. Change both sides together. `net::descriptor` re-exports this.

/// What a descriptor asks the proxy to do (`NetOp` in `net.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum NetOp {
    /// Copy `bytes` from the local registration `key` at `src_offset` to the peer's
    /// registration `key` at `dst_offset`.
    Put = 1,
    /// `Put`, then the signal (`signal_op` on the peer's `signal_key` word), ordered after the
    /// data.
    PutSignal = 2,
    /// The signal alone, ordered after every earlier put to the peer.
    Signal = 3,
    /// Completes every earlier operation of the queue, then publishes `done = seq`.
    Flush = 4,
}

impl NetOp {
    /// Decodes an op word (pure).
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(Self::Put),
            2 => Some(Self::PutSignal),
            3 => Some(Self::Signal),
            4 => Some(Self::Flush),
            _ => None,
        }
    }
}

/// How a signal changes the peer's 64-bit word (`NetSignalOp` in `net.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SignalOp {
    /// No signal.
    None = 0,
    /// The word becomes `signal_value`.
    Set = 1,
    /// `signal_value` is added to the word (counters). A network signal word has one
    /// writer, the rank whose slot it is: the proxy writes its running sum.
    Add = 2,
}

impl SignalOp {
    /// Decodes a signal-op word (pure).
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(Self::None),
            1 => Some(Self::Set),
            2 => Some(Self::Add),
            _ => None,
        }
    }
}

/// One queue entry, 64 bytes. `seq` is written last (release) and marks the entry full.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetDescriptor {
    /// [`NetOp`] code.
    pub op: u32,
    /// Registration of the data: the source here, the destination on the peer.
    pub key: u32,
    /// Offset of the source in the local registration.
    pub src_offset: u64,
    /// Offset of the destination in the peer's registration.
    pub dst_offset: u64,
    /// Bytes to copy (0 for a signal or flush).
    pub bytes: u64,
    /// Registration of the peer's signal word.
    pub signal_key: u32,
    /// [`SignalOp`] code.
    pub signal_op: u32,
    /// Byte offset of the signal word in `signal_key` (8-byte aligned).
    pub signal_offset: u64,
    /// Value set or added.
    pub signal_value: u64,
    /// Position in the queue plus one; written last.
    pub seq: u64,
}

/// The shared words of one queue, 128 bytes: producer's and proxy's words on separate lines.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetQueueHeader {
    /// Descriptors written (producer only).
    pub head: u64,
    /// Padding to the proxy's cache line.
    pub reserved0: [u64; 7],
    /// Descriptors consumed (proxy only): the producer's credits.
    pub tail: u64,
    /// `seq` of the last flush whose operations completed (proxy only).
    pub done: u64,
    /// Padding.
    pub reserved1: [u64; 6],
}

/// Where the queues of a communicator are, as a kernel receives them (`NetQueues` in
/// `net.cuh`); passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetQueuesHandle {
    /// Address of queue (peer 0, channel 0) as the producer addresses it.
    pub base: u64,
    /// Bytes from one queue to the next (header plus entries).
    pub stride: u64,
    /// Entries per queue.
    pub capacity: u32,
    /// Queues per peer.
    pub channels: u32,
    /// Ranks in the communicator (queues exist for every rank; a rank's own are unused).
    pub world_size: u32,
    /// This rank.
    pub rank: u32,
    /// Host-mapped `DeviceErrorState` for the bounded waits.
    pub error_state: u64,
    /// Bound of every producer wait, in nanoseconds.
    pub timeout_ns: u64,
}

/// A window's network path as a kernel receives it (`WindowNet` in `window_net.cuh`), beside
/// its [`DeviceWindow`](crate::DeviceWindow); passed by value. All zero: no network path.
///
/// The window's data and signal pad are registered with the transport under `data_key` and
/// `signal_key` (the same keys on every rank); a kernel's operations towards a network peer
/// go through queue channel `first_channel + c` of that peer, `c < channels`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowNetHandle {
    /// The communicator's queues.
    pub queues: NetQueuesHandle,
    /// The first queue channel of users' kernels.
    pub first_channel: u32,
    /// Channels users' kernels may use (`DEVCOMM_NET_USER_CHANNELS`).
    pub channels: u32,
    /// Registration of every rank's window data.
    pub data_key: u32,
    /// Registration of every rank's signal pad.
    pub signal_key: u32,
}

// SAFETY: plain `#[repr(C)]` integers without padding; the layout equals the C++ struct's
// (asserted below and in tests/net_layout.rs).
unsafe impl cudarc::driver::DeviceRepr for WindowNetHandle {}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<NetDescriptor>() == 64);
    assert!(offset_of!(NetDescriptor, key) == 4);
    assert!(offset_of!(NetDescriptor, signal_key) == 32);
    assert!(offset_of!(NetDescriptor, seq) == 56);
    assert!(size_of::<NetQueueHeader>() == 128);
    assert!(offset_of!(NetQueueHeader, tail) == 64);
    assert!(offset_of!(NetQueueHeader, done) == 72);
    assert!(size_of::<NetQueuesHandle>() == 48);
    assert!(offset_of!(NetQueuesHandle, capacity) == 16);
    assert!(offset_of!(NetQueuesHandle, error_state) == 32);
    assert!(size_of::<WindowNetHandle>() == 64);
    assert!(offset_of!(WindowNetHandle, first_channel) == 48);
    assert!(offset_of!(WindowNetHandle, signal_key) == 60);
};

/// Layout of the structs shared with `net.cuh`: (C++ struct, field, offset, size of struct),
/// compared with the C++ compiler's by `tests/net_layout.rs`.
pub const LAYOUT: &[(&str, &str, usize, usize)] = &[
    (
        "NetDescriptor",
        "op",
        std::mem::offset_of!(NetDescriptor, op),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetDescriptor",
        "key",
        std::mem::offset_of!(NetDescriptor, key),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetDescriptor",
        "src_offset",
        std::mem::offset_of!(NetDescriptor, src_offset),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetDescriptor",
        "dst_offset",
        std::mem::offset_of!(NetDescriptor, dst_offset),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetDescriptor",
        "bytes",
        std::mem::offset_of!(NetDescriptor, bytes),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetDescriptor",
        "signal_key",
        std::mem::offset_of!(NetDescriptor, signal_key),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetDescriptor",
        "signal_op",
        std::mem::offset_of!(NetDescriptor, signal_op),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetDescriptor",
        "signal_offset",
        std::mem::offset_of!(NetDescriptor, signal_offset),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetDescriptor",
        "signal_value",
        std::mem::offset_of!(NetDescriptor, signal_value),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetDescriptor",
        "seq",
        std::mem::offset_of!(NetDescriptor, seq),
        std::mem::size_of::<NetDescriptor>(),
    ),
    (
        "NetQueueHeader",
        "head",
        std::mem::offset_of!(NetQueueHeader, head),
        std::mem::size_of::<NetQueueHeader>(),
    ),
    (
        "NetQueueHeader",
        "reserved0",
        std::mem::offset_of!(NetQueueHeader, reserved0),
        std::mem::size_of::<NetQueueHeader>(),
    ),
    (
        "NetQueueHeader",
        "tail",
        std::mem::offset_of!(NetQueueHeader, tail),
        std::mem::size_of::<NetQueueHeader>(),
    ),
    (
        "NetQueueHeader",
        "done",
        std::mem::offset_of!(NetQueueHeader, done),
        std::mem::size_of::<NetQueueHeader>(),
    ),
    (
        "NetQueueHeader",
        "reserved1",
        std::mem::offset_of!(NetQueueHeader, reserved1),
        std::mem::size_of::<NetQueueHeader>(),
    ),
    (
        "NetQueues",
        "base",
        std::mem::offset_of!(NetQueuesHandle, base),
        std::mem::size_of::<NetQueuesHandle>(),
    ),
    (
        "NetQueues",
        "stride",
        std::mem::offset_of!(NetQueuesHandle, stride),
        std::mem::size_of::<NetQueuesHandle>(),
    ),
    (
        "NetQueues",
        "capacity",
        std::mem::offset_of!(NetQueuesHandle, capacity),
        std::mem::size_of::<NetQueuesHandle>(),
    ),
    (
        "NetQueues",
        "channels",
        std::mem::offset_of!(NetQueuesHandle, channels),
        std::mem::size_of::<NetQueuesHandle>(),
    ),
    (
        "NetQueues",
        "world_size",
        std::mem::offset_of!(NetQueuesHandle, world_size),
        std::mem::size_of::<NetQueuesHandle>(),
    ),
    (
        "NetQueues",
        "rank",
        std::mem::offset_of!(NetQueuesHandle, rank),
        std::mem::size_of::<NetQueuesHandle>(),
    ),
    (
        "NetQueues",
        "error_state",
        std::mem::offset_of!(NetQueuesHandle, error_state),
        std::mem::size_of::<NetQueuesHandle>(),
    ),
    (
        "NetQueues",
        "timeout_ns",
        std::mem::offset_of!(NetQueuesHandle, timeout_ns),
        std::mem::size_of::<NetQueuesHandle>(),
    ),
    (
        "WindowNet",
        "queues",
        std::mem::offset_of!(WindowNetHandle, queues),
        std::mem::size_of::<WindowNetHandle>(),
    ),
    (
        "WindowNet",
        "first_channel",
        std::mem::offset_of!(WindowNetHandle, first_channel),
        std::mem::size_of::<WindowNetHandle>(),
    ),
    (
        "WindowNet",
        "channels",
        std::mem::offset_of!(WindowNetHandle, channels),
        std::mem::size_of::<WindowNetHandle>(),
    ),
    (
        "WindowNet",
        "data_key",
        std::mem::offset_of!(WindowNetHandle, data_key),
        std::mem::size_of::<WindowNetHandle>(),
    ),
    (
        "WindowNet",
        "signal_key",
        std::mem::offset_of!(WindowNetHandle, signal_key),
        std::mem::size_of::<WindowNetHandle>(),
    ),
];

/// The network send/recv kernel's argument (`NetP2PLaunch` in `net_p2p.cuh`); a role with
/// `peer < 0` is absent.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetP2PLaunch {
    /// The descriptor queues.
    pub q: NetQueuesHandle,
    /// Device address of this rank's staging (`net::route::StagingLayout`).
    pub staging: u64,
    /// Device `u64[world][4]`: chunks sent, calls sent, chunks received, calls received.
    pub counters: u64,
    /// Payload bytes per slot.
    pub slot_bytes: u64,
    /// Slots per (peer, direction).
    pub slots: u32,
    /// The staging's registration key (data and signal words).
    pub key: u32,
    /// Source of the send role.
    pub send_buf: u64,
    /// Bytes of the send role.
    pub send_bytes: u64,
    /// Destination of the receive role.
    pub recv_buf: u64,
    /// Bytes of the receive role.
    pub recv_bytes: u64,
    /// Peer of the send role, -1: none.
    pub send_peer: i32,
    /// Peer of the receive role, -1: none.
    pub recv_peer: i32,
}

// SAFETY: plain integers, `repr(C)`, the layout of the C++ twin (asserted below and by
// tests/net_layout.rs).
unsafe impl cudarc::driver::DeviceRepr for NetP2PLaunch {}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<NetP2PLaunch>() == 120);
    assert!(offset_of!(NetP2PLaunch, staging) == 48);
    assert!(offset_of!(NetP2PLaunch, slots) == 72);
    assert!(offset_of!(NetP2PLaunch, send_buf) == 80);
    assert!(offset_of!(NetP2PLaunch, send_peer) == 112);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_decode() {
        assert_eq!(NetOp::from_code(4), Some(NetOp::Flush));
        assert_eq!(NetOp::from_code(9), None);
        assert_eq!(SignalOp::from_code(2), Some(SignalOp::Add));
        assert_eq!(SignalOp::from_code(3), None);
    }
}
