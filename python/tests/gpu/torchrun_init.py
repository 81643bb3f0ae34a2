"""devcomm.init() under torchrun and beside torch.distributed (docs/PYTHON.md, "Starting ranks").
Not a pytest file: every rank is this script started by torchrun (scripts/gpu-check.sh step
torchrun@N), e.g.

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 python/tests/gpu/torchrun_init.py plain

Modes:
  plain  devcomm.init() with torch.distributed not initialised (torchrun's agent store), twice
         in one process: two communicators side by side
  pg     torch.distributed.init_process_group first (nccl with a GPU per rank, else gloo), then
         devcomm.init() on the default group and devcomm.init(group=...) on a new group of all
         ranks

Each communicator runs an all-reduce checked against a host computation, synchronises and is
released. Prints a PASS line per check; exits non-zero on any failure.
"""

import gc
import os
import sys

import torch
import torch.distributed as dist

import devcomm

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL_RANK = int(os.environ["LOCAL_RANK"])


def check_all_reduce(comm, what, n=4099):
    """All-reduce of rank-dependent values, against the sum computed on the host."""
    # Every group here holds all ranks in order: group rank = global rank.
    if (comm.rank, comm.world_size) != (RANK, WORLD):
        raise AssertionError(f"{what}: comm is rank {comm.rank} of {comm.world_size}, expected {RANK} of {WORLD}")
    base = torch.arange(n, dtype=torch.float32)
    t = (base * (comm.rank + 1)).to(comm.device)
    comm.all_reduce(t)
    comm.synchronize()
    want = base * sum(r + 1 for r in range(comm.world_size))
    got = t.cpu()
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[0].item()
        raise AssertionError(f"{what}: element {bad} is {got[bad].item()}, expected {want[bad].item()}")
    comm.host_barrier()
    print(f"PASS rank {RANK}: {what} ({comm})", flush=True)


def plain():
    if dist.is_initialized():
        raise AssertionError("plain mode runs without torch.distributed")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        print(f"note rank {RANK}: TORCHELASTIC_USE_AGENT_STORE is not True here", flush=True)
    first = devcomm.init()
    check_all_reduce(first, "torchrun, devcomm.init()")
    second = devcomm.init()
    check_all_reduce(second, "torchrun, a second communicator")
    check_all_reduce(first, "torchrun, the first communicator again")
    del first, second
    gc.collect()


def pg():
    gpus = torch.cuda.device_count()
    # NCCL refuses two ranks on one GPU; ranks sharing GPUs (scripts/shared-gpu.sh) use gloo.
    backend = "nccl" if gpus >= WORLD else "gloo"
    torch.cuda.set_device(LOCAL_RANK % gpus)
    dist.init_process_group(backend)
    print(f"note rank {RANK}: torch.distributed on {backend}, {gpus} GPU(s)", flush=True)
    comm = devcomm.init()
    check_all_reduce(comm, f"init_process_group({backend!r}), then devcomm.init()")
    if backend == "nccl":
        # The same reduction through torch's NCCL, as a second reference.
        t = (torch.arange(64, dtype=torch.float32) * (RANK + 1)).to(comm.device)
        ref = t.clone()
        comm.all_reduce(t)
        dist.all_reduce(ref)
        torch.cuda.synchronize()
        if not torch.equal(t, ref):
            raise AssertionError("devcomm's all-reduce differs from NCCL's")
        print(f"PASS rank {RANK}: all-reduce equals NCCL's", flush=True)
    group = dist.new_group(list(range(WORLD)))
    sub = devcomm.init(group=group)
    check_all_reduce(sub, "devcomm.init(group=new_group(all ranks))")
    check_all_reduce(comm, "the default group's communicator beside it")
    del comm, sub
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    modes = {"plain": plain, "pg": pg}
    if mode not in modes:
        print(f"unknown mode {mode!r}; one of {', '.join(modes)}", file=sys.stderr)
        return 2
    modes[mode]()
    print(f"PASS rank {RANK}: mode {mode}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
