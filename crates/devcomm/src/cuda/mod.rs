//! Layer 1: the thin layer over cudarc (see docs/CONTRACT.md). Being written.

/// Host-mapped error state shared by a communicator's kernels.
#[derive(Debug)]
pub struct ErrorState {
    _private: (),
}
