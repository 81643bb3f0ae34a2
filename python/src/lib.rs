//! `devcomm._native`: the compiled part of the devcomm Python package (docs/PYTHON.md). It
//! reads tensor descriptions (from the package's torch layer, `__cuda_array_interface__` or
//! DLPack), checks them, and calls the devcomm crate's raw operations on the given stream.
//! Nothing here imports torch.

mod comm;
mod errors;
mod hooks;
mod memory;
mod moe;
mod pool;
mod reduce;
mod registered;
mod store;
mod tensor;

use pyo3::prelude::*;

/// Reads a tensor description the way every operation does and returns it as
/// `(ptr, dtype, shape, strides or None, device)`, `device` being the CUDA ordinal, `-1` for
/// CUDA memory of unstated device (`__cuda_array_interface__`) or the other device's name.
/// For tests and for checking what an object exposes.
#[pyfunction]
#[pyo3(signature = (obj, stream = 0))]
fn describe<'py>(obj: &Bound<'py, PyAny>, stream: u64) -> PyResult<Bound<'py, PyAny>> {
    let d = tensor::describe("describe", "the object", obj, stream)?;
    let py = obj.py();
    let device = match &d.device {
        tensor::Device::Cuda(o) => o.into_pyobject(py)?.into_any(),
        tensor::Device::CudaUnstated => (-1i64).into_pyobject(py)?.into_any(),
        tensor::Device::Other(n) => n.into_pyobject(py)?.into_any(),
    };
    Ok((d.ptr, d.dtype.name(), d.shape, d.strides, device)
        .into_pyobject(py)?
        .into_any())
}

/// Checks a tensor description as an operation on CUDA device `ordinal` does (contiguous, on
/// that device, aligned); raises `InvalidArgument` otherwise.
#[pyfunction]
#[pyo3(signature = (obj, ordinal = 0, dtypes = None))]
fn check_tensor(obj: &Bound<'_, PyAny>, ordinal: i64, dtypes: Option<Vec<String>>) -> PyResult<()> {
    let d = tensor::describe("check_tensor", "the tensor", obj, 0)?;
    d.check("check_tensor", "the tensor", ordinal)?;
    if let Some(names) = dtypes {
        let want: Vec<tensor::DType> = names
            .iter()
            .map(|n| {
                tensor::DType::from_name(n)
                    .ok_or_else(|| errors::invalid("check_tensor", format!("unknown dtype {n}")))
            })
            .collect::<PyResult<_>>()?;
        d.check_dtype("check_tensor", "the tensor", &want)?;
    }
    Ok(())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<comm::PyComm>()?;
    m.add_class::<moe::PyMoe>()?;
    m.add_class::<hooks::PyHooks>()?;
    m.add_class::<store::PyStore>()?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    m.add_function(wrap_pyfunction!(check_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(store::setup_timeout_ms, m)?)?;
    for f in [
        wrap_pyfunction!(registered::register, m)?,
        wrap_pyfunction!(registered::alloc_registered, m)?,
        wrap_pyfunction!(registered::deregister, m)?,
        wrap_pyfunction!(registered::send_registered, m)?,
        wrap_pyfunction!(registered::recv_registered, m)?,
        wrap_pyfunction!(registered::sendrecv_registered, m)?,
        wrap_pyfunction!(registered::locate_in, m)?,
        wrap_pyfunction!(registered::check_send_offset, m)?,
        wrap_pyfunction!(pool::pool_attach, m)?,
        wrap_pyfunction!(pool::pool_last_error, m)?,
        wrap_pyfunction!(pool::pool_grow, m)?,
        wrap_pyfunction!(pool::pool_usage, m)?,
        wrap_pyfunction!(pool::pool_lookup, m)?,
        wrap_pyfunction!(pool::pool_empty, m)?,
        wrap_pyfunction!(pool::pool_send, m)?,
    ] {
        m.add_function(f)?;
    }
    m.add("REDUCTIONS_BUILT", comm::REDUCTIONS_BUILT)?;
    Ok(())
}
