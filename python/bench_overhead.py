"""Host-side cost of one Python call of `all_to_all_single` against the Rust call of the same
operation in the same process (docs/PYTHON.md, "Overhead").

    devcomm launch -n 2 -- python3 python/bench_overhead.py
    (one GPU: scripts/shared-gpu.sh 2 python3 python/bench_overhead.py)

Three ways of making the same call, each timed on the host only, in batches of BATCH calls
followed by a synchronisation (so that the launch queue never fills and blocks the host):
the method (`comm.all_to_all_single`, what eager code calls), the custom op through torch's
dispatcher (`torch.ops.devcomm.all_to_all`, what compiled graphs call), and a loop of the Rust
`Comm::all_to_all_raw` inside the extension. Prints the median per call of each and the
differences; the target is at most 5 us more than Rust for the method.
"""

import json
import os
import statistics
import time

import torch

import devcomm
from devcomm import _ops

BATCH = 100
BATCHES = 30


def timed(comm, call):
    """Median host seconds per call over the batches (every rank makes the same calls)."""
    per_call = []
    for _ in range(BATCHES):
        comm.host_barrier()
        t0 = time.perf_counter()
        call()
        per_call.append((time.perf_counter() - t0) / BATCH)
        comm.synchronize()
    return statistics.median(per_call)


def main():
    comm = devcomm.init()
    elems = int(os.environ.get("BENCH_ELEMS", comm.world_size * 256))
    x = torch.randn(elems, device=comm.device)
    out = torch.empty_like(x)
    stream = torch.cuda.current_stream().cuda_stream

    def method():
        for _ in range(BATCH):
            comm.all_to_all_single(out, x)

    def op():
        for _ in range(BATCH):
            torch.ops.devcomm.all_to_all(comm._id, comm._token, out, x, 0, None, 0)

    def rust():
        comm._native.bench_all_to_all_rust(_ops.desc(out), _ops.desc(x), stream, BATCH)

    for f in (method, op, rust):  # warm-up: kernels compiled and loaded
        f()
    comm.synchronize()
    res = {name: timed(comm, f) * 1e6 for name, f in (("method", method), ("op", op), ("rust", rust))}
    res["method_minus_rust"] = res["method"] - res["rust"]
    res["op_minus_rust"] = res["op"] - res["rust"]
    line = ", ".join(f"{k} {v:.2f} us" for k, v in res.items())
    print(f"rank {comm.rank}: all_to_all_single of {elems * 4} bytes, host time per call: {line}")
    if comm.rank == 0 and os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_overhead.json"), "w") as f:
            json.dump({"elems": elems, "world_size": comm.world_size, "us_per_call": res}, f, indent=1)


if __name__ == "__main__":
    main()
