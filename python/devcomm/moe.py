"""Mixture-of-experts dispatch and combine (docs/MOE.md), names after DeepEP's.

    buf = devcomm.moe.Buffer(comm, num_experts=256, top_k=8, hidden=7168, max_tokens=4096, align=128)
    recv_x, recv_weights, tokens_per_expert, handle = buf.dispatch(x, topk_idx, topk_weights)
    y = experts(recv_x, tokens_per_expert)          # grouped GEMM over the expert-major rows
    out = buf.combine(y, handle)                    # [tokens, hidden], bitwise reproducible

Rank r holds experts [r * E / W, (r + 1) * E / W). A token crosses to each rank once, however
many of its experts live there. `recv_x` is expert-major: the rows of local expert e start at
`handle.bases[e]` (each group padded to `align` rows; padding rows hold whatever was there),
in (source rank, source token) order; `tokens_per_expert` (int64, on the GPU) counts each
group's rows. `combine` sums each token's weighted expert outputs per rank in ascending expert
order in float32, rounds once per rank and once more after adding the ranks in rank order: the
result depends only on the token's own routing and its experts' outputs. Nothing goes through
the host; both calls run on torch's current stream and can be captured in CUDA graphs
(`out_rows` then fixed).

FP8 on the wire (`Buffer(..., fp8="per_row" | "per_128")`): each row is quantised to e4m3
(float8_e4m3fn) where it is packed for sending, with a float32 scale `amax / 448` per row or
per 128 elements; `recv_x` is then the pair `(recv_x float8_e4m3fn [out_rows, hidden],
recv_scales float32 [out_rows, scales_per_row])` (element i of a row = `recv_x[i] x
recv_scales[i // block]`), or, with `dequantise=True`, the rows dequantised to `dtype`. The
combine takes and returns `dtype` either way.

Under `torch.compile` (fullgraph too) the calls become the custom ops
`torch.ops.devcomm.moe_dispatch` (`moe_dispatch_fp8` for a Buffer that returns FP8),
`moe_combine` and `moe_combine_out` (python/devcomm/_ops.py),
ordered with the communicator's other ops; in eager mode they call the native layer directly,
as before. No output shape depends on the routing: `recv_x [out_rows, hidden]`, `recv_weights
[out_rows]` and `tokens_per_expert [local_experts]`, where `out_rows` is a host int
(`worst_case_rows()`, fixed by the Buffer, when not given; a tensor is refused under compile);
combine's output is `[tokens, hidden]`, `tokens` being dispatch's `x.shape[0]`. The handle is
built in the graph from `tokens_per_expert` and those ints. `check()` waits for the stream on
the host: call it outside the compiled function (inside, it breaks the graph).
"""

import torch

from . import _native, _ops

_ROW_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

# torch.compile recognises this function itself (as in devcomm._comm).
_compiling = torch.compiler.is_compiling


class Handle:
    """What `dispatch` returns for its `combine`: the expert-major layout on this rank."""

    def __init__(self, tokens, out_rows, tokens_per_expert, align):
        self.tokens = tokens
        self.out_rows = out_rows
        self.tokens_per_expert = tokens_per_expert
        self.align = align

    @property
    def bases(self):
        """First row of each local expert's group (int64, on the GPU; groups padded)."""
        padded = (self.tokens_per_expert + self.align - 1) // self.align * self.align
        return torch.cumsum(padded, 0) - padded


