"""A mixture-of-experts layer with expert parallelism over devcomm.moe (docs/MOE.md).

Each rank holds `EXPERTS / world_size` experts. A token goes to its top-k experts:
`Buffer.dispatch` sends it once to each rank that holds one of them and hands back the rows
grouped by local expert (expert-major, counts on the GPU); the experts run on their groups;
`Buffer.combine` brings the results back and sums each token's weighted outputs in a fixed
order, so the result does not depend on what else was in the batch. The host never waits for
the counts: the whole forward pass can be captured in a CUDA graph.

With `--fp8` (`MoELayer(comm, fp8="per_row")`) the tokens cross as e4m3 with a scale per row
and arrive dequantised (`Buffer(..., fp8="per_row", dequantise=True)`): a quarter of the bytes
of f32 rows on the links. The reference then runs on the rows as the pack kernel quantises
them (`quantise`), so the comparison stays tight; the difference from the unquantised layer is
printed beside it.

    devcomm launch -n 2 -- python3 examples/python/moe_layer.py [--fp8]
    (one GPU: scripts/shared-gpu.sh 2 python3 examples/python/moe_layer.py)

`run(comm)` returns the largest difference from a single-process reference computed on each
rank from the same weights (every rank draws every expert's weights from a shared seed).
"""

import sys

import torch
import torch.nn.functional as F

import devcomm.moe

EXPERTS = 8
TOP_K = 2
D_MODEL = 64
D_FF = 128
TOKENS = 256  # per rank


def weights(device):
    """Router and expert weights, the same on every rank."""
    g = torch.Generator().manual_seed(1234)
    router = torch.randn(D_MODEL, EXPERTS, generator=g) / D_MODEL**0.5
    w1 = torch.randn(EXPERTS, D_MODEL, D_FF, generator=g) / D_MODEL**0.5
    w2 = torch.randn(EXPERTS, D_FF, D_MODEL, generator=g) / D_FF**0.5
    return router.to(device), w1.to(device), w2.to(device)


def expert(x, w1, w2):
    return F.gelu(x @ w1) @ w2


def route(x, router):
    """Top-k experts of every token and their weights (softmax over the chosen k)."""
    scores, experts = torch.topk(x @ router, TOP_K, dim=-1)
    return experts, torch.softmax(scores, dim=-1)


def quantise(x):
    """Rows `x` as devcomm's pack kernel sends them with `fp8="per_row"`, dequantised: scale =
    amax / 448 (1 for a row of zeros), codes = e4m3(x / scale) rounded to nearest even,
    back as codes x scale in f32 (docs/MOE.md, "FP8 on the wire")."""
    amax = x.abs().amax(1, keepdim=True)
    c448 = torch.full_like(amax, 448.0)
    pos = amax > 0
    # Tensor by tensor, each division rounded once as the kernel's (a scalar 448.0 / amax is
    # a reciprocal and a product in torch).
    scale = torch.where(pos, amax / c448, 1.0)
    inv = torch.where(pos, c448 / amax, 1.0)
    return (x * inv).to(torch.float8_e4m3fn).float() * scale


class MoELayer(torch.nn.Module):
    def __init__(self, comm, fp8=None):
        super().__init__()
        w = comm.world_size
        assert EXPERTS % w == 0, "experts must divide among the ranks"
        self.per_rank = EXPERTS // w
        router, w1, w2 = weights(comm.device)
        first = comm.rank * self.per_rank
        self.router = router
        self.w1 = w1[first : first + self.per_rank]
        self.w2 = w2[first : first + self.per_rank]
        self.buf = devcomm.moe.Buffer(
            comm, EXPERTS, TOP_K, D_MODEL, dtype=torch.float32, max_tokens=TOKENS, fp8=fp8, dequantise=fp8 is not None
        )

    def forward(self, x):
        experts, gate = route(x, self.router)  # [T, k]
        recv, _, counts, handle = self.buf.dispatch(x, experts, gate)
        # Each local expert on its group of rows: without reading the counts on the host, every
        # expert runs on every row and keeps its own (rows past the groups hold anything).
        row = torch.arange(recv.shape[0], device=x.device)[:, None]
        bases = handle.bases
        y = torch.zeros_like(recv)
        for j in range(self.per_rank):
            mine = (row >= bases[j]) & (row < bases[j] + counts[j])
            y += torch.where(mine, expert(torch.where(mine, recv, 0.0), self.w1[j], self.w2[j]), 0.0)
        return self.buf.combine(y, handle)


def reference(x, device, arrived=None):
    """The same layer in one process, every expert local; the experts run on `arrived` (the
    rows as they reach them, `x` by default), the router on `x`."""
    rows = x if arrived is None else arrived
    router, w1, w2 = weights(device)
    experts, gate = route(x, router)
    y = torch.zeros_like(x)
    for e in range(EXPERTS):
        tok, slot = (experts == e).nonzero(as_tuple=True)
        if tok.numel():
            y.index_add_(0, tok, expert(rows[tok], w1[e], w2[e]) * gate[tok, slot][:, None])
    return y


def run(comm, fp8=None):
    """The largest difference from the reference; with `fp8`, from the reference on the
    quantised rows, and (second) from the unquantised reference."""
    g = torch.Generator().manual_seed(99 + comm.rank)
    x = torch.randn(TOKENS, D_MODEL, generator=g).to(comm.device)
    layer = MoELayer(comm, fp8=fp8)
    y = layer(x)
    comm.synchronize()
    if fp8 is None:
        return (y - reference(x, comm.device)).abs().max().item()
    exact = (y - reference(x, comm.device)).abs().max().item()
    return (y - reference(x, comm.device, quantise(x))).abs().max().item(), exact


if __name__ == "__main__":
    import devcomm

    comm = devcomm.init()
    if "--fp8" in sys.argv[1:]:
        err, exact = run(comm, fp8="per_row")
        print(
            f"rank {comm.rank}: FP8 MoE layer vs the reference on the quantised rows: max |difference| = "
            f"{err:.3g} (vs the unquantised layer: {exact:.3g})"
        )
    else:
        err = run(comm)
        print(f"rank {comm.rank}: MoE layer vs single-process reference: max |difference| = {err:.3g}")
    raise SystemExit(0 if err < 1e-4 else 1)
