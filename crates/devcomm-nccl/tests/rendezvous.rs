//! The GPU-free part of `ncclCommInitRank` across processes: rank 0's process hosts the store
//! named by an id of `ncclGetUniqueId`, two child processes (this test binary again) join with
//! the id, and rank 0 shares the real NCCL's id (here: "none", no NCCL is loaded) through it.
//! devcomm cannot build a communicator without a GPU, so the communicator itself is checked by
//! scripts/nccl-shim-check.sh on the GPU machine. Also the C entry points that need no GPU.

use std::ffi::CStr;
use std::process::{Command, Stdio};

use devcomm_nccl::api_comm::*;
use devcomm_nccl::comm::{join_store, share_nccl_id};
use devcomm_nccl::ffi::{self, NcclUniqueId};

const ID_ENV: &str = "DEVCOMM_NCCL_TEST_ID";
const RANK_ENV: &str = "DEVCOMM_NCCL_TEST_RANK";
const RANKS: usize = 3;

fn hex(id: &NcclUniqueId) -> String {
    id.internal
        .iter()
        .map(|&b| format!("{:02x}", b as u8))
        .collect()
}

fn unhex(s: &str) -> NcclUniqueId {
    let mut id = NcclUniqueId {
        internal: [0; ffi::UNIQUE_ID_BYTES],
    };
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex") as _;
    }
    id
}

/// What every rank does: join, share NCCL's id, gather every rank's number, meet.
fn rank_main(id: &NcclUniqueId, rank: usize) -> Vec<Vec<u8>> {
    let store = join_store(id, RANKS, rank).expect("join the id's store");
    assert_eq!((store.rank(), store.world_size()), (rank, RANKS));
    let nccl = share_nccl_id(&store).expect("share NCCL's id");
    assert!(nccl.is_none(), "no real NCCL is loaded in this test");
    let t = std::time::Duration::from_secs(30);
    let all = store
        .all_gather("test/ranks", &[rank as u8], t)
        .expect("all_gather");
    store.barrier("test/done", t).expect("barrier");
    all
}

/// The child processes' entry (does nothing in a normal run).
#[test]
fn child_rank() {
    let (Ok(id), Ok(rank)) = (std::env::var(ID_ENV), std::env::var(RANK_ENV)) else {
        return;
    };
    let all = rank_main(&unhex(&id), rank.parse().expect("rank"));
    assert_eq!(all, [[0], [1], [2]]);
}

#[test]
fn ranks_in_three_processes_meet_on_the_id_s_store() {
    // No real NCCL: every rank agrees that there is none.
    std::env::set_var(devcomm_nccl::fallback::LIB_ENV, "/nonexistent/libnccl.so.2");
    let mut id = NcclUniqueId {
        internal: [0; ffi::UNIQUE_ID_BYTES],
    };
    assert_eq!(ncclGetUniqueId(&mut id), ffi::SUCCESS);
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (1..RANKS)
        .map(|r| {
            Command::new(&exe)
                .args(["--exact", "child_rank", "--nocapture"])
                .env(ID_ENV, hex(&id))
                .env(RANK_ENV, r.to_string())
                .env(devcomm_nccl::fallback::LIB_ENV, "/nonexistent/libnccl.so.2")
                // The children's test harness output is kept apart (and shown if one fails),
                // so that it does not interleave with this process's and blur its result lines.
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let all = rank_main(&id, 0);
    assert_eq!(all, [[0], [1], [2]]);
    for c in children {
        let out = c.wait_with_output().expect("wait for a rank");
        assert!(
            out.status.success(),
            "a child rank failed: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn last_error() -> String {
    // SAFETY: this thread's copy, valid until its next call.
    unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn c_entry_points_without_a_gpu() {
    let mut v = 0;
    assert_eq!(ncclGetVersion(&mut v), ffi::SUCCESS);
    assert_eq!(v, 22809);
    assert_eq!(ncclGetVersion(std::ptr::null_mut()), ffi::INVALID_ARGUMENT);
    // SAFETY: static strings.
    let s = unsafe { CStr::from_ptr(ncclGetErrorString(ffi::INVALID_USAGE)) };
    assert!(s.to_string_lossy().contains("invalid usage"));
    let mut id = NcclUniqueId {
        internal: [0; ffi::UNIQUE_ID_BYTES],
    };
    assert_eq!(ncclGetUniqueId(&mut id), ffi::SUCCESS);
    let mut comm = std::ptr::null_mut();
    assert_eq!(ncclCommInitRank(&mut comm, 2, id, 2), ffi::INVALID_ARGUMENT);
    assert!(
        last_error().contains("rank 2 is not a rank of 2 ranks"),
        "{}",
        last_error()
    );
    // A damaged id is refused before anything connects.
    let mut bad = id;
    bad.internal[20] ^= 1;
    assert_eq!(
        ncclCommInitRank(&mut comm, 1, bad, 0),
        ffi::INVALID_ARGUMENT
    );
    assert!(
        last_error().contains("damaged or altered"),
        "{}",
        last_error()
    );
    // A handle that is no communicator of this library is refused, not dereferenced.
    let mut n = 0;
    let bogus = 0x1234usize as ffi::NcclCommT;
    assert_eq!(ncclCommCount(bogus, &mut n), ffi::INVALID_ARGUMENT);
    assert!(last_error().contains("ncclCommCount"), "{}", last_error());
    assert_eq!(ncclCommDestroy(std::ptr::null_mut()), ffi::INVALID_ARGUMENT);
    // A group end without a start is misuse.
    assert_eq!(ncclGroupEnd(), ffi::INVALID_USAGE);
    assert!(
        last_error().contains("no group started"),
        "{}",
        last_error()
    );
    let op = devcomm_nccl::api_ops::ncclAllReduce(
        std::ptr::null(),
        std::ptr::null_mut(),
        4,
        ffi::FLOAT32,
        ffi::SUM,
        bogus,
        std::ptr::null_mut(),
    );
    assert_eq!(op, ffi::INVALID_ARGUMENT);
}