class Buffer:
    """One MoE layer's dispatch and combine on `comm` (a `devcomm.Comm`): its kernels and
    scratch (about four times `max_tokens x world_size x hidden` elements). Every rank makes it
    with the same arguments, at the same point of its program. Between NVLink peers the
    scratch is memory that every rank writes into (docs/MOE.md, "How it runs"), so releasing
    a Buffer is collective too: every rank drops it at the same point (each waits, up to the
    setup timeout, for the others)."""

    def __init__(self, comm, num_experts, top_k, hidden, *, dtype=torch.bfloat16, max_tokens=4096, align=1, fp8=None, dequantise=False, sm_budget=None):
        """`fp8`: None (rows cross as they are), "per_row" or "per_128" (e4m3 on the wire with
        a scale per row or per 128 elements; `hidden` a multiple of 16, or of 128); the
        dispatch then returns FP8 + scales, or rows of `dtype` with `dequantise=True`.
        `sm_budget`: the most blocks (so SMs) any launch of the layer's kernels takes, leaving
        the rest of the GPU to the kernels beside it (decode's low-latency mode; None: the
        whole GPU). Every call fits any budget; a smaller one makes it slower."""
        if dtype not in _ROW_DTYPES:
            raise _native.InvalidArgument(f"moe: invalid argument: rows of {dtype} (bfloat16, float16 or float32)")
        self._comm = comm
        self._native = comm._native.moe(num_experts, top_k, hidden, _ROW_DTYPES[dtype], max_tokens, align, fp8, dequantise, sm_budget)
        self.num_experts, self.top_k, self.hidden = num_experts, top_k, hidden
        self.dtype, self.max_tokens, self.align = dtype, max_tokens, align
        self.fp8, self.dequantise, self.sm_budget = fp8, dequantise, sm_budget
        # Plain attributes (not the native object's) so that torch.compile reads them while
        # tracing; the id names this Buffer to the custom ops.
        self.fp8_out = self._native.outputs_fp8
        self.scales_per_row = self._native.scales_per_row
        self.local_experts = self._native.local_experts
        self._worst_rows = self._native.worst_case_out_rows()
        self._id = _ops.register_moe(self)

    def worst_case_rows(self):
        """Expert-major rows that hold any routing of up to `max_tokens` tokens per rank."""
        return self._worst_rows

    def typical_rows(self, tokens, slack=2.0):
        """Rows for `tokens` per rank routed near uniformly, `slack` times the mean per expert
        (a routing that needs more is reported by `check` and writes nothing)."""
        return self._native.typical_out_rows(tokens, slack)

    def _stream(self):
        return torch.cuda.current_stream(self._comm.device).cuda_stream

    def dispatch(self, x, topk_idx, topk_weights, out_rows=None):
        """`x [tokens, hidden]`, `topk_idx` int64 `[tokens, top_k]` (-1: none),
        `topk_weights` float32 `[tokens, top_k]` -> `(recv_x [out_rows, hidden] expert-major,
        recv_weights float32 [out_rows], tokens_per_expert int64 [local_experts], handle)`;
        for a Buffer that returns FP8, `recv_x` is `(recv_x float8_e4m3fn, recv_scales float32
        [out_rows, scales_per_row])`.
        `out_rows` (a host int) defaults to `worst_case_rows()`. Ids outside [-1, num_experts)
        and repeats within a token are dropped; `check()` reports them and an `out_rows` too
        small."""
        if _compiling():
            return self._dispatch_op(x, topk_idx, topk_weights, out_rows)
        rows = self._worst_rows if out_rows is None else int(out_rows)
        recv_x, recv_w, counts, recv_s = _ops.moe_dispatch_run(self, x, topk_idx, topk_weights, rows)
        if self.fp8_out:
            recv_x = (recv_x, recv_s)
        return recv_x, recv_w, counts, Handle(x.shape[0], rows, counts, self.align)

    def _dispatch_op(self, x, topk_idx, topk_weights, out_rows):
        # The shapes of a compiled graph come from ints known while tracing: `out_rows` may not
        # be a tensor (its value would be data the graph only has on the GPU).
        if isinstance(out_rows, torch.Tensor):
            raise _native.InvalidArgument(
                "moe dispatch: invalid argument: out_rows is a tensor; under torch.compile the "
                "output's rows are a static shape: pass an int (worst_case_rows(), typical_rows())"
            )
        rows = self._worst_rows if out_rows is None else out_rows if isinstance(out_rows, int) else int(out_rows)
        x, topk_idx, topk_weights = x.contiguous(), topk_idx.contiguous(), topk_weights.contiguous()
        if self.fp8_out:
            recv_q, recv_s, recv_w, counts = torch.ops.devcomm.moe_dispatch_fp8(self._id, self._comm._token, x, topk_idx, topk_weights, rows)
            recv_x = (recv_q, recv_s)
        else:
            recv_x, recv_w, counts = torch.ops.devcomm.moe_dispatch(self._id, self._comm._token, x, topk_idx, topk_weights, rows)
        return recv_x, recv_w, counts, Handle(x.shape[0], rows, counts, self.align)

    def combine(self, y, handle, out=None):
        """The experts' outputs `y` (`recv_x`'s shape and order, of `dtype`) back to their tokens:
        `[tokens, hidden]`, each token's weighted sum (module docstring). Combines the last
        dispatch; `handle` gives its token count (and, under torch.compile, keeps its
        `tokens_per_expert`, which the combine reads, alive until then)."""
        if _compiling():
            y = y.contiguous()
            if out is None:
                return torch.ops.devcomm.moe_combine(self._id, self._comm._token, y, handle.tokens_per_expert, handle.tokens)
            torch.ops.devcomm.moe_combine_out(self._id, self._comm._token, y, handle.tokens_per_expert, out)
            return out
        if out is None:
            out = torch.empty((handle.tokens, self.hidden), dtype=self.dtype, device=y.device)
        _ops.moe_combine_run(self, y, out)
        return out

    def check(self):
        """Waits for the stream and raises `devcomm.InvalidArgument` for what the last dispatch
        counted (ids out of range or repeated, an output too small)."""
        self._native.check(self._stream())
