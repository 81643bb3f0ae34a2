"""devcomm.moe: dispatch and combine against a single-process reference computed on the host in
the kernels' order and rounding, bit for bit; batch invariance; graph replays with new
routings; torch.compile(fullgraph=True) against eager and the custom ops' fakes; errors. Every
rank draws every rank's routing and rows from shared seeds."""

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


def test_sm_budget_gives_the_same_bits(comm, seed):
    """A layer held to a few blocks a launch (each rank its own budget) against one on the
    whole GPU: the same dispatch and combine, bit for bit; bad budgets refused before a layer
    is made."""
    world, me = comm.world_size, comm.rank
    experts = experts_of(comm)
    whole = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=64, align=4)
    held = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=64, align=4, sm_budget=1 + me % 3)
    for bad in (0, 10**6):
        with pytest.raises(devcomm.InvalidArgument, match="SM budget"):
            devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=64, sm_budget=bad)
    x, idx, w = (t.to(comm.device) for t in routing(seed, me, 40 + 3 * me, experts))
    outs = []
    for buf in (whole, held):
        recv_x, recv_w, counts, handle = buf.dispatch(x, idx, w)
        y = (recv_x.float() * 1.5).to(torch.bfloat16)
        out = buf.combine(y, handle)
        buf.check()
        # The rows of the groups (padding rows are left as they were).
        rows = [r for b, c in zip(handle.bases.tolist(), counts.tolist()) for r in range(b, b + c)]
        outs.append((recv_x[rows].view(torch.int16), recv_w[rows], counts.clone(), out.view(torch.int16)))
    torch.cuda.synchronize()
    assert outs[0][2].sum().item() > 0
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_registered_memory_gives_the_same_bits(comm, seed):
    """Tokens, routing, expert outputs and results in devcomm's registered memory pool (as a
    model's activations are under `torch.cuda.use_mem_pool(comm.mem_pool())`) against
    ordinary tensors: the same dispatch and combine, bit for bit."""
    me = comm.rank
    experts = experts_of(comm)
    comm.grow_pool(64 << 20)  # collective: a segment for this test's tensors
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=64, align=4)
    x, idx, w = routing(seed, me, 33 + 2 * me, experts)
    results = []
    for pooled in (False, True):
        if pooled:
            with torch.cuda.use_mem_pool(comm.mem_pool()):
                xs, ids, ws = x.to(comm.device), idx.to(comm.device), w.to(comm.device)
                out = torch.empty_like(xs)
            assert comm.pool_lookup(xs) is not None and comm.pool_lookup(out) is not None
        else:
            xs, ids, ws = x.to(comm.device), idx.to(comm.device), w.to(comm.device)
            out = torch.empty_like(xs)
        recv_x, recv_w, counts, handle = buf.dispatch(xs, ids, ws)
        y = (recv_x.float() * 0.75).to(torch.bfloat16)
        buf.combine(y, handle, out=out)
        buf.check()
        rows = [r for b, c in zip(handle.bases.tolist(), counts.tolist()) for r in range(b, b + c)]
        results.append((recv_x[rows].view(torch.int16), recv_w[rows], counts.clone(), out.view(torch.int16).clone()))
    torch.cuda.synchronize()
    for a, b in zip(*results):
        assert torch.equal(a, b)


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


def expert_scales(comm, local):
    """scale(e) of this rank's local experts, in order (float32 on the GPU)."""
    return torch.tensor([scale(comm.rank * local + le) for le in range(local)], dtype=torch.float32, device=comm.device)


def moe_step(buf, scales):
    """dispatch -> each row times its expert's scale (expert_out, from the handle's bases) ->
    combine."""

    def step(x, idx, w):
        recv_x, _, counts, handle = buf.dispatch(x, idx, w)
        rows = torch.arange(recv_x.shape[0], device=recv_x.device)
        le = torch.searchsorted(handle.bases, rows, right=True) - 1  # padding rows: any group
        y = (recv_x.float() * scales[le].unsqueeze(1)).to(recv_x.dtype)
        return buf.combine(y, handle), counts

    return step


def devcomm_ops(gm):
    """The devcomm ops of a graph, in order (names after `devcomm.`)."""
    return [str(n.target).split(".")[1] for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith("devcomm.")]


def test_torch_compile_fullgraph_matches_eager(comm, seed):
    from torch._dynamo.backends.registry import lookup_backend

    world, me = comm.world_size, comm.rank
    experts = experts_of(comm)
    local = experts // world
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=64, align=4)
    step = moe_step(buf, expert_scales(comm, local))
    graphs = []
    inductor = lookup_backend("inductor")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return inductor(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    # Two routings of other token counts (a recompile, with the token count dynamic), then a
    # third routing of the second's counts (that graph again).
    runs = [(seed, [17 + 5 * r for r in range(world)]), (seed + 1, [40 - 3 * r for r in range(world)]), (seed + 2, [40 - 3 * r for r in range(world)])]
    for i, (s, tokens) in enumerate(runs):
        inputs = [routing(s, r, tokens[r], experts) for r in range(world)]
        x, idx, w = (t.to(comm.device) for t in inputs[me])
        got, got_counts = compiled(x, idx, w)
        torch.cuda.synchronize()
        buf.check()
        want, want_counts = step(x, idx, w)
        torch.cuda.synchronize()
        buf.check()
        assert got.shape == (tokens[me], HIDDEN) and got.dtype == torch.bfloat16, i
        assert torch.equal(got_counts, want_counts), i
        assert got_counts.tolist() == [len(g) for g in reference_dispatch(inputs, me, local)], i
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), i
        ref = reference_combine(inputs[me][0], inputs[me][1], inputs[me][2], local)
        assert torch.equal(got.cpu().view(torch.int16), ref.view(torch.int16)), i
        assert len(graphs) == min(i + 1, 2), (i, len(graphs))
    for gm in graphs:
        assert devcomm_ops(gm) == ["moe_dispatch", "moe_combine"]


