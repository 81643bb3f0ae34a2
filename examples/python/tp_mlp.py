"""A tensor-parallel MLP over devcomm (docs/PYTHON.md): the first weight split by columns, the
second by rows, and one `all_reduce` of the partial outputs (Megatron-style).

    devcomm launch -n 2 -- python3 examples/python/tp_mlp.py
    (one GPU: scripts/shared-gpu.sh 2 python3 examples/python/tp_mlp.py)

`run(comm)` returns the largest difference from the unsplit MLP computed on each rank.
"""

import torch
import torch.nn.functional as F

D_MODEL = 256
D_FF = 1024
TOKENS = 64


def weights(device):
    g = torch.Generator().manual_seed(4321)
    w1 = torch.randn(D_MODEL, D_FF, generator=g) / D_MODEL**0.5
    w2 = torch.randn(D_FF, D_MODEL, generator=g) / D_FF**0.5
    return w1.to(device), w2.to(device)


class TensorParallelMLP(torch.nn.Module):
    def __init__(self, comm):
        super().__init__()
        self.comm = comm
        w, r = comm.world_size, comm.rank
        assert D_FF % w == 0
        shard = D_FF // w
        w1, w2 = weights(comm.device)
        self.w1 = w1[:, r * shard : (r + 1) * shard].contiguous()  # column-parallel
        self.w2 = w2[r * shard : (r + 1) * shard].contiguous()  # row-parallel

    def forward(self, x):
        partial = F.gelu(x @ self.w1) @ self.w2
        self.comm.all_reduce(partial)  # sum over the ranks, in rank order
        return partial


def run(comm):
    g = torch.Generator().manual_seed(7)  # the same input on every rank
    x = torch.randn(TOKENS, D_MODEL, generator=g).to(comm.device)
    y = TensorParallelMLP(comm)(x)
    comm.synchronize()
    w1, w2 = weights(comm.device)
    return (y - F.gelu(x @ w1) @ w2).abs().max().item()


if __name__ == "__main__":
    import devcomm

    comm = devcomm.init()
    err = run(comm)
    print(f"rank {comm.rank}: tensor-parallel MLP vs single-process reference: max |difference| = {err:.3g}")
    raise SystemExit(0 if err < 1e-3 else 1)
