//! Layer 0: what the host shares with the kernels, in one place.
//!
//! - Words and bits of the send/recv protocol (`cuda/devcomm/p2p.cuh`): the copy-engine slot
//!   and pad-word offsets and the `P2PSide::pull` bits. Plain constants, below every layer:
//!   `cuda` decodes error records with them, `p2p` lays out its window and launches with them
//!   (re-exported as `p2p::config::*`).
//! - The `#[repr(C)]` twins of the kernels' structs and their [`layout`]: the launch
//!   arguments of send/recv, the collectives and the reductions and the network structs are
//!   defined here (`p2p_launch`, `coll_launch`, `reduce_launch`, `net`), the device handles
//!   ([`DeviceWindow`], [`RegisteredBuffer`]) in `handles`. Nothing here imports a module above
//!   this layer.

/// Copy-engine slots per (sender, receiver) and pad words per peer (`cuda/devcomm/p2p.cuh`).
pub const CE_SLOTS: u64 = 4;
/// Pad words of the copy-engine protocol per peer.
pub const CE_WORDS: usize = 64;

/// Whether copy-engine slot `i` is pulled by the receiver's copy engine from the sender's
/// outbox (odd) or pushed by the sender's into the receiver's inbox (even).
pub fn ce_pulled(i: usize) -> bool {
    i % 2 == 1
}
/// Offsets in a peer's block of copy-engine words that the host reads or writes (the whole
/// layout is in `cuda/devcomm/p2p.cuh`, `kCe*`): SIZE\[slot\] (in an error record), GO\[slot\] and
/// DONE\[slot\] (the copy streams' memory operations).
pub const CE_SIZE: usize = 8;
/// See [`CE_SIZE`].
pub const CE_GO: usize = 20;
/// See [`CE_SIZE`].
pub const CE_DONE: usize = 24;
/// `P2PSide::pull` bits (`cuda/devcomm/p2p.cuh`, `kSide*`): pull (staged) or by SMs (copy
/// engine); gated on the negotiation of a large message's layout; announces this side's type
/// for that negotiation.
pub const P2P_SIDE_PULL: u32 = 1;
/// See [`P2P_SIDE_PULL`].
pub const P2P_SIDE_GATED: u32 = 2;
/// See [`P2P_SIDE_PULL`].
pub const P2P_SIDE_ANNOUNCE: u32 = 4;

/// GOR\[slot\] and DONER\[slot\]: the receiver's copy stream's waits and reports (pulled chunks).
pub const CE_GO_R: usize = 36;
/// See [`CE_GO_R`].
pub const CE_DONE_R: usize = 40;
/// DEC_S and DEC_R: the negotiation's decision for this rank's current message to the peer and
/// from it (`p2p_negotiated_kernel` puts them back to 0 once the role's blocks are done).
pub const CE_DEC_S: usize = 50;
/// See [`CE_DEC_S`].
pub const CE_DEC_R: usize = 51;

pub mod coll_launch;
pub mod net;
pub mod p2p_launch;
pub mod reduce_launch;

pub use crate::handles::{
    DeviceErrorState, DeviceOp, DevicePeerTable, DeviceWindow, ErrorRecord, RegisteredBuffer,
};
/// The `#[repr(C)]` twins of the structs in `cuda/devcomm/*.cuh` that the host hands to the
/// kernels or reads back, gathered here.
pub use coll_launch::{CollLaunch, MODE_DEVICE_COUNTS, MODE_PEER_ROWS, MODE_UNIFORM};
pub use p2p_launch::{P2PLaunch, P2PNegotiated, P2PSide, ZcLaunch};
pub use reduce_launch::ReduceLaunch;

/// `(struct, field, offset, size)` of every shared struct above, in declaration order, for the
/// test that compiles the C++ headers and compares (`tests/layout.rs`).
pub fn layout() -> Vec<(&'static str, &'static str, usize, usize)> {
    crate::handles::LAYOUT
        .iter()
        .chain(p2p_launch::LAYOUT)
        .chain(coll_launch::LAYOUT)
        .chain(reduce_launch::LAYOUT)
        .chain(reduce_launch::NET_STEP_LAYOUT)
        .copied()
        .collect()
}

/// Largest message a send/recv call can describe to its peer: the byte count travels in 40
/// bits of the call word (`cuda/devcomm/call_word.cuh`, `kP2PBytesMask`), 1 TiB - 1.
pub const AGREE_MAX_BYTES: u64 = (1 << 40) - 1;

/// Refuses a message too large for the call's descriptor (`op` names the call).
pub fn check_message_bytes(op: &'static str, bytes: u64) -> crate::error::Result<()> {
    if bytes > AGREE_MAX_BYTES {
        return Err(crate::error::Error::InvalidArgument {
            op,
            reason: format!(
                "{bytes} bytes is larger than the largest message ({AGREE_MAX_BYTES} bytes)"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_up_to_the_descriptor_limit_are_accepted() {
        assert!(check_message_bytes("send", AGREE_MAX_BYTES).is_ok());
        let err = check_message_bytes("send", AGREE_MAX_BYTES + 1).unwrap_err();
        assert!(err.to_string().contains("largest message"), "{err}");
    }
}