def test_torch_compile_out_rows_and_out(comm, seed):
    """Explicit out_rows (the routing's own rows) and combine into the caller's out."""
    world, me = comm.world_size, comm.rank
    experts = experts_of(comm)
    local = experts // world
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=32, align=4)
    inputs = [routing(seed, r, 24 + r, experts, "dropped") for r in range(world)]
    x, idx, w = (t.to(comm.device) for t in inputs[me])
    rows = sum((len(g) + 3) // 4 * 4 for g in reference_dispatch(inputs, me, local))

    def step(x, idx, w, out):
        recv_x, recv_w, counts, handle = buf.dispatch(x, idx, w, out_rows=rows)
        buf.combine(recv_x, handle, out=out)  # identity experts
        return recv_x, recv_w, counts

    got_out, want_out = torch.empty_like(x), torch.empty_like(x)
    got = torch.compile(step, fullgraph=True)(x, idx, w, got_out)
    torch.cuda.synchronize()
    buf.check()
    want = step(x, idx, w, want_out)
    torch.cuda.synchronize()
    buf.check()
    assert got[0].shape == (rows, HIDDEN) and got[1].shape == (rows,) and got[2].shape == (local,)
    assert torch.equal(got[2], want[2])
    bases = (torch.cumsum((want[2] + 3) // 4 * 4, 0) - (want[2] + 3) // 4 * 4).tolist()
    for le, n in enumerate(want[2].tolist()):  # the rows written (padding rows hold anything)
        b = bases[le]
        assert torch.equal(got[0][b : b + n].view(torch.int16), want[0][b : b + n].view(torch.int16)), le
        assert torch.equal(got[1][b : b + n], want[1][b : b + n]), le
    assert torch.equal(got_out.view(torch.int16), want_out.view(torch.int16))
    assert torch.count_nonzero(want_out) > 0
    with pytest.raises(devcomm.InvalidArgument, match="static shape"):
        buf._dispatch_op(x, idx, w, torch.tensor(rows))  # what the compiled path refuses


def test_fakes_and_opcheck(comm, seed):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.library import opcheck

    world, me = comm.world_size, comm.rank
    experts = experts_of(comm)
    local = experts // world
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=32, align=1)
    inputs = [routing(seed, r, 20 + r, experts) for r in range(world)]
    x, idx, w = (t.to(comm.device) for t in inputs[me])
    token = comm._token
    ops = torch.ops.devcomm
    # The fakes: shapes from the Buffer and the int arguments, on the inputs' device; nothing
    # runs (a fake tensor has no data to hand the native layer).
    with FakeTensorMode() as mode:
        fx, fidx, fw, ftoken = (mode.from_tensor(t) for t in (x, idx, w, token))
        rx, rw, counts = ops.moe_dispatch(buf._id, ftoken, fx, fidx, fw, 123)
        out = ops.moe_combine(buf._id, ftoken, rx, counts, 7)
        none = ops.moe_combine_out(buf._id, ftoken, rx, counts, fx)
    assert (tuple(rx.shape), rx.dtype, rx.device) == ((123, HIDDEN), torch.bfloat16, comm.device)
    assert (tuple(rw.shape), rw.dtype, rw.device) == ((123,), torch.float32, comm.device)
    assert (tuple(counts.shape), counts.dtype, counts.device) == ((local,), torch.int64, comm.device)
    assert (tuple(out.shape), out.dtype, out.device) == ((7, HIDDEN), torch.bfloat16, comm.device)
    assert none is None
    # The real ops against their fakes and schemas. out_rows is exactly the routing's rows
    # (align 1), so every output row is written and the runs compare equal.
    rows = sum(len(g) for g in reference_dispatch(inputs, me, local))
    opcheck(ops.moe_dispatch.default, (buf._id, token, x, idx, w, rows))
    recv_x, _, counts, handle = buf.dispatch(x, idx, w, out_rows=rows)  # the dispatch combined below
    opcheck(ops.moe_combine.default, (buf._id, token, recv_x, counts, x.shape[0]))
    opcheck(ops.moe_combine_out.default, (buf._id, token, recv_x, counts, torch.empty_like(x)))
    direct = ops.moe_combine(buf._id, token, recv_x, counts, x.shape[0])
    eager = buf.combine(recv_x, handle)
    comm.synchronize()
    buf.check()
    assert torch.equal(direct.view(torch.int16), eager.view(torch.int16))
    assert torch.count_nonzero(eager) > 0
