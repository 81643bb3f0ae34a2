"""The libraries `python -m devcomm.bench` times, behind one interface (docs/PYTHON.md,
"Benchmarks"): each gets a `Point` (one collective, element type and size, with the
benchmark's own buffers) and enqueues one call on set `i` of its buffers.

Imported by `devcomm.bench` after the environment guard, never by devcomm itself.
"""

import os

import torch
import torch.distributed as dist

from ._bench_report import PINNED_PER_COMM, PINNED_PROCESS

ALIGN_BYTES = 256


class Skip(Exception):
    """A library (or one mode or size of it) that cannot run here, with the reason."""


class Point:
    """One size of one run: `op`, `dtype` (torch), `count` (the call's element count, as
    `_bench_report.point`), `sets` rotation sets, and the plain buffers every library without
    memory of its own uses: `plain[i] = (inp, out)` (the same tensor twice for all-reduce,
    which is in place)."""

    def __init__(self, op, dtype, count, world, sets, device):
        self.op, self.dtype, self.count, self.world, self.sets, self.device = op, dtype, count, world, sets, device
        self.n_in = count * world if op == "reduce_scatter" else count
        self.n_out = count * world if op == "all_gather" else count
        self.plain = self.carve(torch.empty(self.slab_elems(), dtype=dtype, device=device))

    def piece(self, n):
        align = ALIGN_BYTES // self.dtype.itemsize
        return -(-n // align) * align

    def slab_elems(self):
        out = 0 if self.op == "all_reduce" else self.piece(self.n_out)
        return self.sets * (self.piece(self.n_in) + out)

    def carve(self, slab):
        """Rotation sets as views of one allocation (one registration or rendezvous per size),
        each buffer aligned to ALIGN_BYTES."""
        sets, at = [], 0
        for _ in range(self.sets):
            inp = slab[at : at + self.n_in]
            at += self.piece(self.n_in)
            if self.op == "all_reduce":
                out = inp
            else:
                out = slab[at : at + self.n_out]
                at += self.piece(self.n_out)
            sets.append((inp, out))
        return sets


class Library:
    """A library: `name`, `label`, and per size `prepare(point, fill)` (its buffers, filled by
    `fill(tensor)` with this rank's data), `call(i)` (one call on set i), `result(i)` (the
    output of set i's last call) and `release()`."""

    name = label = ""
    uses_plain = True

    def prepare(self, p, fill):
        self.p = p
        self.bufs = p.plain
        for inp, _ in self.bufs:
            fill(inp)

    def result(self, i):
        return self.bufs[i][1]

    def release(self):
        self.bufs = None


class Devcomm(Library):
    name, label = "devcomm", "devcomm, ordinary tensors (torch's caching allocator)"

    def __init__(self, comm):
        self.comm = comm

    def call(self, i):
        inp, out = self.bufs[i]
        if self.p.op == "all_reduce":
            self.comm.all_reduce(inp, "sum")
        elif self.p.op == "reduce_scatter":
            self.comm.reduce_scatter_tensor(out, inp, "sum")
        else:
            self.comm.all_gather_into_tensor(out, inp)


class DevcommRegistered(Devcomm):
    """devcomm on registered memory, from the best interface the package has: `comm.empty`
    or `comm.mem_pool()` with `torch.cuda.use_mem_pool` where they exist, else
    `comm.alloc_registered`."""

    name = "devcomm_registered"
    uses_plain = False

    def __init__(self, comm):
        super().__init__(comm)
        self.pool = None
        if hasattr(comm, "empty"):
            self.how = "comm.empty"
        elif hasattr(comm, "mem_pool") and hasattr(torch.cuda, "use_mem_pool"):
            self.how = "comm.mem_pool with torch.cuda.use_mem_pool"
        else:
            self.how = "comm.alloc_registered"
        self.label = f"devcomm, registered memory ({self.how})"

    def _alloc(self, numel, dtype):
        if self.how == "comm.empty":
            import devcomm

            try:
                return self.comm.empty((numel,), dtype=dtype), None
            except devcomm.PoolExhausted:
                # Every rank allocates the same sizes in the same order, so every rank runs out
                # here alike: grow the pool (collective) by what this slab needs, and retry.
                nbytes = numel * torch.empty((), dtype=dtype).element_size()
                self.comm.grow_pool(max(nbytes, 64 << 20))
                return self.comm.empty((numel,), dtype=dtype), None
        if self.how.startswith("comm.mem_pool"):
            if self.pool is None:
                self.pool = self.comm.mem_pool()
            with torch.cuda.use_mem_pool(self.pool):
                return torch.empty(numel, dtype=dtype, device=self.comm.device), None
        reg = self.comm.alloc_registered((numel,), dtype)
        return reg.tensor, reg

    def prepare(self, p, fill):
        self.p = p
        slab, self.reg = self._alloc(p.slab_elems(), p.dtype)
        self.bufs = p.carve(slab)
        for inp, _ in self.bufs:
            fill(inp)

    def release(self):
        self.bufs = None
        if self.reg is not None:  # collective: every rank releases in the same order
            self.reg.deregister()
            self.reg = None


class Nccl(Library):
    """torch.distributed on an NCCL process group of its own."""

    def __init__(self, name, label, group):
        self.name, self.label, self.group = name, label, group

    def call(self, i):
        inp, out = self.bufs[i]
        if self.p.op == "all_reduce":
            dist.all_reduce(inp, op=dist.ReduceOp.SUM, group=self.group)
        elif self.p.op == "reduce_scatter":
            dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM, group=self.group)
        else:
            dist.all_gather_into_tensor(out, inp, group=self.group)


