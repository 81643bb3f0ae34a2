"""All-reduce through PyTorch's NCCL backend, with and without libdevcomm_nccl.so, on ordinary
tensors and on an NCCL window (`ncclMemAlloc` memory registered with `ncclCommWindowRegister`,
which NCCL serves with its symmetric kernels and devcomm adopts into its memory pool).

    torchrun --nproc-per-node N scripts/nccl_shim_bench.py run --out DIR/plain
    LD_PRELOAD=$PWD/dist/libdevcomm_nccl.so DEVCOMM_NCCL_FALLBACK_LIB=<real libnccl.so.2> \\
        torchrun --nproc-per-node N scripts/nccl_shim_bench.py run --out DIR/shim
    python3 scripts/nccl_shim_bench.py compare DIR/plain DIR/shim

bf16 sum, in place. Each size: CALLS all-reduces captured in a CUDA graph, replayed REPLAYS
times, and CALLS eager calls timed REPLAYS times, with CUDA events; the median per call of
the slowest rank. Rank 0 writes DIR/result.json.
"""

import json
import os
import statistics
import sys

SIZES = [8, 1 << 10, 8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
CALLS, REPLAYS, WARMUP = 10, 30, 3


def run(out):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from nccl_shim_torch import Window

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    shim = "libdevcomm_nccl" in open("/proc/self/maps").read()
    warm = torch.ones(1, device=dev)
    dist.all_reduce(warm)  # the communicator exists before the window
    win = Window(max(SIZES))
    ordinary = torch.zeros(max(SIZES), dtype=torch.uint8, device=dev)

    def timed(fn):
        for _ in range(WARMUP):
            fn()
        times = []
        for _ in range(REPLAYS):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / CALLS)
        t = torch.tensor([statistics.median(times)], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    rows = []
    for nbytes in SIZES:
        for kind, buf in (("ordinary", ordinary[:nbytes].view(torch.bfloat16)), ("window", win.tensor(torch.bfloat16, nbytes // 2))):
            buf.fill_(1.0 / 64)

            def calls():
                for _ in range(CALLS):
                    dist.all_reduce(buf)

            eager = timed(calls)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                calls()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                calls()
            graph = timed(g.replay)
            del g
            rows.append({"bytes": nbytes, "buffer": kind, "eager_us": eager, "graph_us": graph})
            if rank == 0:
                print(f"{nbytes:>10} {kind:>8}: eager {eager:8.1f} us, graph {graph:8.1f} us", flush=True)
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"world": world, "shim_loaded": shim, "rows": rows}, f, indent=1)
    dist.barrier()
    win.close()
    dist.destroy_process_group()


def compare(plain_dir, shim_dir):
    plain = json.load(open(os.path.join(plain_dir, "result.json")))
    shim = json.load(open(os.path.join(shim_dir, "result.json")))
    if plain["shim_loaded"] or not shim["shim_loaded"]:
        print("FAIL: the plain run loaded the shim, or the shim run did not")
        return 1
    print(f"{plain['world']} ranks, all-reduce bf16 sum in place through torch.distributed; us per call "
          "(slowest rank's median); ratio = NCCL / shim")
    print("| bytes | buffer | NCCL eager | shim eager | ratio | NCCL graph | shim graph | ratio |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for p, s in zip(plain["rows"], shim["rows"]):
        print(f"| {p['bytes']} | {p['buffer']} | {p['eager_us']:.1f} | {s['eager_us']:.1f} | "
              f"{p['eager_us'] / s['eager_us']:.2f} | {p['graph_us']:.1f} | {s['graph_us']:.1f} | "
              f"{p['graph_us'] / s['graph_us']:.2f} |")
    return 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "run" and len(sys.argv) == 4 and sys.argv[2] == "--out":
        run(sys.argv[3])
    elif cmd == "compare" and len(sys.argv) == 4:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
