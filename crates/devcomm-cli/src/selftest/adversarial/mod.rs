//! Checks that put the library in hard conditions on purpose: here, ranks compiling kernels
//! cold while their peers load them warm (`cold_compile`).

mod cold_compile;

use super::harness::Check;

/// The group's checks, in run order.
pub(super) const CHECKS: &[Check] = cold_compile::COLD_COMPILE_CHECKS;
