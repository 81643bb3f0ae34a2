"""devcomm.moe: dispatch and combine against a single-process reference computed on the host in
the kernels' order and rounding, bit for bit; batch invariance; graph replays with new
routings; errors. Every rank draws every rank's routing and rows from shared seeds."""

import pytest
import torch

import devcomm
import devcomm.moe

HIDDEN, TOP_K = 128, 4


def experts_of(comm):
    return 4 * comm.world_size


def routing(seed, rank, tokens, experts, kind="uniform"):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    idx = torch.stack([torch.randperm(experts, generator=g)[:TOP_K] for _ in range(tokens)]) if tokens else torch.zeros((0, TOP_K), dtype=torch.int64)
    if kind == "dropped" and tokens:
        idx[torch.rand(idx.shape, generator=g) < 0.3] = -1
    w = torch.rand((tokens, TOP_K), generator=g, dtype=torch.float32)
    x = (torch.randint(-64, 64, (tokens, HIDDEN), generator=g).float() / 8).to(torch.bfloat16)
    return x, idx.to(torch.int64), w


def scale(e):
    return 1.0 + e / 8.0


def expert_out(x, e):
    return (x.float() * scale(e)).to(torch.bfloat16)


def reference_dispatch(inputs, me, local):
    """Per local expert, the (rank, token, weight) rows in order."""
    groups = [[] for _ in range(local)]
    for s, (x, idx, w) in enumerate(inputs):
        for t in range(idx.shape[0]):
            for j in range(TOP_K):
                e = int(idx[t, j])
                if e >= 0 and e // local == me:
                    groups[e - me * local].append((s, t, float(w[t, j])))
    return groups


def reference_combine(x, idx, w, local):
    out = torch.zeros_like(x)
    for t in range(idx.shape[0]):
        chosen = sorted((int(e), float(w[t, j])) for j, e in enumerate(idx[t]) if int(e) >= 0)
        total = None
        for r in sorted({e // local for e, _ in chosen}):
            acc = None
            for e, wt in chosen:
                if e // local != r:
                    continue
                p = torch.tensor(wt, dtype=torch.float32) * expert_out(x[t], e).float()
                acc = p if acc is None else acc + p
            part = acc.to(torch.bfloat16).float()
            total = part if total is None else total + part
        if total is not None:
            out[t] = total.to(torch.bfloat16)
    return out


@pytest.mark.parametrize("kind", ["uniform", "dropped", "empty_rank"])
def test_dispatch_combine_bitwise(comm, seed, kind):
    world, me = comm.world_size, comm.rank
    experts = experts_of(comm)
    local = experts // world
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=64, align=4)
    tokens = [0 if (kind == "empty_rank" and r == 1) else 17 + 5 * r for r in range(world)]
    inputs = [routing(seed, r, tokens[r], experts, kind) for r in range(world)]
    x, idx, w = (t.to(comm.device) for t in inputs[me])
    recv_x, recv_w, counts, handle = buf.dispatch(x, idx, w)
    buf.check()
    groups = reference_dispatch(inputs, me, local)
    assert counts.tolist() == [len(g) for g in groups]
    bases = handle.bases.tolist()
    y = torch.zeros_like(recv_x)
    for le, g in enumerate(groups):
        for i, (s, t, wt) in enumerate(g):
            row = bases[le] + i
            assert torch.equal(recv_x[row].cpu(), inputs[s][0][t]), (le, i)
            assert recv_w[row].item() == wt
            y[row] = expert_out(inputs[s][0][t], me * local + le).to(comm.device)
    out = buf.combine(y, handle)
    torch.cuda.synchronize()
    want = reference_combine(inputs[me][0], inputs[me][1], inputs[me][2], local)
    assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))


def test_graph_replays_with_new_routings(comm, seed):
    world, me = comm.world_size, comm.rank
    experts = experts_of(comm)
    local = experts // world
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=32, align=1)
    tokens = 32
    x, idx, w = (t.to(comm.device) for t in routing(seed, me, tokens, experts))
    rows = buf.worst_case_rows()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        recv_x, _, _, handle = buf.dispatch(x, idx, w, out_rows=rows)  # warm-up outside
        buf.combine(recv_x, handle)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        recv_x, _, _, handle = buf.dispatch(x, idx, w, out_rows=rows)
        out = buf.combine(recv_x, handle)  # identity experts
    for replay in range(3):
        nx, nidx, nw = routing(seed + 100 + replay, me, tokens, experts)
        x.copy_(nx)
        idx.copy_(nidx)
        w.copy_(nw)
        torch.cuda.synchronize()
        comm.barrier()
        g.replay()
        torch.cuda.synchronize()
        buf.check()
        # Identity experts: expert_out with scale 1 for every expert.
        want = torch.zeros_like(nx)
        for t in range(tokens):
            chosen = sorted((int(e), float(nw[t, j])) for j, e in enumerate(nidx[t]) if int(e) >= 0)
            total = None
            for r in sorted({e // local for e, _ in chosen}):
                acc = None
                for e, wt in chosen:
                    if e // local == r:
                        p = torch.tensor(wt, dtype=torch.float32) * nx[t].float()
                        acc = p if acc is None else acc + p
                part = acc.to(torch.bfloat16).float()
                total = part if total is None else total + part
            want[t] = total.to(torch.bfloat16)
        assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16)), replay


def test_errors(comm, seed):
    experts = experts_of(comm)
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=8)
    x, idx, w = (t.to(comm.device) for t in routing(seed, comm.rank, 9, experts))
    with pytest.raises(devcomm.InvalidArgument, match="max_tokens"):
        buf.dispatch(x, idx, w)
    with pytest.raises(devcomm.InvalidArgument, match="int64|dtype"):
        buf.dispatch(x[:8], idx[:8].to(torch.int32), w[:8])
    bad = idx[:8].clone()
    bad[0, 0] = experts + 5
    recv_x, _, _, handle = buf.dispatch(x[:8], bad, w[:8])
    with pytest.raises(devcomm.InvalidArgument, match="outside"):
        buf.check()
    buf.combine(recv_x, handle)
    torch.cuda.synchronize()
    comm.barrier()
