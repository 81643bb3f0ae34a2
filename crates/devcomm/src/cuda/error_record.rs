//! Decoding a record a kernel wrote into the host-mapped error state ([`super::ErrorState`])
//! into the error the host call returns.

use std::time::Duration;

use crate::error::Error;
use crate::handles::{DeviceOp, ErrorRecord};

/// Converts a written record into the error the host reports.
pub(crate) fn record_to_error(record: &ErrorRecord) -> Error {
    if DeviceOp::from_code(record.op) == DeviceOp::CountOverflow {
        return Error::CountOverflow {
            rank: record.rank,
            side: if record.peer >= 0 { "send" } else { "receive" },
            peer: record.peer,
            needed: record.seen,
            capacity: record.expected,
        };
    }
    if DeviceOp::from_code(record.op) == DeviceOp::ZeroCopyMismatch {
        return Error::ZeroCopyMismatch {
            rank: record.rank,
            peer: record.peer,
            field: match record.slot {
                0 => "the registration",
                1 => "the offset",
                2 => "the size in bytes",
                _ => "the call (refused by the sender; receiver's size in bytes)",
            },
            local: record.expected,
            remote: record.seen,
        };
    }
    if DeviceOp::from_code(record.op) == DeviceOp::CopyEngineMismatch {
        // The kernel records the word of the peer's block: INTENT or SIZE of a slot.
        use crate::abi::{CE_SIZE, CE_SLOTS};
        let size_words = CE_SIZE as u64..CE_SIZE as u64 + CE_SLOTS;
        return Error::CopyEngineMismatch {
            rank: record.rank,
            peer: record.peer,
            field: if size_words.contains(&record.slot) {
                "the message size"
            } else {
                "the chunk id"
            },
            expected: record.expected,
            seen: record.seen,
        };
    }
    if DeviceOp::from_code(record.op) == DeviceOp::CallMismatch {
        let (what, field) = call_mismatch_field(record.slot);
        return Error::CallMismatch {
            rank: record.rank,
            peer: record.peer,
            what,
            field,
            local: record.expected,
            remote: record.seen,
        };
    }
    if matches!(
        DeviceOp::from_code(record.op),
        DeviceOp::NetQueueFull
            | DeviceOp::NetPeerFailed
            | DeviceOp::NetFlush
            | DeviceOp::NetBadDescriptor
    ) {
        // Written by the network proxy (or a network producer's wait): worded by the network
        // errors' module (its codes and UCX statuses; a pure decoder, no UCX needed).
        return Error::Network {
            rank: record.rank,
            peer: record.peer,
            message: crate::error::net::from_record(record).to_string(),
        };
    }
    Error::PeerTimeout {
        op: DeviceOp::from_code(record.op),
        rank: record.rank,
        peer: record.peer,
        slot: record.slot,
        expected: record.expected,
        seen: record.seen,
        elapsed: Duration::from_nanos(record.elapsed_ns),
    }
}

/// The call and field a call-agreement record names by its `slot`: the field codes of the
/// call word (`cuda/devcomm/call_word.cuh`, `kField*`), and 5, the network send/recv's call
/// number (`net_p2p.cuh`).
pub(crate) fn call_mismatch_field(slot: u64) -> (&'static str, &'static str) {
    match slot {
        1 => (
            "a call",
            "the kind of call (0: send/recv, 1: zero-copy send/recv, 2: collective, 3: barrier)",
        ),
        2 => ("send/recv", "the size in bytes"),
        3 => (
            "a collective",
            "the operation (1: all-to-all, 2: send/recv with hooks, 3: all-to-all-v; with \
             network links a reduction's steps: 4-7 the reduce-scatter step of an all-reduce with \
             sum, avg, max, min, 8-11 a reduce-scatter with them, 12 the all-gather step of an \
             all-reduce, 13 an all-gather, 14 a barrier; over a network link bits 8-11 add the \
             element type + 1 and bit 12 an epilogue hook)",
        ),
        4 => (
            "a collective",
            "the bytes exchanged with this peer (wire bytes, low 36 bits; a reduction's step \
             with network links between NVLink peers: low 32 bits, and bits 32-34 the element \
             type + 1, bit 35 an epilogue hook)",
        ),
        5 => (
            "send/recv over the network",
            "the call number with this peer (calls made since the communicator was built)",
        ),
        6 => (
            "a reduction",
            "the collective (0: all-reduce, 1: reduce-scatter, 2: all-gather)",
        ),
        7 => (
            "a reduction",
            "the element type (0: f32, 1: f16, 2: bf16, 3: f64, 4: i32, 5: i64, 6: u8; 7: the \
             rank refused the call's buffers, an overlap that only the owner of that shard may \
             pass, and launched it so that no peer waits: nothing is written)",
        ),
        8 => (
            "a reduction",
            "the operator (0: sum, 1: avg, 2: max, 3: min, 7: none, an all-gather)",
        ),
        9 => (
            "a reduction",
            "whether an epilogue hook runs (0: no, 1: yes)",
        ),
        10 => ("a reduction", "the bytes of the whole buffer"),
        11 => (
            "a reduction",
            "whether its buffers are in the memory pool (1: zero-copy; the buffers of a call \
             must be pool memory on every rank or on none)",
        ),
        12 => (
            "a reduction",
            "the place of its pool buffers (a hash of the algorithm, segments and offsets: the \
             ranks allocated their pool buffers in different orders; allocate alike on every \
             rank, or set DEVCOMM_REDUCE_ZERO_COPY=0)",
        ),
        _ => ("a call", "an unknown field"),
    }
}
