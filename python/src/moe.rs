//! `devcomm._native.Moe`: a MoE layer's dispatch and combine ([`devcomm::Moe`]) on tensors
//! (docs/MOE.md; the Python side is `devcomm.moe.Buffer`).

use devcomm::{DataType, DispatchBuffers, MoeConfig};
use pyo3::prelude::*;

use crate::comm::PyComm;
use crate::errors::{invalid, IntoPy};
use crate::tensor::{DType, TensorDesc};

/// One MoE layer of a communicator.
#[pyclass(frozen, name = "Moe", module = "devcomm._native")]
pub struct PyMoe {
    comm: Py<PyComm>,
    moe: devcomm::Moe,
    dtype: DType,
}

/// The layer of `config` on `comm` (what `PyComm.moe` returns).
pub fn new(py: Python<'_>, comm: Py<PyComm>, config: MoeConfig, dtype: DType) -> PyResult<PyMoe> {
    let moe = py.detach(|| comm.get().inner().moe(config)).py()?;
    Ok(PyMoe { comm, moe, dtype })
}

/// devcomm's type of a row dtype.
pub fn row_type(d: DType) -> Option<DataType> {
    match d {
        DType::BF16 => Some(DataType::BF16),
        DType::F16 => Some(DataType::F16),
        DType::F32 => Some(DataType::F32),
        _ => None,
    }
}

impl PyMoe {
    fn tensor(
        &self,
        op: &str,
        what: &str,
        obj: &Bound<'_, PyAny>,
        dtype: DType,
        stream: u64,
    ) -> PyResult<TensorDesc> {
        let d = self.comm.get().tensor(op, what, obj, stream)?;
        d.check_dtype(op, what, &[dtype])?;
        Ok(d)
    }

    /// Rows of `hidden` elements in `d`, or why not.
    fn rows(&self, op: &str, what: &str, d: &TensorDesc) -> PyResult<usize> {
        let hidden = self.moe.plan().config.hidden as u64;
        if d.numel() % hidden != 0 {
            return Err(invalid(
                op,
                format!("{what} holds {} elements, not rows of {hidden}", d.numel()),
            ));
        }
        Ok((d.numel() / hidden) as usize)
    }
}

#[pymethods]
impl PyMoe {
    /// Expert-major output rows that hold any routing of up to `max_tokens` tokens per rank.
    fn worst_case_out_rows(&self) -> usize {
        self.moe.plan().worst_case_out_rows()
    }

    /// Output rows for `tokens` tokens per rank routed near uniformly, with `slack` times the
    /// mean per expert.
    fn typical_out_rows(&self, tokens: usize, slack: f64) -> usize {
        self.moe.plan().typical_out_rows(tokens, slack)
    }

    /// Experts per rank.
    #[getter]
    fn local_experts(&self) -> usize {
        self.moe.plan().local_experts
    }

    /// Dispatch (`Moe::dispatch`): `x [tokens, hidden]`, `topk_idx` int64 and `topk_weights`
    /// float32 `[tokens, top_k]`; writes `out_x [out_rows, hidden]`, `out_weights` float32
    /// `[out_rows]` and `expert_counts` int64 `[local_experts]`.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        topk_idx: &Bound<'_, PyAny>,
        topk_weights: &Bound<'_, PyAny>,
        out_x: &Bound<'_, PyAny>,
        out_weights: &Bound<'_, PyAny>,
        expert_counts: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<()> {
        const OP: &str = "moe dispatch";
        let plan = *self.moe.plan();
        let k = plan.config.top_k as u64;
        let xd = self.tensor(OP, "x", x, self.dtype, stream)?;
        let od = self.tensor(OP, "out_x", out_x, self.dtype, stream)?;
        let id = self.tensor(OP, "topk_idx", topk_idx, DType::I64, stream)?;
        let wd = self.tensor(OP, "topk_weights", topk_weights, DType::F32, stream)?;
        let owd = self.tensor(OP, "out_weights", out_weights, DType::F32, stream)?;
        let cd = self.tensor(OP, "expert_counts", expert_counts, DType::I64, stream)?;
        let (tokens, out_rows) = (self.rows(OP, "x", &xd)?, self.rows(OP, "out_x", &od)?);
        let t = tokens as u64;
        let checks = [
            ("topk_idx", id.numel(), t * k),
            ("topk_weights", wd.numel(), t * k),
            ("out_weights", owd.numel(), out_rows as u64),
            ("expert_counts", cd.numel(), plan.local_experts as u64),
        ];
        if let Some((what, got, want)) = checks.into_iter().find(|(_, g, w)| g != w) {
            return Err(invalid(
                OP,
                format!("{what} holds {got} elements; {want} expected"),
            ));
        }
        let b = DispatchBuffers {
            x: xd.ptr,
            topk_idx: id.ptr,
            topk_weights: wd.ptr,
            tokens,
            out_x: od.ptr,
            out_scales: 0,
            out_weights: owd.ptr,
            out_rows,
            expert_counts: cd.ptr,
        };
        let c = self.comm.get();
        let s = c.stream(stream)?;
        // SAFETY: every tensor checked above (this device, contiguous, dtype and size); the
        // caller keeps them alive for the stream's work (PyTorch frees in stream order).
        py.detach(|| unsafe { self.moe.dispatch_raw(c.inner(), b, &s) })
            .py()
    }

    /// Combine (`Moe::combine`): `y [out_rows, hidden]` of the last dispatch into
    /// `out [tokens, hidden]`.
    fn combine(
        &self,
        py: Python<'_>,
        y: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<()> {
        const OP: &str = "moe combine";
        let yd = self.tensor(OP, "y", y, self.dtype, stream)?;
        let od = self.tensor(OP, "out", out, self.dtype, stream)?;
        self.rows(OP, "y", &yd)?;
        self.rows(OP, "out", &od)?;
        let c = self.comm.get();
        let s = c.stream(stream)?;
        let (y, out) = ((yd.ptr, yd.bytes() as usize), (od.ptr, od.bytes() as usize));
        // SAFETY: tensors checked above (this device, contiguous, dtype); their sizes go with
        // them and are checked against the last dispatch.
        py.detach(|| unsafe { self.moe.combine_raw(c.inner(), y, out, &s) })
            .py()
    }

    /// Waits for `stream` and raises for what the last dispatch counted (bad or repeated
    /// expert ids, an output too small).
    fn check(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        let s = self.comm.get().stream(stream)?;
        py.detach(|| self.moe.check(&s)).py()
    }
}
