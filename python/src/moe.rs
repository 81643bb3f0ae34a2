//! `devcomm._native.Moe`: a MoE layer's dispatch and combine ([`devcomm::Moe`]) on tensors
//! (docs/MOE.md; the Python side is `devcomm.moe.Buffer`).

use devcomm::moe::{Fp8Output, Fp8Scales, Wire};
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

/// The layer of `config` on `comm` (what `PyComm.moe` returns), its launches held to
/// `sm_budget` blocks when given. The budget is checked before the layer is made (making and
/// dropping one is collective).
pub fn new(
    py: Python<'_>,
    comm: Py<PyComm>,
    config: MoeConfig,
    dtype: DType,
    sm_budget: Option<usize>,
) -> PyResult<PyMoe> {
    let sms = comm.get().inner().device_info().sm_count.max(1) as usize;
    devcomm::moe::launch_cap(sm_budget, sms).py()?;
    let mut moe = py.detach(|| comm.get().inner().moe(config)).py()?;
    moe.set_sm_budget(sm_budget).py()?;
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

/// The wire of `fp8` (`None`, `"per_row"`, `"per_128"`) and `dequantise`.
pub fn wire(fp8: Option<&str>, dequantise: bool) -> PyResult<Wire> {
    let scales = match fp8 {
        None if dequantise => {
            return Err(invalid(
                "moe",
                "dequantise=True without fp8 (rows cross as they are)",
            ))
        }
        None => return Ok(Wire::Native),
        Some("per_row") => Fp8Scales::PerRow,
        Some("per_128") => Fp8Scales::Per128,
        Some(other) => {
            return Err(invalid(
                "moe",
                format!("fp8={other:?} (None, \"per_row\" or \"per_128\")"),
            ))
        }
    };
    let output = if dequantise {
        Fp8Output::Dequantised
    } else {
        Fp8Output::Fp8
    };
    Ok(Wire::Fp8 { scales, output })
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

    /// The element types `out_x` may have: the rows' dtype, or e4m3 (`float8_e4m3fn`, or
    /// `uint8` for frameworks without it) when the layer returns FP8.
    fn out_dtypes(&self) -> Vec<DType> {
        if self.moe.plan().config.wire.outputs_fp8() {
            vec![DType::F8E4M3, DType::U8]
        } else {
            vec![self.dtype]
        }
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

    /// Scales per output row when the layer returns FP8 (0 otherwise).
    #[getter]
    fn scales_per_row(&self) -> usize {
        let plan = self.moe.plan();
        if plan.config.wire.outputs_fp8() {
            plan.scales
        } else {
            0
        }
    }

    /// Whether `out_x` holds e4m3 codes (with `out_scales`) rather than rows of the dtype.
    #[getter]
    fn outputs_fp8(&self) -> bool {
        self.moe.plan().config.wire.outputs_fp8()
    }

    /// Dispatch (`Moe::dispatch`): `x [tokens, hidden]`, `topk_idx` int64 and `topk_weights`
    /// float32 `[tokens, top_k]`; writes `out_x [out_rows, hidden]`, `out_weights` float32
    /// `[out_rows]` and `expert_counts` int64 `[local_experts]`. A layer that returns FP8
    /// (`Moe::dispatch_fp8`) takes `out_x` of `float8_e4m3fn` (or `uint8`) and `out_scales`
    /// float32 `[out_rows, scales_per_row]`; any other layer refuses `out_scales`.
    #[pyo3(signature = (x, topk_idx, topk_weights, out_x, out_weights, expert_counts, stream, out_scales = None))]
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
        out_scales: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        const OP: &str = "moe dispatch";
        let plan = *self.moe.plan();
        let k = plan.config.top_k as u64;
        let fp8 = plan.config.wire.outputs_fp8();
        let xd = self.tensor(OP, "x", x, self.dtype, stream)?;
        let od = self.comm.get().tensor(OP, "out_x", out_x, stream)?;
        od.check_dtype(OP, "out_x", &self.out_dtypes())?;
        let sd = match (out_scales, fp8) {
            (Some(t), true) => Some(self.tensor(OP, "out_scales", t, DType::F32, stream)?),
            (None, false) => None,
            (None, true) => {
                return Err(invalid(OP, "this layer returns FP8: out_scales is needed"))
            }
            (Some(_), false) => {
                return Err(invalid(OP, "this layer does not return FP8: no out_scales"))
            }
        };
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
            (
                "out_scales",
                sd.as_ref().map_or(0, |d| d.numel()),
                if fp8 {
                    (out_rows * plan.scales) as u64
                } else {
                    0
                },
            ),
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
            out_scales: sd.as_ref().map_or(0, |d| d.ptr),
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
