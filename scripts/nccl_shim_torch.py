"""PyTorch's NCCL backend on libdevcomm_nccl.so against the real NCCL, bitwise.

Run once under the shim and once plain, then compare (docs/NCCL.md, "Checking it"):

    torchrun --nproc-per-node N scripts/nccl_shim_torch.py run --out DIR/plain
    LD_PRELOAD=$PWD/dist/libdevcomm_nccl.so DEVCOMM_NCCL_FALLBACK_LIB=<real libnccl.so.2> \\
        torchrun --nproc-per-node N scripts/nccl_shim_torch.py run --out DIR/shim
    python3 scripts/nccl_shim_torch.py compare DIR/plain DIR/shim
    python3 scripts/nccl_shim_torch.py linkage   # does libtorch_cuda link libnccl.so.2?

Inputs are small integers (exact in every type), so sums are exact whatever the order of
the reduction and the results must match bit for bit. The last section repeats the
reductions on an NCCL window (`ncclMemAlloc` memory registered with
`ncclCommWindowRegister`), which devcomm adopts into its memory pool. Each rank saves its results to
DIR/rank<R>.pt; `run` also records whether libdevcomm_nccl.so is mapped into the process.
"""

import os
import subprocess
import sys


def linkage():
    """Whether libtorch_cuda.so loads libnccl.so.2 through the dynamic linker (then
    LD_PRELOAD's symbols win) and which file it resolves to."""
    import torch

    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    needed = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout
    ldd = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    nccl = [line.strip() for line in ldd.splitlines() if "nccl" in line]
    dynamic = "libnccl.so" in needed
    print(f"{lib}: NEEDED libnccl.so.2: {dynamic}; resolves to: {nccl or 'nothing'}")
    return 0 if dynamic else 1


NCCL_WIN_COLL_SYMMETRIC = 0x01


def nccl_lib():
    """The process's NCCL entry points: the preloaded shim's when it is mapped (the global
    scope finds its symbols first), else the real library PyTorch loaded."""
    import ctypes

    lib = ctypes.CDLL(None)
    if not hasattr(lib, "ncclCommWindowRegister"):
        import nvidia.nccl

        lib = ctypes.CDLL(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))
    lib.ncclCommWindowRegister.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int]
    lib.ncclCommWindowDeregister.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib


class Window:
    """`nbytes` of NCCL memory (`ncclMemAlloc`, through PyTorch's NCCL memory pool) registered
    as a symmetric NCCL window on the default group's communicator, as vLLM and PyTorch's
    NCCL symmetric memory do. `tensor(dtype, n, offset)` is a view of it."""

    def __init__(self, nbytes):
        import ctypes
        import torch
        import torch.distributed as dist

        dev = torch.device("cuda", torch.cuda.current_device())
        backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
        self.pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(self.pool):
            self.buf = torch.zeros(nbytes, dtype=torch.uint8, device=dev)
        torch.cuda.synchronize()
        self.lib, self.comm, self.win = nccl_lib(), ctypes.c_void_p(backend._comm_ptr()), ctypes.c_void_p()
        r = self.lib.ncclCommWindowRegister(self.comm, self.buf.data_ptr(), nbytes, ctypes.byref(self.win), NCCL_WIN_COLL_SYMMETRIC)
        if r != 0:
            raise RuntimeError(f"ncclCommWindowRegister: NCCL result {r}")

    def tensor(self, dtype, n, offset=0):
        import torch

        es = torch.empty(0, dtype=dtype).element_size()
        return self.buf[offset : offset + n * es].view(dtype)

    def close(self):
        import torch

        torch.cuda.synchronize()
        r = self.lib.ncclCommWindowDeregister(self.comm, self.win)
        if r != 0:
            raise RuntimeError(f"ncclCommWindowDeregister: NCCL result {r}")


