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
(`out_rows` then fixed). Eager only for now: these calls are not torch custom ops, so
`torch.compile` graph-breaks around them.
"""

import torch

from . import _native, _ops

_ROW_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


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
    with the same arguments."""

    def __init__(self, comm, num_experts, top_k, hidden, *, dtype=torch.bfloat16, max_tokens=4096, align=1):
        if dtype not in _ROW_DTYPES:
            raise _native.InvalidArgument(f"moe: invalid argument: rows of {dtype} (bfloat16, float16 or float32)")
        self._comm = comm
        self._native = comm._native.moe(num_experts, top_k, hidden, _ROW_DTYPES[dtype], max_tokens, align)
        self.num_experts, self.top_k, self.hidden = num_experts, top_k, hidden
        self.dtype, self.max_tokens, self.align = dtype, max_tokens, align
        self.local_experts = self._native.local_experts

    def worst_case_rows(self):
        """Expert-major rows that hold any routing of up to `max_tokens` tokens per rank."""
        return self._native.worst_case_out_rows()

    def typical_rows(self, tokens, slack=2.0):
        """Rows for `tokens` per rank routed near uniformly, `slack` times the mean per expert
        (a routing that needs more is reported by `check` and writes nothing)."""
        return self._native.typical_out_rows(tokens, slack)

    def _stream(self):
        return torch.cuda.current_stream(self._comm.device).cuda_stream

    def dispatch(self, x, topk_idx, topk_weights, out_rows=None):
        """`x [tokens, hidden]`, `topk_idx` int64 `[tokens, top_k]` (-1: none),
        `topk_weights` float32 `[tokens, top_k]` -> `(recv_x [out_rows, hidden] expert-major,
        recv_weights float32 [out_rows], tokens_per_expert int64 [local_experts], handle)`.
        `out_rows` defaults to `worst_case_rows()`. Ids outside [-1, num_experts) and repeats
        within a token are dropped; `check()` reports them and an `out_rows` too small."""
        rows = self.worst_case_rows() if out_rows is None else int(out_rows)
        dev = x.device
        recv_x = torch.empty((rows, self.hidden), dtype=self.dtype, device=dev)
        recv_w = torch.empty((rows,), dtype=torch.float32, device=dev)
        counts = torch.empty((self.local_experts,), dtype=torch.int64, device=dev)
        x, topk_idx, topk_weights = x.contiguous(), topk_idx.contiguous(), topk_weights.contiguous()
        d = _ops.desc
        self._native.dispatch(d(x), d(topk_idx), d(topk_weights), d(recv_x), d(recv_w), d(counts), self._stream())
        return recv_x, recv_w, counts, Handle(x.shape[0], rows, counts, self.align)

    def combine(self, y, handle, out=None):
        """The experts' outputs `y` (`recv_x`'s shape and order) back to their tokens:
        `[tokens, hidden]`, each token's weighted sum (module docstring)."""
        if out is None:
            out = torch.empty((handle.tokens, self.hidden), dtype=self.dtype, device=y.device)
        self._native.combine(_ops.desc(y.contiguous()), _ops.desc(out), self._stream())
        return out

    def check(self):
        """Waits for the stream and raises `devcomm.InvalidArgument` for what the last dispatch
        counted (ids out of range or repeated, an output too small)."""
        self._native.check(self._stream())
