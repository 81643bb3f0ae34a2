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
once: devcomm's combined rows against the NCCL path's within bf16 rounding (`index_add_`
adds in no fixed order).
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
    ap.add_argument("--json", help="write the results here (rank 0)")
    a = ap.parse_args(argv)
    a.token_list = [int(t) for t in a.tokens.split(",") if t]
    return a


def routing(torch, a, tokens, rank, device):
    g = torch.Generator(device=device).manual_seed(1000 * tokens + rank)
    idx = torch.rand((tokens, a.experts), generator=g, device=device).topk(a.top_k, dim=1).indices
    w = torch.rand((tokens, a.top_k), generator=g, device=device)
    x = (torch.randn((tokens, a.hidden), generator=g, device=device) / 4).to(torch.bfloat16)
    return x, idx.to(torch.int64), w.to(torch.float32)


def nccl_path(torch, dist, a, x, idx, w):
    """What a PyTorch user writes with torch.distributed (module docstring); returns [T, H]."""
    world = dist.get_world_size()
    per_rank = a.experts // world
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // a.top_k
    expert = flat[order]
    dest = expert // per_rank
    send_counts = torch.zeros(world, dtype=torch.int64, device=x.device).scatter_add_(0, dest, torch.ones_like(dest))
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    splits = torch.cat([send_counts, recv_counts]).tolist()  # the host waits here
    ins, outs = splits[:world], splits[world:]
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
    rows = []
    for tokens in a.token_list:
        x, idx, w = routing(torch, a, tokens, rank, dev)
        buf = devcomm.moe.Buffer(comm, a.experts, a.top_k, a.hidden, max_tokens=tokens, align=1)
        out_rows = buf.worst_case_rows()

        def devcomm_step():
            recv_x, _, _, handle = buf.dispatch(x, idx, w, out_rows=out_rows)
            return buf.combine(recv_x, handle)

        got, want = devcomm_step(), nccl_path(torch, dist, a, x, idx, w)
        buf.check()
        err = ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()
        us = [timed(torch, devcomm_step, a.warmup, a.iters), timed(torch, lambda: nccl_path(torch, dist, a, x, idx, w), a.warmup, a.iters)]
        t = torch.tensor(us + [err], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        d_us, n_us, worst = t.tolist()
        ok = worst < 2e-2
        rows.append({
            "op": "moe", "tokens": tokens, "world_size": world, "hidden": a.hidden, "experts": a.experts,
            "top_k": a.top_k, "dtype": "bf16", "devcomm_us": d_us, "torch_nccl_us": n_us, "ratio": n_us / d_us,
            "relative_error": worst, "checked": ok, "device": torch.cuda.get_device_name(dev),
            "date": datetime.date.today().isoformat(),
        })
        if rank == 0:
            print(f"moe {tokens:6d} tokens/rank  devcomm {d_us:9.1f} us  torch.distributed+NCCL {n_us:9.1f} us  "
                  f"ratio {n_us / d_us:5.2f}  rel. error {worst:.1e} {'ok' if ok else 'WRONG'}", flush=True)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.barrier()
    return 0 if all(r["checked"] for r in rows) else 1