def run(out):
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    maps = open("/proc/self/maps").read()
    res = {"shim_loaded": torch.tensor(int("libdevcomm_nccl" in maps))}

    def data(n, dtype, salt):
        x = (torch.arange(n, device=dev) * 7 + rank * 13 + salt) % 23 - 11
        return x.to(dtype)

    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.uint8, torch.float64]
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}
    for dt in dtypes:
        for n in [1, 1000, 1 << 20]:
            for name, op in ops.items():
                x = data(n, dt, 1).abs() % 3 if name == "prod" else data(n, dt, 1)
                if dt == torch.uint8:
                    x = x.abs()
                dist.all_reduce(x, op=op)
                res[f"all_reduce/{dt}/{n}/{name}"] = x.cpu()
            x = data(n * world, dt, 2)
            y = torch.empty(n, dtype=dt, device=dev)
            dist.reduce_scatter_tensor(y, x if dt != torch.uint8 else x.abs())
            res[f"reduce_scatter/{dt}/{n}"] = y.cpu()
            x = data(n, dt, 3)
            y = torch.empty(n * world, dtype=dt, device=dev)
            dist.all_gather_into_tensor(y, x)
            res[f"all_gather/{dt}/{n}"] = y.cpu()
            x = data(n * world, dt, 4)
            y = torch.empty_like(x)
            dist.all_to_all_single(y, x)
            res[f"all_to_all/{dt}/{n}"] = y.cpu()
            x = data(n, dt, 5)
            dist.broadcast(x, src=world - 1)
            res[f"broadcast/{dt}/{n}"] = x.cpu()
    for n in [1, 4096, 1 << 22]:
        x = data(n, torch.float32, 6)
        y = torch.empty_like(x)
        peer_to, peer_from = (rank + 1) % world, (rank - 1) % world
        # One batch: unbatched isend/irecv on two ranks would queue each rank's recv behind its
        # own send on one stream, and large sends wait for their recv (a deadlock with NCCL).
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer_to), dist.P2POp(dist.irecv, y, peer_from)])
        for r in reqs:
            r.wait()
        res[f"send_recv/{n}"] = y.cpu()
    dist.barrier()
    def graph_twice(x, salt):
        """`x` (filled from `salt`) all-reduced by a CUDA graph replayed twice, after a warm-up
        call outside the capture."""
        x.copy_(data(x.numel(), x.dtype, salt))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(s)
        x.copy_(data(x.numel(), x.dtype, salt))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(x)
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        return x.cpu()

    res["graph_all_reduce"] = graph_twice(torch.empty(1 << 16, device=dev), 7)
    # Window buffers (ncclMemAlloc + ncclCommWindowRegister): under the shim devcomm adopts them
    # into its memory pool and takes its zero-copy paths.
    n_max = 1 << 20
    win = Window(2 * world * n_max * 4)
    for dt in [torch.float32, torch.bfloat16]:
        for n in [1000, n_max]:
            x = win.tensor(dt, n)
            x.copy_(data(n, dt, 8))
            dist.all_reduce(x)
            res[f"window/all_reduce/{dt}/{n}"] = x.cpu()
            x = win.tensor(dt, n * world)
            x.copy_(data(n * world, dt, 9))
            y = win.tensor(dt, n, offset=world * n_max * 4)
            dist.reduce_scatter_tensor(y, x)
            res[f"window/reduce_scatter/{dt}/{n}"] = y.cpu()
            x = win.tensor(dt, n, offset=world * n_max * 4)
            x.copy_(data(n, dt, 10))
            y = win.tensor(dt, n * world)
            dist.all_gather_into_tensor(y, x)
            res[f"window/all_gather/{dt}/{n}"] = y.cpu()
    res["window/graph_all_reduce"] = graph_twice(win.tensor(torch.float32, 1 << 16), 11)
    dist.barrier()
    win.close()
    os.makedirs(out, exist_ok=True)
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {len(res)} results, libdevcomm_nccl mapped: {bool(res['shim_loaded'])}")


def compare(a, b):
    import torch

    bad = compared = 0
    ranks = sorted(f for f in os.listdir(a) if f.endswith(".pt"))
    if not ranks:
        print(f"no results in {a}")
        return 1
    for f in ranks:
        ra, rb = torch.load(os.path.join(a, f)), torch.load(os.path.join(b, f))
        print(f"{f}: shim mapped in {a}: {bool(ra['shim_loaded'])}, in {b}: {bool(rb['shim_loaded'])}")
        for k in sorted(ra):
            if k == "shim_loaded":
                continue
            compared += 1
            x, y = ra[k], rb.get(k)
            same = y is not None and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(torch.uint8), y.view(torch.uint8))
            if not same:
                bad += 1
                print(f"  DIFFERS: {k}")
    print(f"{bad} of {compared} result(s) differ ({sum(k.startswith('window/') for k in ra)} of a rank's on window buffers)")
    return 1 if bad else 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "run" and len(sys.argv) == 4 and sys.argv[2] == "--out":
        run(sys.argv[3])
    elif cmd == "compare" and len(sys.argv) == 4:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    elif cmd == "linkage":
        sys.exit(linkage())
    else:
        sys.exit(__doc__)
