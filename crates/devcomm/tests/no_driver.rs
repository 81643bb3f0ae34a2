//! Without a CUDA driver (CPU machines, CI), building a communicator returns an error naming
//! the library instead of panicking in cudarc's loader.

use devcomm::{Comm, Error};
use devcomm_bootstrap::RankInfo;

#[test]
fn a_missing_driver_is_an_error_not_a_panic() {
    let present = devcomm::ensure_driver().is_ok();
    if present {
        eprintln!("SKIPPED: this machine has a CUDA driver");
        return;
    }
    let mut info = RankInfo::new(0, 1);
    info.master_port = 0; // any free port: one rank
    let built = std::panic::catch_unwind(|| Comm::builder(info).and_then(|b| b.build()));
    let result = built.expect("building a communicator panicked without a driver");
    // The ranks agree on opening their devices, so the error arrives wrapped in that step.
    let msg = match result {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a communicator without a driver"),
    };
    for part in ["libcuda", "could not be loaded", "LD_LIBRARY_PATH"] {
        assert!(msg.contains(part), "{part} missing in {msg}");
    }
    let direct = devcomm::ensure_driver().unwrap_err();
    assert!(matches!(direct, Error::LibraryNotLoaded { .. }), "{direct}");
}
