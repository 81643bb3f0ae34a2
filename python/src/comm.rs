//! `Comm`: the communicator as Python sees it. Every operation takes tensor descriptions and the
//! raw CUDA stream to enqueue on (PyTorch's current stream, passed by the torch layer), checks
//! every argument before anything runs, and never synchronises the host.
//!
//! Streams: the communicator's send/recv namespace is bound to one stream at a time. When an
//! operation comes with another stream than the last one, the namespace is moved to it with
//! `Comm::rebind_stream`, which orders the new stream after the old one's work (see its doc
//! for why that keeps the namespace's kernels in call order, and for CUDA graph capture).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::CudaStream;
use devcomm::raw::{copy_hooks, RawBuffer, RawCounts};
use devcomm::{Comm, HookArgs};
use pyo3::prelude::*;

use crate::errors::{invalid, IntoPy};
use crate::hooks::PyHooks;
use crate::reduce::{gather_dtype, reduce_dtype, reduce_op, same_dtype, sharded};
use crate::registered::Table;
use crate::store::PyStore;
use crate::tensor::{describe, DType, TensorDesc};

/// Whether this build has the reductions (`all_reduce`, `reduce_scatter`, `all_gather`).
pub const REDUCTIONS_BUILT: bool = true;

/// Count dtypes of all-to-all-v (the kernel reads and writes `u64`).
const COUNT_DTYPES: [DType; 2] = [DType::I64, DType::U64];

/// A communicator.
#[pyclass(frozen, name = "Comm", module = "devcomm._native")]
#[derive(Debug)]
pub struct PyComm {
    comm: Comm,
    ordinal: i64,
    /// The stream the last operation ran on (borrowed from its owner, PyTorch).
    stream: Mutex<Option<Arc<CudaStream>>>,
    /// Copy hooks by element size (1, 2, 4, 8, 16 bytes), made once.
    copy: [devcomm::RawHooks; 5],
    /// Registered buffers (after `comm`: the crate releases the registrations before what
    /// they keep alive goes).
    regs: Table,
    /// Agreements made through the store (`registered::agree`), for their tags.
    agreements: AtomicU64,
}

fn copy_index(size: usize) -> usize {
    size.trailing_zeros() as usize
}

impl PyComm {
    /// The communicator.
    pub(crate) fn inner(&self) -> &Comm {
        &self.comm
    }

    fn wrap(comm: Comm) -> Self {
        let copy =
            [1usize, 2, 4, 8, 16].map(|s| copy_hooks(s).expect("sizes 1-16 have copy hooks"));
        Self {
            ordinal: comm.device_info().ordinal as i64,
            comm,
            stream: Mutex::new(None),
            copy,
            regs: Table::default(),
            agreements: AtomicU64::new(0),
        }
    }

    pub(crate) fn comm(&self) -> &Comm {
        &self.comm
    }

    pub(crate) fn ordinal(&self) -> i64 {
        self.ordinal
    }

    pub(crate) fn registrations(&self) -> &Table {
        &self.regs
    }

    pub(crate) fn next_agreement(&self) -> u64 {
        self.agreements.fetch_add(1, Ordering::Relaxed)
    }

    /// The borrowed stream for `raw`, moving the send/recv namespace to it if it is not the
    /// last one used.
    pub(crate) fn stream(&self, raw: u64) -> PyResult<Arc<CudaStream>> {
        let mut cur = self
            .stream
            .lock()
            .map_err(|_| invalid("stream", "a thread panicked inside devcomm"))?;
        if let Some(s) = cur.as_ref() {
            if s.cu_stream() as u64 == raw {
                return Ok(s.clone());
            }
        }
        // SAFETY: the torch layer passes PyTorch's current stream of the communicator's device,
        // which belongs to the device's primary context, the context devcomm opened; PyTorch's
        // streams are never destroyed (pool streams and the default streams) and a user's
        // external stream must outlive its use, as documented in docs/PYTHON.md.
        let new = unsafe {
            self.comm
                .context()
                .wrap_borrowed_stream(raw as cudarc::driver::sys::CUstream)
        };
        if let Some(old) = cur.as_ref() {
            // SAFETY: `old` is the stream the previous operation ran on, which is the bound one
            // (rebind_stream checks that by address) and alive by the same argument as `new`.
            unsafe { self.comm.rebind_stream(old, &new) }.py()?;
        }
        *cur = Some(new.clone());
        Ok(new)
    }

