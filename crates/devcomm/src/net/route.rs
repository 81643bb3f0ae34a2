//! Send/recv with network peers (docs/NETWORK.md, "Send/recv over the network"): the pure
//! layouts the launcher and `cuda/kernels/sendrecv_net.cu` share. Which route a call takes is
//! the mesh's decision (`mesh::Mesh::p2p_route`), not this transport's.
//!
//! - [`StagingLayout`]: the host-mapped staging every rank registers with UCX, the same
//!   offsets on every rank: two signal words per peer (`READY` written by that peer's proxy:
//!   chunks it sent here; `FREE` written by that peer's proxy: chunks of ours it consumed),
//!   then an outbox and an inbox of `slots` slots per peer, each slot a 64-byte
//!   [`ChunkHeader`] followed by `slot_bytes` of payload.
//! - [`chunks`]: how a message is cut into slots.
//! - [`NetP2PLaunch`]: the kernel's argument, twin of `NetP2PLaunch` in `net_p2p.cuh`.

use crate::error::{Error, Result};

/// Bytes of the header in front of each chunk's payload.
pub const HEADER_BYTES: u64 = 64;
/// `ChunkHeader::kind` of a send/recv chunk ("NETS" in ASCII, so that zeroed memory never
/// passes for one).
pub const KIND_SENDRECV: u32 = 0x5354_454E;
/// `ChunkHeader::kind` of a collective's chunk ("NCOL").
pub const KIND_COLLECTIVE: u32 = 0x4C4F_434E;
/// Queue channel of the sender's chunks (`READY` words).
pub const CHANNEL_DATA: u32 = 0;
/// Queue channel of the receiver's credits (`FREE` words); a channel per direction keeps one
/// producer per queue when one launch both sends and receives.
pub const CHANNEL_CREDIT: u32 = 1;
/// Channels every network peer needs.
pub const CHANNELS: u32 = 2;
/// Set in a `FREE` word by a receiver that refused a call: bits 56..63 carry the field
/// (`call_mismatch_field`), bits 0..56 the receiver's value.
pub(crate) const REFUSED: u64 = 1 << 63;

/// The header in front of each chunk's payload in a slot (`NetChunkHeader` in `net_p2p.cuh`):
/// the call's agreement, checked by the receiver before it writes the destination.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkHeader {
    /// [`KIND_SENDRECV`] or [`KIND_COLLECTIVE`].
    pub kind: u32,
    /// Index of the chunk in its message.
    pub chunk: u32,
    /// The sender's call number with this receiver (1, 2, ... since the communicator was built).
    pub call: u64,
    /// The message's size in bytes (a collective: its wire bytes with this peer).
    pub bytes: u64,
    /// A collective's operation (`CollLaunch::mode` + 1); 0 for send/recv.
    pub op: u64,
    /// All-to-all-v: the rows sent (the count exchange); 0 otherwise.
    pub rows: u64,
    /// Padding to 64 bytes.
    pub reserved: [u64; 3],
}

/// The network send/recv kernel's argument, defined with the other twins in `abi`.
pub(crate) use crate::abi::net::NetP2PLaunch;

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ChunkHeader>() == HEADER_BYTES as usize);
    assert!(offset_of!(ChunkHeader, call) == 8);
    assert!(offset_of!(ChunkHeader, bytes) == 16);
    assert!(offset_of!(ChunkHeader, rows) == 32);
};

/// Where everything is in one rank's staging (the same on every rank: it depends only on the
/// world size and the settings that must agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingLayout {
    /// Ranks.
    pub world: u64,
    /// Slots per (peer, direction).
    pub slots: u64,
    /// Payload bytes per slot (a multiple of 64).
    pub slot_bytes: u64,
}

impl StagingLayout {
    /// The layout for `world` ranks; refuses a slot size that is not a positive multiple of
    /// 64 bytes, fewer than 2 slots, or a total beyond 16 GiB (pure).
    pub fn new(world: usize, slots: u32, slot_bytes: u64) -> Result<Self> {
        let layout = Self {
            world: world as u64,
            slots: u64::from(slots),
            slot_bytes,
        };
        let ok = slot_bytes > 0 && slot_bytes % 64 == 0 && slots >= 2 && world > 0;
        if !ok || layout.total().is_none_or(|t| t > 16 << 30) {
            return Err(Error::InvalidArgument {
                op: "network staging",
                reason: format!(
                    "{world} ranks x 2 directions x {slots} slots of {slot_bytes} bytes: the slot \
                     size must be a positive multiple of 64, at least 2 slots, at most 16 GiB in \
                     all (DEVCOMM_NET_SLOT_KIB, DEVCOMM_NET_SLOTS)"
                ),
            });
        }
        Ok(layout)
    }

