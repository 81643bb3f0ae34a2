"""devcomm.moe with FP8 (e4m3) on the wire: the dispatch's codes and scales, or its dequantised
rows, bit for bit against torch's own float8_e4m3fn rounding of the same steps (amax / 448
per row or per 128 elements; torch rounds to nearest even and, below 480, as devcomm does),
and within e4m3's error of the rows sent; the combine bit for bit against the reference on the
rows as they arrived; a graph replay; torch.compile(fullgraph=True) and the FP8 op's fake; a
hidden size FP8 cannot carry refused."""

import pytest
import torch

import devcomm
import devcomm.moe

from test_moe import TOP_K, expert_out, experts_of, reference_combine, reference_dispatch

HIDDEN = 256  # two 128-element blocks a row: per-row and per-128 scales differ
FLT_MAX = torch.finfo(torch.float32).max


def routing(seed, rank, tokens, experts, kind="uniform"):
    """As test_moe's, with rows over twelve binades (subnormal e4m3 codes and the top of the
    range in the same block)."""
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    idx = torch.stack([torch.randperm(experts, generator=g)[:TOP_K] for _ in range(tokens)]) if tokens else torch.zeros((0, TOP_K), dtype=torch.int64)
    if kind == "dropped" and tokens:
        idx[torch.rand(idx.shape, generator=g) < 0.3] = -1
    w = torch.rand((tokens, TOP_K), generator=g, dtype=torch.float32)
    m = torch.randint(-128, 128, (tokens, HIDDEN), generator=g).float() / 16
    e = torch.randint(0, 12, (tokens, HIDDEN), generator=g).float()
    x = (m * torch.exp2(-e)).to(torch.bfloat16)
    return x, idx.to(torch.int64), w


def block_of(fp8):
    return HIDDEN if fp8 == "per_row" else 128


def quantise(x, block):
    """Rows `x` ([n, HIDDEN]) as devcomm's pack kernel quantises them: (codes as uint8, scales
    [n, HIDDEN // block])."""
    f = x.float().reshape(x.shape[0], -1, block)
    amax = torch.where(torch.isfinite(f), f.abs(), 0.0).amax(2, keepdim=True)
    pos = amax > 0
    # Tensor by tensor: torch computes `448.0 / amax` as amax.reciprocal() * 448 (two
    # roundings), where the kernel divides once (correctly rounded, as `/` of two tensors).
    c448 = torch.full_like(amax, 448.0)
    scale = torch.where(pos, amax / c448, 1.0)
    inv = torch.where(pos, torch.clamp(c448 / amax, max=FLT_MAX), 1.0)
    q = (f * inv).to(torch.float8_e4m3fn).reshape(x.shape[0], -1)
    return q.view(torch.uint8), scale.reshape(x.shape[0], -1)


def dequantise(codes, scales, block, dtype=torch.bfloat16):
    f = codes.view(torch.float8_e4m3fn).float().reshape(codes.shape[0], -1, block)
    return (f * scales.unsqueeze(2)).reshape(codes.shape[0], -1).to(dtype)


def arrived(x, block):
    q, s = quantise(x, block)
    return dequantise(q, s, block)


def within_error(x, got, scales, block):
    """|got - x| at most half an e4m3 step (relative, or absolute for subnormal codes) plus
    bf16's rounding."""
    a = x.float().abs()
    s = scales.repeat_interleave(block, dim=1)
    step = a / 16 + s / 1024
    bound = step + (a + step) / 256 + a * 2.0**-20
    return bool(((got.float() - x.float()).abs() <= bound).all())


@pytest.mark.parametrize("fp8", ["per_row", "per_128"])
@pytest.mark.parametrize("dequantise_out", [False, True])
@pytest.mark.parametrize("kind", ["uniform", "dropped"])
def test_fp8_dispatch_bitwise(comm, seed, fp8, dequantise_out, kind):
    world, me = comm.world_size, comm.rank
    experts = experts_of(comm)
    local = experts // world
    block = block_of(fp8)
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=64, align=4, fp8=fp8, dequantise=dequantise_out)
    assert buf.fp8_out == (not dequantise_out)
    tokens = [17 + 5 * r for r in range(world)]
    inputs = [routing(seed, r, tokens[r], experts, kind) for r in range(world)]
    x, idx, w = (t.to(comm.device) for t in inputs[me])
    recv, recv_w, counts, handle = buf.dispatch(x, idx, w)
    buf.check()
    groups = reference_dispatch(inputs, me, local)
    assert counts.tolist() == [len(g) for g in groups]
    if dequantise_out:
        assert recv.dtype == torch.bfloat16 and recv.shape[1] == HIDDEN
    else:
        recv_q, recv_s = recv
        assert recv_q.dtype == torch.float8_e4m3fn and recv_s.shape == (recv_q.shape[0], HIDDEN // block)
        assert buf.scales_per_row == HIDDEN // block
    bases = handle.bases.tolist()
    rows = [bases[le] + i for le, g in enumerate(groups) for i in range(len(g))]
    row_experts = [le for le, g in enumerate(groups) for _ in g]
    srcs = [(s, t) for g in groups for (s, t, _) in g]
    sent = torch.stack([inputs[s][0][t] for s, t in srcs]) if srcs else torch.zeros((0, HIDDEN), dtype=torch.bfloat16)
    want_q, want_s = quantise(sent, block)
    at = torch.tensor(rows, dtype=torch.int64, device=comm.device)
    if dequantise_out:
        got = recv[at].cpu()
        assert torch.equal(got.view(torch.int16), dequantise(want_q, want_s, block).view(torch.int16))
    else:
        assert torch.equal(recv_q[at].cpu().view(torch.uint8), want_q)
        assert torch.equal(recv_s[at].cpu(), want_s)
        got = dequantise(recv_q[at].cpu(), recv_s[at].cpu(), block)
    assert within_error(sent, got, want_s, block)
    assert not torch.equal(got.view(torch.int16), sent.view(torch.int16)), "quantisation changes rows"
    assert recv_w[at].cpu().tolist() == [wt for g in groups for (_, _, wt) in g]
    # Experts on the rows as they arrived; the combine against the reference on those rows.
    y = torch.zeros((recv_w.shape[0], HIDDEN), dtype=torch.bfloat16, device=comm.device)
    for k, (row, le) in enumerate(zip(rows, row_experts)):
        y[row] = expert_out(got[k], me * local + le).to(comm.device)
    out = buf.combine(y, handle)
    torch.cuda.synchronize()
    want = reference_combine(arrived(inputs[me][0], block), inputs[me][1], inputs[me][2], local)
    assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))


