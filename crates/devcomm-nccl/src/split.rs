//! `ncclCommSplit`: the ranks of each color get a devcomm communicator on a fresh store of
//! their own, found through the parent's store, beside the real NCCL's split.

use std::ffi::{c_char, c_int};

use crate::comm::{self, setup_timeout, ShimComm};
use crate::error::Failure;
use crate::ffi::{self, NcclCommT, NcclConfig, NcclUniqueId};

/// The new rank and size of `me` among `entries` (`(color, key)` of every parent rank):
/// the ranks of `me`'s color ordered by key, then parent rank. `None` for `NCCL_SPLIT_NOCOLOR`.
pub fn placement(entries: &[(c_int, c_int)], me: usize) -> Option<(usize, usize)> {
    let (color, _) = *entries.get(me)?;
    if color == ffi::SPLIT_NOCOLOR {
        return None;
    }
    let mut members: Vec<(c_int, usize)> = entries
        .iter()
        .enumerate()
        .filter(|(_, (c, _))| *c == color)
        .map(|(r, &(_, k))| (k, r))
        .collect();
    members.sort_unstable();
    let rank = members.iter().position(|&(_, r)| r == me)?;
    Some((rank, members.len()))
}

/// Splits `parent` (see the module's comment).
#[allow(clippy::not_unsafe_ptr_arg_deref)] // `config` is the C caller's, passed on
pub fn split(
    parent: &ShimComm,
    color: c_int,
    key: c_int,
    config: *mut NcclConfig,
) -> Result<NcclCommT, Failure> {
    const CALL: &str = "ncclCommSplit";
    if color < 0 && color != ffi::SPLIT_NOCOLOR {
        return Err(Failure::invalid_argument(format!(
            "{CALL}: color {color} (a color is >= 0 or NCCL_SPLIT_NOCOLOR)"
        )));
    }
    // The real NCCL's split first: collective over every parent rank, NOCOLOR included.
    let mut nccl_child: NcclCommT = std::ptr::null_mut();
    if !parent.nccl_raw().is_null() {
        let (lib, nc) = parent.nccl(CALL)?;
        let f = lib
            .comm_split
            .ok_or_else(|| Failure::invalid_usage(format!("{CALL}: the real NCCL lacks it")))?;
        // SAFETY: a live NCCL communicator; NCCL writes the child (null for NOCOLOR).
        let r = unsafe { f(nc, color, key, &mut nccl_child, config) };
        if r != ffi::SUCCESS {
            return Err(Failure::new(
                r,
                format!("{CALL} (NCCL): {}", comm::nccl_last(lib)),
            ));
        }
    }
    let Some(dc) = parent.dc.as_ref() else {
        if color == ffi::SPLIT_NOCOLOR {
            return Ok(std::ptr::null_mut());
        }
        return Err(Failure::invalid_usage(format!(
            "{CALL}: the parent has no devcomm communicator, so a split has no store to meet on"
        )));
    };
    let store = dc.store();
    let n = parent
        .splits
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut mine = color.to_le_bytes().to_vec();
    mine.extend_from_slice(&key.to_le_bytes());
    let bus =
        |e: devcomm_bootstrap::Error| Failure::from_devcomm(CALL, &devcomm::Error::Bootstrap(e));
    let all = store
        .all_gather(&format!("devcomm-nccl/split/{n}"), &mine, setup_timeout())
        .map_err(bus)?;
    let entries: Vec<(c_int, c_int)> = all
        .iter()
        .map(|b| {
            let word = |i: usize| c_int::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
            if b.len() == 8 {
                (word(0), word(4))
            } else {
                (ffi::SPLIT_NOCOLOR, 0)
            }
        })
        .collect();
    let Some((rank, size)) = placement(&entries, parent.rank) else {
        return Ok(std::ptr::null_mut());
    };
    // The color's rank 0 makes the id of its store and publishes it on the parent's store.
    let id_key = format!("devcomm-nccl/split/{n}/{color}/id");
    let bytes = if rank == 0 {
        let id = crate::unique_id::fresh(&crate::unique_id::store_host())?;
        store.set(&id_key, &id).map_err(bus)?;
        id.to_vec()
    } else {
        store.get(&id_key, setup_timeout()).map_err(bus)?
    };
    let mut id = NcclUniqueId {
        internal: [0; ffi::UNIQUE_ID_BYTES],
    };
    if bytes.len() != ffi::UNIQUE_ID_BYTES {
        return Err(Failure::system(format!(
            "{CALL}: the split's id on the store is {} bytes",
            bytes.len()
        )));
    }
    for (d, s) in id.internal.iter_mut().zip(&bytes) {
        *d = *s as c_char;
    }
    let child_store = comm::join_store(&id, size, rank)?;
    let existing = (!nccl_child.is_null()).then_some(nccl_child as usize);
    let child = comm::build(child_store, parent.device, config, existing.or(Some(0)))?;
    Ok(comm::register(child))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_of_a_color_are_ordered_by_key_then_parent_rank() {
        // Parent ranks 0..6: colors 1,0,1,NOCOLOR,0,1 with keys.
        let e = [
            (1, 5),
            (0, 0),
            (1, 0),
            (ffi::SPLIT_NOCOLOR, 0),
            (0, 0),
            (1, 5),
        ];
        assert_eq!(placement(&e, 2), Some((0, 3)));
        assert_eq!(placement(&e, 0), Some((1, 3)));
        assert_eq!(placement(&e, 5), Some((2, 3)));
        assert_eq!(placement(&e, 1), Some((0, 2)));
        assert_eq!(placement(&e, 4), Some((1, 2)));
        assert_eq!(placement(&e, 3), None);
        assert_eq!(placement(&e, 9), None);
    }
}