    pub(crate) fn tensor(
        &self,
        op: &str,
        what: &str,
        obj: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<TensorDesc> {
        let d = describe(op, what, obj, stream)?;
        d.check(op, what, self.ordinal)?;
        Ok(d)
    }

    fn counts(&self, op: &str, what: &str, obj: &Bound<'_, PyAny>, stream: u64) -> PyResult<u64> {
        let d = self.tensor(op, what, obj, stream)?;
        d.check_dtype(op, what, &COUNT_DTYPES)?;
        let world = self.comm.world_size() as u64;
        if d.numel() != world {
            return Err(invalid(
                op,
                format!(
                    "{what} holds {} entries; world size {world} are needed",
                    d.numel()
                ),
            ));
        }
        Ok(d.ptr)
    }

    /// The hooks of a call and a check of the tensors' dtypes against them: the copy hooks
    /// need equal dtypes (a different dtype of the same size would be reinterpreted).
    fn hooks<'a>(
        &'a self,
        op: &str,
        hooks: Option<&'a PyHooks>,
        inp: &TensorDesc,
        out: &TensorDesc,
    ) -> PyResult<&'a devcomm::RawHooks> {
        match hooks {
            Some(h) => {
                if h.in_size != inp.dtype.size() || h.out_size != out.dtype.size() {
                    return Err(invalid(
                        op,
                        format!(
                            "hooks {} take {}-byte inputs and give {}-byte outputs; the tensors \
                             are {} and {}",
                            h.hooks.name(),
                            h.in_size,
                            h.out_size,
                            inp.dtype.name(),
                            out.dtype.name()
                        ),
                    ));
                }
                Ok(&h.hooks)
            }
            None => {
                if inp.dtype != out.dtype {
                    return Err(invalid(
                        op,
                        format!(
                            "input is {} but output {}; without hooks both must have one dtype",
                            inp.dtype.name(),
                            out.dtype.name()
                        ),
                    ));
                }
                Ok(&self.copy[copy_index(inp.dtype.size())])
            }
        }
    }

    fn buffer(d: &TensorDesc) -> RawBuffer {
        RawBuffer {
            ptr: d.ptr,
            elems: d.numel(),
            elem_size: d.dtype.size(),
        }
    }

    /// Checks and the raw call of `all_to_all_single` without splits.
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_prepare<'a>(
        &'a self,
        out: &Bound<'_, PyAny>,
        inp: &Bound<'_, PyAny>,
        stream: u64,
        hooks: Option<&'a PyHooks>,
        user: u64,
        row_len: u64,
    ) -> PyResult<(
        RawBuffer,
        RawBuffer,
        HookArgs,
        &'a devcomm::RawHooks,
        Arc<CudaStream>,
    )> {
        const OP: &str = "all_to_all_single";
        let o = self.tensor(OP, "out", out, stream)?;
        let i = self.tensor(OP, "inp", inp, stream)?;
        let h = self.hooks(OP, hooks, &i, &o)?;
        let world = self.comm.world_size() as u64;
        if i.numel() != o.numel() || i.numel() % world != 0 {
            return Err(invalid(
                OP,
                format!(
                    "inp holds {} and out {} elements; both must be world size {world} x the same \
                     chunk",
                    i.numel(),
                    o.numel()
                ),
            ));
        }
        // Python's 0 makes a chunk one row (docs/PYTHON.md); Rust's HookArgs takes the length.
        let chunk = i.numel() / world;
        let row = if row_len == 0 { chunk } else { row_len };
        let args = HookArgs::rows(row as usize).with_user(user);
        let s = self.stream(stream)?;
        Ok((Self::buffer(&i), Self::buffer(&o), args, h, s))
    }
}

