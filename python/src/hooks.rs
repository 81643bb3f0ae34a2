//! User hooks from Python: CUDA C++ source with a hooks struct (`produce`/`consume`), compiled
//! into the collective kernel on first use (crates/devcomm/cuda/devcomm/hooks.cuh).

use pyo3::prelude::*;

use crate::errors::IntoPy;

/// Hooks for the collectives: `name` is the struct defined in `source`; its `In` and `Out`
/// types must be `in_size` and `out_size` bytes (1, 2, 4, 8 or 16), the sizes of the input
/// and output tensors' elements.
#[pyclass(frozen, name = "Hooks", module = "devcomm._native")]
#[derive(Debug)]
pub struct PyHooks {
    pub(crate) hooks: devcomm::RawHooks,
    pub(crate) in_size: usize,
    pub(crate) out_size: usize,
}

#[pymethods]
impl PyHooks {
    #[new]
    fn new(name: &str, source: &str, in_size: usize, out_size: usize) -> PyResult<Self> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_alphanumeric() || "_:<>, ".contains(c))
        {
            return Err(crate::errors::invalid(
                "Hooks",
                format!("{name:?} is not the name of a C++ struct"),
            ));
        }
        let hooks = devcomm::raw::hooks_with_sizes(name, source, in_size, out_size).py()?;
        Ok(Self {
            hooks,
            in_size,
            out_size,
        })
    }

    /// The hooks struct's name.
    #[getter]
    fn name(&self) -> String {
        self.hooks.name().to_string()
    }

    #[getter]
    fn in_size(&self) -> usize {
        self.in_size
    }

    #[getter]
    fn out_size(&self) -> usize {
        self.out_size
    }

    fn __repr__(&self) -> String {
        format!(
            "Hooks({:?}, in_size={}, out_size={})",
            self.hooks.name(),
            self.in_size,
            self.out_size
        )
    }
}
