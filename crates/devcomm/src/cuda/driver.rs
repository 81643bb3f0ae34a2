//! Whether the CUDA driver library can be loaded, asked before cudarc's first driver call:
//! cudarc loads `libcuda` lazily and panics inside its loader when it is missing, so every
//! entry point that opens a device checks here first and returns an error instead.

use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::error::{Error, Result};

/// `Ok` when the CUDA driver library (libcuda) is loadable; otherwise an error naming the
/// library, the file names tried and where the dynamic loader looked.
pub fn ensure_driver() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: loading libcuda runs only its own initialisers, which have no preconditions; a
    // missing library is reported as `false`, not a panic.
    let present = *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(missing_driver(crate::config::loader_path()))
    }
}

/// The error for a driver that could not be loaded (pure, for the tests).
pub(crate) fn missing_driver(ld_library_path: Option<String>) -> Error {
    Error::LibraryNotLoaded {
        library: "the CUDA driver (libcuda)",
        searched: format!(
            "{:?} through dlopen: LD_LIBRARY_PATH ({}), then the system's library cache and \
             default directories; is an NVIDIA driver installed on this machine?",
            candidates(),
            ld_library_path.as_deref().unwrap_or("not set"),
        ),
    }
}

/// The file names cudarc's loader tries for libcuda, each once, in its order.
fn candidates() -> Vec<String> {
    let mut names = Vec::new();
    for name in cudarc::get_lib_name_candidates("cuda") {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_the_library_and_where_it_was_looked_for() {
        let msg = missing_driver(Some("/opt/x/lib".into())).to_string();
        for part in ["libcuda", "libcuda.so", "/opt/x/lib", "dlopen"] {
            assert!(msg.contains(part), "{part} missing in {msg}");
        }
        assert!(missing_driver(None).to_string().contains("not set"));
    }
}
