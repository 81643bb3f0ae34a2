//! The Python exception classes and the mapping of `devcomm::Error` onto them: each exception
//! carries the Rust error's text and its fields as attributes.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    devcomm,
    Error,
    PyException,
    "Every devcomm failure; the message is the Rust error's text."
);
create_exception!(
    devcomm,
    InvalidArgument,
    Error,
    "A bad argument (dtype, device, shape, contiguity, peer, size); nothing ran. Fields: op."
);
create_exception!(
    devcomm,
    PeerTimeout,
    Error,
    "A device wait expired. Fields: op, rank, peer, slot, expected, seen, elapsed_s. The \
     communicator must be rebuilt."
);
create_exception!(
    devcomm,
    Aborted,
    Error,
    "An earlier device error left the communicator unusable. Fields: rank, reason."
);
create_exception!(
    devcomm,
    CountOverflow,
    Error,
    "All-to-all-v counts that do not fit a buffer (nothing was written out of bounds). \
     Fields: rank, side, peer, needed, capacity."
);
create_exception!(
    devcomm,
    PoolExhausted,
    Error,
    "The communicator's memory pool has no room for a request; nothing was allocated. Fields: \
     rank, requested, segments, free, largest_free."
);
create_exception!(
    devcomm,
    CudaError,
    Error,
    "A CUDA driver call failed. Fields: rank, call."
);
create_exception!(
    devcomm,
    CompileError,
    Error,
    "A kernel or a user hook did not compile. Fields: kernel, log."
);
create_exception!(
    devcomm,
    SetupError,
    Error,
    "A collective setup step failed on some ranks. Fields: step, failures."
);
create_exception!(
    devcomm,
    NotBuiltError,
    Error,
    "The feature is not built yet. Fields: feature."
);

/// Registers the classes in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("PeerTimeout", py.get_type::<PeerTimeout>())?;
    m.add("Aborted", py.get_type::<Aborted>())?;
    m.add("CountOverflow", py.get_type::<CountOverflow>())?;
    m.add("CudaError", py.get_type::<CudaError>())?;
    m.add("PoolExhausted", py.get_type::<PoolExhausted>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add("SetupError", py.get_type::<SetupError>())?;
    m.add("NotBuiltError", py.get_type::<NotBuiltError>())?;
    Ok(())
}

/// An [`InvalidArgument`] raised by the binding's own checks.
pub fn invalid(op: &str, reason: impl std::fmt::Display) -> PyErr {
    let err = InvalidArgument::new_err(format!("{op}: invalid argument: {reason}"));
    Python::attach(|py| set(py, &err, &[("op", obj(py, op))]));
    err
}

type Field<'py> = (&'static str, PyResult<Bound<'py, PyAny>>);

/// Sets attributes on the exception value (an attribute that fails to convert is left out).
fn set<'py>(py: Python<'py>, err: &PyErr, fields: &[Field<'py>]) {
    let value = err.value(py);
    for (name, v) in fields {
        if let Ok(v) = v {
            let _ = value.setattr(*name, v);
        }
    }
}

fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, v: T) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::IntoPyObjectExt;
    v.into_bound_py_any(py)
}

/// The Python exception for a devcomm error, its fields set as attributes.
pub fn to_py(e: devcomm::Error) -> PyErr {
    use devcomm::Error as E;
    let text = e.to_string();
    Python::attach(|py| {
        let (err, fields): (PyErr, Vec<Field<'_>>) = match &e {
            E::PeerTimeout {
                op,
                rank,
                peer,
                slot,
                expected,
                seen,
                elapsed,
            } => (
                PeerTimeout::new_err(text),
                vec![
                    ("op", obj(py, op.to_string())),
                    ("rank", obj(py, *rank)),
                    ("peer", obj(py, *peer)),
                    ("slot", obj(py, *slot)),
                    ("expected", obj(py, *expected)),
                    ("seen", obj(py, *seen)),
                    ("elapsed_s", obj(py, elapsed.as_secs_f64())),
                ],
            ),
            E::Aborted { rank, reason } => (
                Aborted::new_err(text),
                vec![
                    ("rank", obj(py, *rank)),
                    ("reason", obj(py, reason.clone())),
                ],
            ),
            E::CountOverflow {
                rank,
                side,
                peer,
                needed,
                capacity,
            } => (
                CountOverflow::new_err(text),
                vec![
                    ("rank", obj(py, *rank)),
                    ("side", obj(py, *side)),
                    ("peer", obj(py, *peer)),
                    ("needed", obj(py, *needed)),
                    ("capacity", obj(py, *capacity)),
                ],
            ),
            E::InvalidArgument { op, .. } => {
                (InvalidArgument::new_err(text), vec![("op", obj(py, *op))])
            }
            E::CapacityExceeded {
                op,
                peer,
                bytes,
                capacity,
            } => (
                InvalidArgument::new_err(text),
                vec![
                    ("op", obj(py, *op)),
                    ("peer", obj(py, *peer)),
                    ("bytes", obj(py, *bytes)),
                    ("capacity", obj(py, *capacity)),
                ],
            ),
            E::NoPath { op, rank, peer, .. } => (
                InvalidArgument::new_err(text),
                vec![
                    ("op", obj(py, *op)),
                    ("rank", obj(py, *rank)),
                    ("peer", obj(py, *peer)),
                ],
            ),
            E::PoolExhausted {
                rank,
                requested,
                segments,
                free,
                largest_free,
                ..
            } => (
                PoolExhausted::new_err(text),
                vec![
                    ("rank", obj(py, *rank)),
                    ("requested", obj(py, *requested)),
                    ("segments", obj(py, segments.clone())),
                    ("free", obj(py, *free)),
                    ("largest_free", obj(py, *largest_free)),
                ],
            ),
            E::Cuda { rank, call, .. } => (
                CudaError::new_err(text),
                vec![("rank", obj(py, *rank)), ("call", obj(py, *call))],
            ),
            E::Compile { kernel, log } => (
                CompileError::new_err(text),
                vec![
                    ("kernel", obj(py, kernel.clone())),
                    ("log", obj(py, log.clone())),
                ],
            ),
            E::Setup { step, failures } => (
                SetupError::new_err(text),
                vec![
                    ("step", obj(py, step.clone())),
                    ("failures", obj(py, failures.clone())),
                ],
            ),
            E::NotImplemented { feature } => (
                NotBuiltError::new_err(text),
                vec![("feature", obj(py, *feature))],
            ),
            _ => (Error::new_err(text), vec![]),
        };
        set(py, &err, &fields);
        err
    })
}

/// `?` on a devcomm result inside a `#[pymethods]` body.
pub trait IntoPy<T> {
    /// Maps the error with [`to_py`].
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for devcomm::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