#[pymethods]
impl PyComm {
    /// A MoE layer's dispatch and combine (`devcomm.moe.Buffer` wraps it): `experts` over the
    /// ranks, `top_k` per token, rows of `hidden` elements of `dtype` (`bfloat16`, `float16`,
    /// `float32`), at most `max_tokens` tokens per rank and call, expert groups padded to
    /// `align` rows. `fp8`: `None` (rows cross as they are), `"per_row"` or `"per_128"` (e4m3
    /// on the wire with a scale per row or per 128 elements), returned dequantised to `dtype`
    /// when `dequantise`, else as e4m3 codes and scales. `sm_budget`: the most blocks (so
    /// SMs) any launch of the layer's kernels takes (`Moe::set_sm_budget`; `None`: the GPU).
    #[pyo3(signature = (experts, top_k, hidden, dtype, max_tokens, align = 1, fp8 = None, dequantise = false, sm_budget = None))]
    #[allow(clippy::too_many_arguments)]
    fn moe(
        slf: &Bound<'_, Self>,
        experts: usize,
        top_k: usize,
        hidden: usize,
        dtype: &str,
        max_tokens: usize,
        align: usize,
        fp8: Option<&str>,
        dequantise: bool,
        sm_budget: Option<usize>,
    ) -> PyResult<crate::moe::PyMoe> {
        let d = DType::from_name(dtype)
            .filter(|d| crate::moe::row_type(*d).is_some())
            .ok_or_else(|| {
                invalid(
                    "moe",
                    format!("rows of {dtype} (bfloat16, float16 or float32)"),
                )
            })?;
        let config = devcomm::MoeConfig {
            experts,
            top_k,
            hidden,
            dtype: crate::moe::row_type(d).unwrap_or(devcomm::DataType::BF16),
            max_tokens,
            align,
            wire: crate::moe::wire(fp8, dequantise)?,
        };
        crate::moe::new(slf.py(), slf.clone().unbind(), config, d, sm_budget)
    }

    /// Joins the group described by the torchrun-style environment (`RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`, as `devcomm launch` and torchrun set them).
    /// Collective: every rank calls it. `device`: the CUDA ordinal (default: the local rank,
    /// or local rank modulo the GPUs with `DEVCOMM_SHARE_GPU=1`).
    #[staticmethod]
    #[pyo3(signature = (device = None))]
    fn from_env(py: Python<'_>, device: Option<usize>) -> PyResult<Self> {
        let comm = py
            .detach(|| {
                let info = devcomm_bootstrap::RankInfo::from_env()?;
                let mut b = Comm::builder(info)?;
                if let Some(d) = device {
                    b = b.device(d);
                }
                b.build()
            })
            .py()?;
        Ok(Self::wrap(comm))
    }

    /// Builds on a fresh `Store` (`Store.host` / `Store.join`), which the communicator takes.
    /// Collective over the store's ranks. `device`: the CUDA ordinal; required when the store
    /// was joined without a local rank (the default device is the local rank).
    #[staticmethod]
    #[pyo3(signature = (store, device = None))]
    fn from_store(py: Python<'_>, store: &PyStore, device: Option<usize>) -> PyResult<Self> {
        if device.is_none() && !store.local_known() {
            return Err(invalid(
                "Comm.from_store",
                "the store was joined without a local rank, so the device must be given",
            ));
        }
        let (store, local_known) = store.take()?;
        let comm = py
            .detach(|| {
                let mut b = devcomm::CommBuilder::on_store(store)?;
                if let Some(d) = device {
                    b = b.device(d);
                }
                if !local_known {
                    b = b.local_rank_from_topology();
                }
                b.build()
            })
            .py()?;
        Ok(Self::wrap(comm))
    }

    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    #[getter]
    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    #[getter]
    fn local_rank(&self) -> usize {
        self.comm.local_rank()
    }

    /// The CUDA ordinal of this rank's GPU.
    #[getter]
    fn device(&self) -> i64 {
        self.ordinal
    }

    /// The raw address of the stream the send/recv namespace is bound to, or None.
    #[getter]
    fn bound_stream(&self) -> Option<usize> {
        self.comm.bound_stream()
    }