    /// Bytes of the signal words, rounded up to a page.
    pub fn words_bytes(&self) -> u64 {
        (self.world * 16).div_ceil(4096) * 4096
    }

    /// Bytes from one slot to the next (header and payload).
    pub(crate) fn slot_stride(&self) -> u64 {
        HEADER_BYTES + self.slot_bytes
    }

    /// Total bytes of the staging, `None` on overflow.
    pub fn total(&self) -> Option<u64> {
        let slots = self.world.checked_mul(2)?.checked_mul(self.slots)?;
        slots
            .checked_mul(self.slot_stride())?
            .checked_add(self.words_bytes())
    }

    /// Word index (in `u64`s from the start) of the `READY` word that `sender` writes here.
    pub fn ready_word(sender: usize) -> u64 {
        2 * sender as u64
    }

    /// Word index of the `FREE` word that `receiver` writes here.
    pub fn free_word(receiver: usize) -> u64 {
        2 * receiver as u64 + 1
    }

    /// Offset of this rank's outbox slot `slot` for `peer`.
    pub fn outbox(&self, peer: usize, slot: u64) -> u64 {
        self.words_bytes() + (peer as u64 * self.slots + slot) * self.slot_stride()
    }

    /// Offset of the inbox slot `slot` that `sender` fills here.
    pub fn inbox(&self, sender: usize, slot: u64) -> u64 {
        self.words_bytes() + ((self.world + sender as u64) * self.slots + slot) * self.slot_stride()
    }
}

/// Chunks of a message of `bytes` with `slot_bytes` of payload per slot (pure; 0 for an empty
/// message, which moves nothing).
pub fn chunks(bytes: u64, slot_bytes: u64) -> u64 {
    bytes.div_ceil(slot_bytes.max(1))
}

/// The value a receiver stores into the sender's `FREE` word to refuse a call: the field
/// that differs and the receiver's value (low 56 bits) (pure).
pub fn refusal(field: u64, value: u64) -> u64 {
    REFUSED | (field & 0x7f) << 56 | (value & ((1 << 56) - 1))
}

/// A `FREE` word's refusal, if it is one: (field, receiver's value) (pure).
pub fn refused(word: u64) -> Option<(u64, u64)> {
    (word & REFUSED != 0).then_some(((word >> 56) & 0x7f, word & ((1 << 56) - 1)))
}

/// Layout of the structs shared with `net_p2p.cuh`: (C++ struct, field, offset, size of
/// struct), compared with the C++ compiler's by `tests/net_layout.rs`.
pub const LAYOUT: &[(&str, &str, usize, usize)] = {
    use std::mem::{offset_of, size_of};
    const H: usize = size_of::<ChunkHeader>();
    const L: usize = size_of::<NetP2PLaunch>();
    &[
        ("NetChunkHeader", "kind", offset_of!(ChunkHeader, kind), H),
        ("NetChunkHeader", "chunk", offset_of!(ChunkHeader, chunk), H),
        ("NetChunkHeader", "call", offset_of!(ChunkHeader, call), H),
        ("NetChunkHeader", "bytes", offset_of!(ChunkHeader, bytes), H),
        ("NetChunkHeader", "op", offset_of!(ChunkHeader, op), H),
        ("NetChunkHeader", "rows", offset_of!(ChunkHeader, rows), H),
        ("NetP2PLaunch", "q", offset_of!(NetP2PLaunch, q), L),
        (
            "NetP2PLaunch",
            "staging",
            offset_of!(NetP2PLaunch, staging),
            L,
        ),
        (
            "NetP2PLaunch",
            "counters",
            offset_of!(NetP2PLaunch, counters),
            L,
        ),
        (
            "NetP2PLaunch",
            "slot_bytes",
            offset_of!(NetP2PLaunch, slot_bytes),
            L,
        ),
        ("NetP2PLaunch", "slots", offset_of!(NetP2PLaunch, slots), L),
        ("NetP2PLaunch", "key", offset_of!(NetP2PLaunch, key), L),
        (
            "NetP2PLaunch",
            "send_buf",
            offset_of!(NetP2PLaunch, send_buf),
            L,
        ),
        (
            "NetP2PLaunch",
            "send_bytes",
            offset_of!(NetP2PLaunch, send_bytes),
            L,
        ),
        (
            "NetP2PLaunch",
            "recv_buf",
            offset_of!(NetP2PLaunch, recv_buf),
            L,
        ),
        (
            "NetP2PLaunch",
            "recv_bytes",
            offset_of!(NetP2PLaunch, recv_bytes),
            L,
        ),
        (
            "NetP2PLaunch",
            "send_peer",
            offset_of!(NetP2PLaunch, send_peer),
            L,
        ),
        (
            "NetP2PLaunch",
            "recv_peer",
            offset_of!(NetP2PLaunch, recv_peer),
            L,
        ),
    ]
};

#[cfg(test)]
mod tests;
