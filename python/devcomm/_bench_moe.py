"""`python -m devcomm.bench moe`: MoE dispatch + combine through `devcomm.moe.Buffer` against
the path a PyTorch user writes with torch.distributed on NCCL, side by side in the same
processes on the same tokens (docs/MOE.md, "Performance").

    torchrun --nproc-per-node 4 -m devcomm.bench moe --tokens 128,512,2048,8192 --json moe.json

DeepSeek-V3's shape by default: hidden 7168 bf16, top-8 of 256 experts, uniform routing.
Identity experts on both sides (the experts' compute is not timed). The NCCL path, whole: sort
the (token, expert) pairs by expert, count them per rank on the GPU, exchange the counts
(`all_to_all_single`) and read them on the host, gather one row per pair, exchange rows and
their expert ids, regroup what arrived by local expert (expert-major, as devcomm's output),
then back: undo the regroup, exchange back, weight and `index_add_` into the tokens. Both
sides are timed on the host clock (synchronised before and after; the NCCL path waits on the
host in the middle), median of `--iters`, the slowest rank's median. Each size is checked
once: every side's combined rows against the bf16 NCCL path's within bf16 rounding
(`index_add_` adds in no fixed order).

`--wire fp8` (with bf16, the default): e4m3 rows with a scale per 128 elements there, bf16
rows back. devcomm quantises in its dispatch (timed); the NCCL path gets rows quantised
beforehand (the user's quantisation kernel, not timed), exchanges codes and scales, and
regroups both. The experts (dequantisation, not timed) are computed once. Checked within
e4m3's quantisation error (6e-2 of the norm).

Where PyTorch's NVSHMEM backend loads, a third side runs PyTorch's own device-side MoE
exchange: `torch.ops.symm_mem.all_to_all_vdev_2d` (rows to experts, expert-major, counts on
the GPU) and `all_to_all_vdev_2d_offset` (back), on symmetric-memory buffers allocated once
for the largest token count, then the same weighting and `index_add_` as the NCCL path
(`--no-vdev2d` leaves it out). Where it does not load, every row says why (`vdev2d_error`).
"""

import argparse
import datetime
import json
import os
import time

from ._bench_report import median

HIDDEN, EXPERTS, TOP_K = 7168, 256, 8


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m devcomm.bench moe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="128,512,2048,8192", help="tokens per rank, comma list")
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--experts", type=int, default=EXPERTS)
    ap.add_argument("--top-k", type=int, default=TOP_K)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--wire", default="bf16,fp8", help="rows on the wire, comma list: bf16, fp8 (e4m3, per-128 scales)")
    ap.add_argument("--no-vdev2d", action="store_true", help="leave out PyTorch's all_to_all_vdev_2d")
    ap.add_argument("--json", help="write the results here (rank 0)")
    a = ap.parse_args(argv)
    a.token_list = [int(t) for t in a.tokens.split(",") if t]
    a.wires = [w for w in a.wire.split(",") if w]
    if any(w not in ("bf16", "fp8") for w in a.wires):
        ap.error(f"--wire {a.wire}: bf16 and fp8 only")
    return a


def routing(torch, a, tokens, rank, device):
    g = torch.Generator(device=device).manual_seed(1000 * tokens + rank)
    idx = torch.rand((tokens, a.experts), generator=g, device=device).topk(a.top_k, dim=1).indices
    w = torch.rand((tokens, a.top_k), generator=g, device=device)
    x = (torch.randn((tokens, a.hidden), generator=g, device=device) / 4).to(torch.bfloat16)
    return x, idx.to(torch.int64), w.to(torch.float32)


def sorted_pairs(torch, dist, a, idx):
    """The user's first steps: the (token, expert) pairs sorted by expert, counted per rank on
    the GPU, the counts exchanged and read on the host. Returns the order of the pairs, their
    tokens and experts, and the rows sent to and received from each rank."""
    world = dist.get_world_size()
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // a.top_k
    expert = flat[order]
    dest = expert // (a.experts // world)
    send_counts = torch.zeros(world, dtype=torch.int64, device=idx.device).scatter_add_(0, dest, torch.ones_like(dest))
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    splits = torch.cat([send_counts, recv_counts]).tolist()  # the host waits here
    return order, token, expert, splits[:world], splits[world:]