def test_fp8_graph_replays(comm, seed):
    world, me = comm.world_size, comm.rank
    experts = experts_of(comm)
    local = experts // world
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=32, align=1, fp8="per_128", dequantise=True)
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
        # Identity experts on the rows as they arrived.
        want = reference_combine_identity(arrived(nx, 128), nidx, nw, local)
        assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16)), replay


def test_fp8_torch_compile_and_fake(comm, seed):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.library import opcheck

    world, me = comm.world_size, comm.rank
    experts = experts_of(comm)
    local = experts // world
    buf = devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=32, align=1, fp8="per_128")
    inputs = [routing(seed, r, 20 + r, experts) for r in range(world)]
    x, idx, w = (t.to(comm.device) for t in inputs[me])
    rows = sum(len(g) for g in reference_dispatch(inputs, me, local))

    def step(x, idx, w):
        (q, s), recv_w, counts, handle = buf.dispatch(x, idx, w, out_rows=rows)
        # An expert that dequantises: q x its block's scale, in bf16.
        y = (q.float().reshape(rows, -1, 128) * s.unsqueeze(2)).reshape(rows, HIDDEN).to(torch.bfloat16)
        return q, s, counts, buf.combine(y, handle)

    got = torch.compile(step, fullgraph=True)(x, idx, w)
    torch.cuda.synchronize()
    buf.check()
    want = step(x, idx, w)
    torch.cuda.synchronize()
    buf.check()
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert torch.equal(got[3].view(torch.int16), want[3].view(torch.int16))
    # The step's expert dequantises as the wire does: the identity on the arrived rows.
    ident = reference_combine_identity(arrived(inputs[me][0], 128), inputs[me][1], inputs[me][2], local)
    assert torch.equal(got[3].cpu().view(torch.int16), ident.view(torch.int16))
    token, ops = comm._token, torch.ops.devcomm
    with FakeTensorMode() as mode:
        fx, fidx, fw, ftoken = (mode.from_tensor(t) for t in (x, idx, w, token))
        q, s, rw, counts = ops.moe_dispatch_fp8(buf._id, ftoken, fx, fidx, fw, 123)
    assert (tuple(q.shape), q.dtype, q.device) == ((123, HIDDEN), torch.float8_e4m3fn, comm.device)
    assert (tuple(s.shape), s.dtype) == ((123, HIDDEN // 128), torch.float32)
    assert (tuple(rw.shape), tuple(counts.shape)) == ((123,), (local,))
    opcheck(ops.moe_dispatch_fp8.default, (buf._id, token, x, idx, w, rows))
    with pytest.raises(devcomm.InvalidArgument, match="moe_dispatch_fp8"):
        ops.moe_dispatch(buf._id, token, x, idx, w, rows)  # the other op's output types
    comm.synchronize()


def reference_combine_identity(x, idx, w, local):
    """reference_combine with identity experts."""
    out = torch.zeros_like(x)
    for t in range(idx.shape[0]):
        chosen = sorted((int(e), float(w[t, j])) for j, e in enumerate(idx[t]) if int(e) >= 0)
        total = None
        for r in sorted({e // local for e, _ in chosen}):
            acc = None
            for e, wt in chosen:
                if e // local == r:
                    p = torch.tensor(wt, dtype=torch.float32) * x[t].float()
                    acc = p if acc is None else acc + p
            part = acc.to(torch.bfloat16).float()
            total = part if total is None else total + part
        if total is not None:
            out[t] = total.to(torch.bfloat16)
    return out


def test_fp8_refuses_what_it_cannot_carry(comm):
    experts = experts_of(comm)
    with pytest.raises(devcomm.InvalidArgument, match="multiple of 128"):
        devcomm.moe.Buffer(comm, experts, TOP_K, 200, max_tokens=8, fp8="per_128")
    with pytest.raises(devcomm.InvalidArgument, match="multiple of 16"):
        devcomm.moe.Buffer(comm, experts, TOP_K, 200, max_tokens=8, fp8="per_row")
    with pytest.raises(devcomm.InvalidArgument, match="per_row"):
        devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=8, fp8="e5m2")
    with pytest.raises(devcomm.InvalidArgument, match="without fp8"):
        devcomm.moe.Buffer(comm, experts, TOP_K, HIDDEN, max_tokens=8, dequantise=True)
    comm.barrier()
