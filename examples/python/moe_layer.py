"""A mixture-of-experts layer with expert parallelism over devcomm (docs/PYTHON.md).

Each rank holds `EXPERTS / world_size` experts. A token goes to its top-k experts: the router's
choice is counted per destination rank on the GPU (`scatter_add_`), the token rows are
dispatched with `all_to_all_v` whose splits stay on the GPU, the experts run on what arrived,
and a second `all_to_all_v` with the received counts brings the results back (combine). The
host never waits for the counts: the whole forward pass can be captured in a CUDA graph.

    devcomm launch -n 2 -- python3 examples/python/moe_layer.py
    (one GPU: scripts/shared-gpu.sh 2 python3 examples/python/moe_layer.py)

`run(comm)` returns the largest difference from a single-process reference computed on each
rank from the same weights (every rank draws every expert's weights from a shared seed).
"""

import torch
import torch.nn.functional as F

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


class MoELayer(torch.nn.Module):
    def __init__(self, comm):
        super().__init__()
        self.comm = comm
        w = comm.world_size
        assert EXPERTS % w == 0, "experts must divide among the ranks"
        self.per_rank = EXPERTS // w
        router, w1, w2 = weights(comm.device)
        first = comm.rank * self.per_rank
        self.router = router
        self.w1 = w1[first : first + self.per_rank]
        self.w2 = w2[first : first + self.per_rank]
        # Worst case: every token of every rank comes here k times.
        self.capacity = w * TOKENS * TOP_K

    def forward(self, x):
        comm, w = self.comm, self.comm.world_size
        experts, gate = route(x, self.router)  # [T, k]
        flat_expert = experts.reshape(-1)
        order = torch.argsort(flat_expert, stable=True)  # grouped by expert, so by rank
        token = order // TOP_K
        dest = flat_expert[order] // self.per_rank
        # Rows for each rank, counted on the GPU (torch.bincount would read its maximum on the host).
        send_counts = torch.zeros(w, dtype=torch.int64, device=x.device).scatter_add_(0, dest, torch.ones_like(dest))
        # Each row carries the token and, in its last column, the expert on the destination.
        local_expert = (flat_expert[order] % self.per_rank).to(x.dtype)
        send = torch.cat([x[token], local_expert[:, None]], dim=1)

        # Dispatch.
        recv = torch.empty((self.capacity, D_MODEL + 1), device=x.device, dtype=x.dtype)
        recv_counts, _ = comm.all_to_all_v(recv, send, send_counts)

        # Experts, on every row of the buffer with the unused rows masked (no host sync for
        # the number received).
        valid = torch.arange(self.capacity, device=x.device) < recv_counts.sum()
        rows, which = recv[:, :D_MODEL], recv[:, D_MODEL]
        out = torch.zeros((self.capacity, D_MODEL), device=x.device, dtype=x.dtype)
        for j in range(self.per_rank):
            mask = (valid & (which == j))[:, None]  # rows past the received hold anything
            mine = torch.where(mask, rows, 0.0)
            out += torch.where(mask, expert(mine, self.w1[j], self.w2[j]), 0.0)

        # Combine: each source's rows go back, in the order they came.
        back = torch.empty((TOKENS * TOP_K, D_MODEL), device=x.device, dtype=x.dtype)
        comm.all_to_all_v(back, out, recv_counts)
        y = torch.zeros_like(x)
        y.index_add_(0, token, back * gate.reshape(-1)[order][:, None])
        return y


def reference(x, device):
    """The same layer in one process, every expert local."""
    router, w1, w2 = weights(device)
    experts, gate = route(x, router)
    y = torch.zeros_like(x)
    for e in range(EXPERTS):
        tok, slot = (experts == e).nonzero(as_tuple=True)
        if tok.numel():
            y.index_add_(0, tok, expert(x[tok], w1[e], w2[e]) * gate[tok, slot][:, None])
    return y


def run(comm):
    g = torch.Generator().manual_seed(99 + comm.rank)
    x = torch.randn(TOKENS, D_MODEL, generator=g).to(comm.device)
    layer = MoELayer(comm)
    y = layer(x)
    comm.synchronize()
    return (y - reference(x, comm.device)).abs().max().item()


if __name__ == "__main__":
    import devcomm

    comm = devcomm.init()
    err = run(comm)
    print(f"rank {comm.rank}: MoE layer vs single-process reference: max |difference| = {err:.3g}")
    raise SystemExit(0 if err < 1e-4 else 1)
