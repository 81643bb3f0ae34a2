"""The communicator's memory pool for torch (docs/PYTHON.md, "The memory pool"): symmetric
segments mapped into every NVLink peer, which tensors are allocated into through a
`torch.cuda.MemPool` (`with torch.cuda.use_mem_pool(comm.mem_pool()):`) or `comm.empty`, and
which the registered (zero-copy) operations recognise by address."""

import torch

from . import _native, _ops


def mem_pool(comm):
    """The `torch.cuda.MemPool` of `comm`'s pool (made once per communicator): torch's
    caching allocator takes its segments from the pool through a pluggable allocator of this
    package's native library."""
    pool = getattr(comm, "_mem_pool", None)
    if pool is None:
        _native.pool_attach(comm._native)
        allocator = torch.cuda.memory.CUDAPluggableAllocator(_native.__file__, "devcomm_pool_malloc", "devcomm_pool_free")
        pool = torch.cuda.MemPool(allocator.allocator())
        comm._mem_pool = pool
    return pool


def empty(comm, shape, dtype):
    """A contiguous tensor of `shape` and `dtype` taken from `comm`'s pool directly."""
    shape = [int(shape)] if isinstance(shape, int) else [int(s) for s in shape]
    name = _ops._DTYPES.get(dtype) or str(dtype)
    _, capsule = _native.pool_empty(comm._native, shape, name)
    return torch.from_dlpack(capsule)


def lookup(comm, t):
    """`(segment, offset, segment_base, segment_bytes, device_handle)` of the pool segment that
    holds all of tensor `t`'s bytes, or None."""
    return _native.pool_lookup(comm._native, t.data_ptr(), t.numel() * t.element_size())