    /// All-to-all of equal chunks: `inp` holds `world_size` chunks, chunk `p` for rank `p`;
    /// `out` gets rank `p`'s chunk for this rank at chunk `p`. With `hooks`, `produce` and
    /// `consume` run on every tile; `user` is the device address the hooks see as `ctx.user`;
    /// `row_len` the elements per row (`ctx.cols`, 0: a chunk is one row). Without hooks, an
    /// `out` that lies inside a registration takes the registered route
    /// (`Comm::all_to_all_registered`, docs/PYTHON.md, "Registered buffers").
    #[pyo3(signature = (out, inp, stream, hooks = None, user = 0, row_len = 0))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_all(
        &self,
        py: Python<'_>,
        out: &Bound<'_, PyAny>,
        inp: &Bound<'_, PyAny>,
        stream: u64,
        hooks: Option<PyRef<'_, PyHooks>>,
        user: u64,
        row_len: u64,
    ) -> PyResult<()> {
        let (i, o, args, h, s) =
            self.all_to_all_prepare(out, inp, stream, hooks.as_deref(), user, row_len)?;
        if hooks.is_none() && user == 0 {
            let out_bytes = o.elems * o.elem_size as u64;
            if let Some((_, handle, offset)) = self.regs.find(o.ptr, out_bytes) {
                // SAFETY: `handle` is live (found among the registrations); deregistering it is
                // a collective call on this thread after this one.
                let recv = unsafe { devcomm::RegisteredRange::from_raw(handle, offset, out_bytes) };
                // SAFETY: `inp` was checked as below; `out` lies inside the registration
                // `handle` (found above), which the crate bounds-checks on every rank.
                return py
                    .detach(|| unsafe { self.comm.all_to_all_registered_raw(i, recv, &s) })
                    .py();
            }
        }
        // SAFETY: both tensors were checked (contiguous, on this device, aligned) and span
        // their `elems`; their owner keeps them alive for the stream's work (PyTorch's
        // allocator frees memory in stream order).
        py.detach(|| unsafe { self.comm.all_to_all_raw(h, i, o, args, &s) })
            .py()
    }

    /// All-to-all-v with counts on the GPU (int64 tensors of `world_size` entries, in rows of
    /// `row_len` elements): sends `send_counts[p]` rows to rank `p` (from `send_offsets[p]`, or
    /// packed in rank order when None), writes the rows received from each rank and their
    /// offsets (packed in rank order) into `recv_counts` and `recv_offsets`. No host
    /// synchronisation; counts that do not fit raise `CountOverflow` at the next check.
    #[pyo3(signature = (out, inp, send_counts, send_offsets, recv_counts, recv_offsets, stream, row_len, hooks = None, user = 0))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_v(
        &self,
        py: Python<'_>,
        out: &Bound<'_, PyAny>,
        inp: &Bound<'_, PyAny>,
        send_counts: &Bound<'_, PyAny>,
        send_offsets: Option<&Bound<'_, PyAny>>,
        recv_counts: &Bound<'_, PyAny>,
        recv_offsets: &Bound<'_, PyAny>,
        stream: u64,
        row_len: u64,
        hooks: Option<PyRef<'_, PyHooks>>,
        user: u64,
    ) -> PyResult<()> {
        const OP: &str = "all_to_all_v";
        let o = self.tensor(OP, "out", out, stream)?;
        let i = self.tensor(OP, "inp", inp, stream)?;
        let h = self.hooks(OP, hooks.as_deref(), &i, &o)?;
        let row = row_len.max(1);
        if i.numel() % row != 0 || o.numel() % row != 0 {
            return Err(invalid(
                OP,
                format!(
                    "rows of {row} elements do not divide inp ({}) or out ({})",
                    i.numel(),
                    o.numel()
                ),
            ));
        }
        let counts = RawCounts {
            send_counts: self.counts(OP, "send_counts", send_counts, stream)?,
            send_offsets: match send_offsets {
                Some(t) => self.counts(OP, "send_offsets", t, stream)?,
                None => 0,
            },
            recv_counts: self.counts(OP, "recv_counts", recv_counts, stream)?,
            recv_offsets: self.counts(OP, "recv_offsets", recv_offsets, stream)?,
        };
        let args = HookArgs::rows(row as usize).with_user(user);
        let s = self.stream(stream)?;
        let (ib, ob) = (Self::buffer(&i), Self::buffer(&o));
        // SAFETY: tensors and count arrays checked above (on this device, contiguous, counts of
        // `world_size` 64-bit entries); the kernel checks the device counts against the
        // buffers' rows before moving anything.
        py.detach(|| unsafe { self.comm.all_to_all_v_raw(h, ib, ob, counts, args, &s) })
            .py()
    }

    /// Sends `t` to `peer`; the peer posts a matching `recv` of the same size.
    fn send(&self, py: Python<'_>, t: &Bound<'_, PyAny>, peer: usize, stream: u64) -> PyResult<()> {
        let d = self.tensor("send", "the tensor", t, stream)?;
        let s = self.stream(stream)?;
        let tr = d.transfer(peer);
        // SAFETY: the tensor was checked and spans `bytes`; it is only read.
        py.detach(|| unsafe { self.comm.sendrecv_raw(Some(tr), None, &s) })
            .py()
    }

    /// Receives from `peer` into `t` (the message must be `t`'s size).
    fn recv(&self, py: Python<'_>, t: &Bound<'_, PyAny>, peer: usize, stream: u64) -> PyResult<()> {
        let d = self.tensor("recv", "the tensor", t, stream)?;
        let s = self.stream(stream)?;
        let tr = d.transfer(peer);
        // SAFETY: the tensor was checked and spans `bytes`; the caller hands it over for the
        // operation (declared mutated in the torch op).
        py.detach(|| unsafe { self.comm.sendrecv_raw(None, Some(tr), &s) })
            .py()
    }

    /// Sends `send` to `send_peer` and receives `recv` from `recv_peer` in one kernel (the
    /// way to exchange both ways with one peer).
    fn sendrecv(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        send_peer: usize,
        recv: &Bound<'_, PyAny>,
        recv_peer: usize,
        stream: u64,
    ) -> PyResult<()> {
        let a = self.tensor("sendrecv", "send", send, stream)?;
        let b = self.tensor("sendrecv", "recv", recv, stream)?;
        let s = self.stream(stream)?;
        let ts = a.transfer(send_peer);
        let tr = b.transfer(recv_peer);
        // SAFETY: both tensors were checked and span their bytes.
        py.detach(|| unsafe { self.comm.sendrecv_raw(Some(ts), Some(tr), &s) })
            .py()
    }

    /// Enqueues a barrier across all ranks: work after it on any rank starts once every
    /// rank's work before it has finished.
    fn barrier(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        let s = self.stream(stream)?;
        py.detach(|| self.comm.barrier(&s)).py()
    }

    /// All-reduce in place: every rank's `t` becomes the reduction (`sum`, `avg`, `max`,
    /// `min`) of all ranks' `t`, element by element in rank order.
    fn all_reduce(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        op: &str,
        stream: u64,
    ) -> PyResult<()> {
        const OP: &str = "all_reduce";
        let d = self.tensor(OP, "the tensor", t, stream)?;
        let (dtype, op) = (reduce_dtype(OP, &d)?, reduce_op(OP, op)?);
        let s = self.stream(stream)?;
        let count = d.numel() as usize;
        // SAFETY: the tensor was checked (this device, contiguous, aligned) and spans `count`
        // elements of `dtype`; in place (input == output), as the raw call allows.
        py.detach(|| unsafe { self.comm.all_reduce_raw(d.ptr, d.ptr, count, dtype, op, &s) })
            .py()
    }

    /// Reduce-scatter: `out` gets this rank's shard of the reduction of every rank's `inp`
    /// (`world_size` x `out`'s elements). `out` may be this rank's shard of `inp` (in place).
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        out: &Bound<'_, PyAny>,
        inp: &Bound<'_, PyAny>,
        op: &str,
        stream: u64,
    ) -> PyResult<()> {
        const OP: &str = "reduce_scatter_tensor";
        let o = self.tensor(OP, "out", out, stream)?;
        let i = self.tensor(OP, "inp", inp, stream)?;
        let (dtype, op) = (reduce_dtype(OP, &i)?, reduce_op(OP, op)?);
        same_dtype(OP, &o, &i)?;
        let (rank, world) = (self.comm.rank() as u64, self.comm.world_size() as u64);
        let output = sharded(OP, (&i, "inp"), (&o, "out"), rank, world)?;
        let s = self.stream(stream)?;
        let count = o.numel() as usize;
        // SAFETY: both checked; `inp` spans world x `count` elements and `out` `count`, or
        // `out` is this rank's shard of `inp` and the call is in place (input == output).
        py.detach(|| unsafe {
            self.comm
                .reduce_scatter_raw(i.ptr, output, count, dtype, op, &s)
        })
        .py()
    }

    /// All-gather: `out` (`world_size` x `inp`'s elements) gets every rank's `inp` in rank
    /// order. `inp` may be this rank's shard of `out` (in place).
    fn all_gather(
        &self,
        py: Python<'_>,
        out: &Bound<'_, PyAny>,
        inp: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<()> {
        const OP: &str = "all_gather_into_tensor";
        let o = self.tensor(OP, "out", out, stream)?;
        let i = self.tensor(OP, "inp", inp, stream)?;
        same_dtype(OP, &o, &i)?;
        let (dtype, per) = gather_dtype(OP, &i)?;
        let (rank, world) = (self.comm.rank() as u64, self.comm.world_size() as u64);
        let input = sharded(OP, (&o, "out"), (&i, "inp"), rank, world)?;
        let s = self.stream(stream)?;
        let count = i.numel() as usize * per;
        // SAFETY: both checked; `out` spans world x `count` elements and `inp` `count`, or
        // `inp` is this rank's shard of `out` and the call is in place (input == output).
        py.detach(|| unsafe { self.comm.all_gather_raw(input, o.ptr, count, dtype, &s) })
            .py()
    }

    /// Waits for `stream`, then raises the first device error (e.g. `PeerTimeout`).
    fn synchronize(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        // SAFETY: as in `stream`: PyTorch's stream of this device, alive.
        let s = unsafe {
            self.comm
                .context()
                .wrap_borrowed_stream(stream as cudarc::driver::sys::CUstream)
        };
        py.detach(|| self.comm.synchronize(&s)).py()
    }

    /// Raises the first error recorded by this communicator's kernels, if any (no wait).
    fn check(&self) -> PyResult<()> {
        self.comm.check().py()
    }

    /// Raises the abort flag: every in-flight device wait of this communicator returns.
    fn abort(&self) {
        self.comm.abort()
    }

    /// Host-side barrier through the store (no GPU work).
    fn host_barrier(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.comm.host_barrier()).py()
    }

    /// Whether this communicator records timeline events (`DEVCOMM_TRACE=1`).
    #[getter]
    fn tracing(&self) -> bool {
        self.comm.tracing()
    }

    /// This rank's trace since the last read, as JSON (docs/TRACING.md), after synchronising
    /// the device; `None` with tracing off.
    fn trace_events(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let trace = py.detach(|| self.comm.trace_events()).py()?;
        Ok(trace.map(|t| t.to_json()))
    }

    /// Collective: every rank's trace merged at rank 0 into the Chrome / Perfetto trace `path`;
    /// rank 0 gets the per-operation summary, the others `None`.
    #[pyo3(signature = (path, link_gbps=None))]
    fn write_trace(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        link_gbps: Option<f64>,
    ) -> PyResult<Option<String>> {
        py.detach(|| self.comm.write_trace(&path, link_gbps)).py()
    }

    /// For bench_overhead.py: `iters` calls of the Rust all-to-all on the same tensors (host
    /// time only; returns seconds), the argument checks of one Python call included once.
    fn bench_all_to_all_rust(
        &self,
        out: &Bound<'_, PyAny>,
        inp: &Bound<'_, PyAny>,
        stream: u64,
        iters: u64,
    ) -> PyResult<f64> {
        let (i, o, args, h, s) = self.all_to_all_prepare(out, inp, stream, None, 0, 0)?;
        let t0 = Instant::now();
        for _ in 0..iters {
            // SAFETY: as in `all_to_all`.
            unsafe { self.comm.all_to_all_raw(h, i, o, args, &s) }.py()?;
        }
        Ok(t0.elapsed().as_secs_f64())
    }
}