def nccl_path(torch, dist, a, x, idx, w):
    """What a PyTorch user writes with torch.distributed (module docstring); returns [T, H]."""
    order, token, expert, ins, outs = sorted_pairs(torch, dist, a, idx)
    send = x[token]
    recv = torch.empty((sum(outs), a.hidden), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(recv, send, outs, ins)
    recv_expert = torch.empty(sum(outs), dtype=torch.int64, device=x.device)
    dist.all_to_all_single(recv_expert, expert, outs, ins)
    regroup = torch.argsort(recv_expert, stable=True)
    grouped = recv[regroup]  # expert-major: the experts would run here
    y = torch.empty_like(grouped)
    y[regroup] = grouped  # back in arrival order
    back = torch.empty_like(send)
    dist.all_to_all_single(back, y, ins, outs)
    out = torch.zeros_like(x, dtype=torch.float32)
    out.index_add_(0, token, back.float() * w.reshape(-1)[order][:, None])
    return out.to(x.dtype)


def quantise_128(torch, x):
    """e4m3 codes [T, H] and f32 scales [T, H / 128] of x, a scale per 128 elements (amax / 448:
    what the user's quantisation kernel gives the NCCL path; devcomm quantises in its dispatch)."""
    t, h = x.shape
    blocks = x.float().reshape(t, h // 128, 128)
    scale = (blocks.abs().amax(-1) / 448.0).clamp_min(1e-12)
    return (blocks / scale[..., None]).to(torch.float8_e4m3fn).reshape(t, h), scale


def dequantise_128(torch, q, scale):
    t, h = q.shape
    return (q.float().reshape(t, h // 128, 128) * scale[..., None]).reshape(t, h).to(torch.bfloat16)


def nccl_path_fp8(torch, dist, a, q, scale, idx, w, cache):
    """`nccl_path` with e4m3 rows and their scales there and bf16 rows back. The experts (not
    timed) are dequantisation, computed on the first call and kept in `cache`."""
    order, token, expert, ins, outs = sorted_pairs(torch, dist, a, idx)
    n = sum(outs)
    recv_q = torch.empty((n, a.hidden), dtype=torch.uint8, device=q.device)
    dist.all_to_all_single(recv_q, q.view(torch.uint8)[token], outs, ins)
    recv_s = torch.empty((n, scale.shape[1]), dtype=torch.float32, device=q.device)
    dist.all_to_all_single(recv_s, scale[token], outs, ins)
    recv_expert = torch.empty(n, dtype=torch.int64, device=q.device)
    dist.all_to_all_single(recv_expert, expert, outs, ins)
    regroup = torch.argsort(recv_expert, stable=True)
    grouped_q, grouped_s = recv_q[regroup], recv_s[regroup]  # expert-major
    if "y" not in cache:
        cache["y"] = dequantise_128(torch, grouped_q.view(torch.float8_e4m3fn), grouped_s)
    y = torch.empty_like(cache["y"])
    y[regroup] = cache["y"]
    back = torch.empty((token.numel(), a.hidden), dtype=torch.bfloat16, device=q.device)
    dist.all_to_all_single(back, y, ins, outs)
    out = torch.zeros((q.shape[0], a.hidden), dtype=torch.float32, device=q.device)
    out.index_add_(0, token, back.float() * w.reshape(-1)[order][:, None])
    return out.to(torch.bfloat16)


class Vdev2d:
    """PyTorch's NVSHMEM all-to-all-v with the expert-major shuffle (module docstring), on
    buffers for up to `max_tokens` tokens per rank (the worst case: every pair to one rank)."""

    def __init__(self, torch, dist, a, max_tokens, device):
        import torch.distributed._symmetric_memory as symm_mem

        if not symm_mem.is_nvshmem_available():
            raise RuntimeError("PyTorch's NVSHMEM backend is not available in this build")
        # The NVSHMEM heap holds every buffer below; it is sized before NVSHMEM starts.
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", "12G")
        symm_mem.set_backend("NVSHMEM")
        self.group = dist.group.WORLD.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before 2.9, a no-op since
            symm_mem.enable_symm_mem_for_group(self.group)
        world = dist.get_world_size()
        pairs, h, bf16, i64 = max_tokens * a.top_k, a.hidden, torch.bfloat16, torch.int64
        self.inp = symm_mem.empty((pairs, h), dtype=bf16, device=device)
        self.out = symm_mem.empty((pairs * world + a.experts, h), dtype=bf16, device=device)
        self.back = symm_mem.empty((pairs, h), dtype=bf16, device=device)
        self.in_splits = symm_mem.empty(a.experts, dtype=i64, device=device)
        self.out_so = symm_mem.empty((2, a.experts), dtype=i64, device=device)
        self.back_so = symm_mem.empty((2, a.experts), dtype=i64, device=device)
        for t in (self.inp, self.out, self.back):
            symm_mem.rendezvous(t, self.group)
        for t in (self.in_splits, self.out_so, self.back_so):
            symm_mem.rendezvous(t, self.group)
        dist.barrier()

    def step(self, torch, a, x, idx, w):
        """Dispatch, identity experts, combine: returns [T, H] as `nccl_path` does."""
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // a.top_k
        expert = flat[order]
        n = token.numel()
        # Splits per global expert: rank-major, as the 2-D exchange wants them.
        self.in_splits.copy_(torch.bincount(expert, minlength=a.experts))
        torch.index_select(x, 0, token, out=self.inp[:n])
        ops = torch.ops.symm_mem
        ops.all_to_all_vdev_2d(self.inp, self.out, self.in_splits, self.out_so, self.group, major_align=1)
        # The experts would run on `out` here (expert-major); identity experts send it back.
        ops.all_to_all_vdev_2d_offset(self.out, self.back, self.out_so, self.back_so, self.group)
        out = torch.zeros_like(x, dtype=torch.float32)
        out.index_add_(0, token, self.back[:n].float() * w.reshape(-1)[order][:, None])
        return out.to(x.dtype)


def open_vdev2d(torch, dist, a, device):
    """A `Vdev2d` on every rank, or None and why on every rank (the ranks agree)."""
    if a.no_vdev2d:
        return None, "left out (--no-vdev2d)"
    v, why = None, None
    try:
        probe = Vdev2d(torch, dist, a, max(a.token_list), device)
        # A call with no rows: the op's own limits (experts per rank, say) raise here, on every
        # rank alike.
        probe.in_splits.zero_()
        torch.ops.symm_mem.all_to_all_vdev_2d(probe.inp, probe.out, probe.in_splits, probe.out_so, probe.group, major_align=1)
        torch.cuda.synchronize()
        v = probe
    except Exception as e:  # noqa: BLE001 - any failure to start the reference is reported
        why = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    ok = torch.tensor([0 if v is None else 1], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() == 0:
        return None, why or "failed on another rank"
    return v, None


def timed(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return median(samples)


def rel_err(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def point(torch, dist, devcomm, comm, a, wire, inputs, want, vdev, vdev_why):
    """One batch size and wire: both (or all three) sides checked against `want` (the bf16
    NCCL path's result) and timed; the record (every rank gets the slowest rank's times)."""
    x, idx, w = inputs
    tokens, world, dev = x.shape[0], comm.world_size, comm.device
    fp8 = wire == "fp8"
    buf = devcomm.moe.Buffer(comm, a.experts, a.top_k, a.hidden, max_tokens=tokens, align=1,
                             fp8="per_128" if fp8 else None)
    out_rows = buf.worst_case_rows()
    if fp8:
        q, scale = quantise_128(torch, x)
        cache = {}
        recv, _, _, handle = buf.dispatch(x, idx, w, out_rows=out_rows)
        y = dequantise_128(torch, *recv)  # the experts (not timed): dequantisation

        def devcomm_step():
            _, _, _, handle = buf.dispatch(x, idx, w, out_rows=out_rows)
            return buf.combine(y, handle)

        def nccl_step():
            return nccl_path_fp8(torch, dist, a, q, scale, idx, w, cache)
    else:
        def devcomm_step():
            recv_x, _, _, handle = buf.dispatch(x, idx, w, out_rows=out_rows)
            return buf.combine(recv_x, handle)

        def nccl_step():
            return nccl_path(torch, dist, a, x, idx, w)

    use_vdev = vdev is not None and not fp8
    errs = [rel_err(devcomm_step(), want), rel_err(nccl_step(), want)]
    buf.check()
    errs.append(rel_err(vdev.step(torch, a, x, idx, w), want) if use_vdev else 0.0)
    us = [timed(torch, devcomm_step, a.warmup, a.iters), timed(torch, nccl_step, a.warmup, a.iters)]
    us.append(timed(torch, lambda: vdev.step(torch, a, x, idx, w), a.warmup, a.iters) if use_vdev else 0.0)
    t = torch.tensor(us + errs, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    d_us, n_us, v_us, worst, n_worst, v_worst = t.tolist()
    # bf16: bf16 rounding (index_add_ adds in no fixed order); FP8: e4m3's quantisation error.
    tol = 6e-2 if fp8 else 2e-2
    ok = max(worst, n_worst, v_worst) < tol
    row = {
        "op": "moe", "tokens": tokens, "world_size": world, "hidden": a.hidden, "experts": a.experts,
        "top_k": a.top_k, "dtype": "e4m3 there (per-128 scales), bf16 back" if fp8 else "bf16",
        "devcomm_us": d_us, "torch_nccl_us": n_us, "ratio": n_us / d_us,
        "relative_error": worst, "nccl_relative_error": n_worst, "checked": ok,
        "device": torch.cuda.get_device_name(dev), "date": datetime.date.today().isoformat(),
    }
    if use_vdev:
        row.update(vdev2d_us=v_us, ratio_vdev2d=v_us / d_us, vdev2d_relative_error=v_worst)
    else:
        row.update(vdev2d_error="bf16 rows only here" if fp8 and vdev else vdev_why)
    if comm.rank == 0:
        v_txt = f"  all_to_all_vdev_2d {v_us:9.1f} us  ratio {v_us / d_us:5.2f}" if use_vdev else ""
        print(f"moe {wire:4s} {tokens:6d} tokens/rank  devcomm {d_us:9.1f} us  torch.distributed+NCCL {n_us:9.1f} us  "
              f"ratio {n_us / d_us:5.2f}{v_txt}  rel. error {max(worst, n_worst, v_worst):.1e} {'ok' if ok else 'WRONG'}",
              flush=True)
    del buf
    return row


def main(argv=None):
    import torch
    import torch.distributed as dist

    import devcomm
    import devcomm.moe

    a = parse(argv)
    if not dist.is_initialized():
        dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))))
    comm = devcomm.init()
    rank, world, dev = comm.rank, comm.world_size, comm.device
    vdev, vdev_why = open_vdev2d(torch, dist, a, dev)
    if rank == 0 and vdev is None:
        print(f"all_to_all_vdev_2d: not measured: {vdev_why}", flush=True)
    rows = []
    for tokens in a.token_list:
        x, idx, w = routing(torch, a, tokens, rank, dev)
        want = nccl_path(torch, dist, a, x, idx, w)
        for wire in a.wires:
            rows.append(point(torch, dist, devcomm, comm, a, wire, (x, idx, w), want, vdev, vdev_why))
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.barrier()
    return 0 if all(r["checked"] for r in rows) else 1
