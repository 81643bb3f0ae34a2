//! Examples of the library that the commands run, compiled here from `crates/devcomm/examples`
//! (each also builds as an example of its own): one module each, whichever commands use it.

#[allow(dead_code)]
#[path = "../../devcomm/examples/all_reduce_rmsnorm.rs"]
pub(crate) mod all_reduce_rmsnorm;