def nccl_groups(process_pinned, device):
    """(default group, pinned group, how the pinned one was made, or why there is none): new
    NCCL groups, each
    warmed by one all-reduce so that its communicator exists (torch creates it lazily, at the
    first call). The default one first: its creation is the process's first read of NCCL's
    cached parameters, which must see them unset (in-process mode)."""

    def warm(g):
        t = torch.ones(64, device=device)
        dist.all_reduce(t, group=g)
        torch.cuda.synchronize(device)
        return g

    if process_pinned:
        how = "every NCCL communicator of this process pinned (--nccl-pinned-process): " + _env_text(PINNED_PROCESS)
        return None, warm(dist.new_group(backend="nccl")), how
    default = warm(dist.new_group(backend="nccl"))
    try:
        opts = dist.ProcessGroupNCCL.Options()
        opts.config.min_ctas = 1
        opts.config.max_ctas = 1
    except (AttributeError, RuntimeError) as e:
        return default, None, f"no ProcessGroupNCCL.Options().config.min_ctas/max_ctas here ({e}): run again with --nccl-pinned-process"
    saved = {k: os.environ.get(k) for k in PINNED_PER_COMM}
    os.environ.update(PINNED_PER_COMM)
    try:
        pinned = warm(dist.new_group(backend="nccl", pg_options=opts))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    how = f"{_env_text(PINNED_PER_COMM)} set while its communicator was created; one channel by ncclConfig_t minCTAs = maxCTAs = 1"
    return default, pinned, how


def _env_text(env):
    return " ".join(f"{k}={v}" for k, v in env.items())


class SymmMem(Library):
    """PyTorch's symmetric memory (CUDA backend, multicast off): buffers from `symm_mem.empty`
    after `rendezvous`, and the `torch.ops.symm_mem` op of `variant`."""

    uses_plain = False

    def __init__(self, variant, op, group):
        self.symm = _symm_mem()
        self.ops = torch.ops.symm_mem
        self.group_name = group.group_name
        self.variant = variant
        self.name = f"symm_mem_{variant}"
        names = {
            ("one_shot", "all_reduce"): ("one_shot_all_reduce_out", "one_shot_all_reduce"),
            ("two_shot", "all_reduce"): ("two_shot_all_reduce_",),
            ("two_shot", "reduce_scatter"): ("reduce_scatter_out",),
            ("low_contention", "reduce_scatter"): ("_low_contention_reduce_scatter",),
            ("low_contention", "all_gather"): ("_low_contention_all_gather",),
        }.get((variant, op))
        if names is None:
            why = {"all_gather": "its only other all-gather, multimem_all_gather_out, needs multicast, which stays off"}
            raise Skip(f"torch.ops.symm_mem has no {variant} {op}" + (f" ({why[op]})" if op in why else ""))
        found = [n for n in names if _has_op(self.ops, n)]
        if not found:
            raise Skip(f"torch {torch.__version__} has no torch.ops.symm_mem.{' or '.join(names)}")
        self.op_name = found[0]
        self.fn = getattr(self.ops, self.op_name)
        self.label = f"PyTorch symmetric memory, torch.ops.symm_mem.{self.op_name}"
        self.outs = {}

    def prepare(self, p, fill):
        self.p = p
        slab = self.symm.empty(p.slab_elems(), dtype=p.dtype, device=p.device)
        self.handle = self.symm.rendezvous(slab, self.group_name)
        self.slab = slab
        self.bufs = p.carve(slab)
        self.outs = {}
        for i, (inp, _) in enumerate(self.bufs):
            fill(inp)
            if self.op_name == "one_shot_all_reduce_out":
                # It reads the symmetric input and writes an ordinary output: made here, so that
                # no allocation lands in a timed sample or a captured graph; poisoned, so that
                # the check sees every element written.
                self.outs[i] = torch.full_like(inp, float("nan"))

    def call(self, i):
        inp, out = self.bufs[i]
        g, n = self.group_name, self.op_name
        if n == "one_shot_all_reduce_out":
            self.fn(inp, "sum", g, self.outs[i])
        elif n == "one_shot_all_reduce":
            self.outs[i] = self.fn(inp, "sum", g)
        elif n == "two_shot_all_reduce_":
            self.fn(inp, "sum", g)
        elif n == "reduce_scatter_out":
            self.fn(inp, g, False, out)
        elif n == "_low_contention_reduce_scatter":
            self.outs[i] = self.fn(inp, "sum", g)
        else:  # _low_contention_all_gather
            self.outs[i] = self.fn(inp, g)

    def result(self, i):
        if self.op_name in ("two_shot_all_reduce_", "reduce_scatter_out"):
            return self.bufs[i][1]
        return self.outs[i]

    def release(self):
        self.bufs = self.slab = self.handle = None
        self.outs = {}


def _has_op(ns, name):
    try:
        getattr(ns, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def _symm_mem():
    try:
        import torch.distributed._symmetric_memory as symm
    except ImportError as e:
        raise Skip(f"torch {torch.__version__} has no torch.distributed._symmetric_memory ({e})") from e
    if not hasattr(symm, "empty") or not hasattr(symm, "rendezvous"):
        raise Skip(f"torch {torch.__version__}: symm_mem.empty / symm_mem.rendezvous missing")
    set_backend = getattr(symm, "set_backend", None)
    if set_backend is not None:
        try:
            set_backend("CUDA")  # the peer-access backend; NVSHMEM is another library
        except RuntimeError:
            pass  # already chosen for this process: the backend in use is reported
    return symm


def symm_backend(device):
    try:
        import torch.distributed._symmetric_memory as symm

        return symm.get_backend(device) if hasattr(symm, "get_backend") else "CUDA (default)"
    except Exception as e:  # reporting only
        return f"unknown ({e})"
