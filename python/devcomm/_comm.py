"""`devcomm.Comm`: the communicator with torch.distributed-style methods (docs/PYTHON.md).

Every method enqueues on torch's current stream and returns without synchronising the host.
In eager mode a method calls its op's implementation directly (no dispatcher on the way);
while torch.compile traces, it calls `torch.ops.devcomm.*`, so the op lands in the graph.
"""

import os

import torch

from . import _native, _ops, _pool, _rendezvous
from ._ops import hooks_id
from ._registration import Registration

_REDUCE_OPS = ("sum", "avg", "max", "min")


# torch.compile recognises this function itself (an alias is the same object).
_compiling = torch.compiler.is_compiling


def _reduce_op(op):
    """'sum', 'avg', 'max', 'min', or a torch.distributed.ReduceOp of those (devcomm has no
    product)."""
    name = op if isinstance(op, str) else str(op).rsplit(".", 1)[-1]
    name = name.lower()
    if name not in _REDUCE_OPS:
        raise _native.InvalidArgument(f"reduce: invalid argument: op {op!r}; use one of {', '.join(_REDUCE_OPS)}")
    return name


class Comm:
    """A devcomm communicator (one per process, one GPU per process). Make it with
    `devcomm.init()`."""

    def __init__(self, native):
        self._native = native
        self._id = _ops.register_comm(native)
        # Plain attributes (not the native object's properties) so that torch.compile can read
        # them while tracing.
        self.rank = native.rank
        self.world_size = native.world_size
        self.local_rank = native.local_rank
        self.device = torch.device("cuda", native.device)
        self._token = torch.zeros(1, dtype=torch.int8, device=self.device)
        self._ordinal = native.device

    @classmethod
    def _from_env(cls, device=None, group=None):
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        joined = _rendezvous.join(group, os.environ, initialized)
        if joined is None:
            native = _native.Comm.from_env(device)
        else:
            store, local = joined
            if device is None and local is None:
                # A subgroup, or a process group started without a launcher: the GPU this
                # process gave torch.
                device = torch.cuda.current_device()
            native = _native.Comm.from_store(store, device)
        torch.cuda.set_device(native.device)
        return cls(native)

    def __repr__(self):
        return f"devcomm.Comm(rank={self.rank}, world_size={self.world_size}, device={self.device})"

    # --- helpers ------------------------------------------------------------------------

    def _user(self, user):
        """User arguments for hooks: None, a CUDA tensor (passed by address), or numbers (put
        into a new float32 tensor, or int64 when all are ints, by a kernel: no host copy)."""
        if user is None or isinstance(user, torch.Tensor):
            return user
        values = list(user) if isinstance(user, (list, tuple)) else [user]
        if not values or not all(isinstance(v, (int, float, bool)) for v in values):
            raise _native.InvalidArgument("hooks: invalid argument: user must be a CUDA tensor, a number or a list of numbers")
        dtype = torch.int64 if all(isinstance(v, (int, bool)) for v in values) else torch.float32
        return torch.stack([torch.full((), v, dtype=dtype, device=self.device) for v in values])

    @staticmethod
    def _rows(t):
        """Elements per index of dimension 0."""
        return t.numel() // t.shape[0] if t.dim() > 0 and t.shape[0] > 0 else max(t.numel(), 1)

    def _counts(self, splits, what):
        if isinstance(splits, torch.Tensor):
            return splits
        splits = [int(s) for s in splits]
        if len(splits) != self.world_size or any(s < 0 for s in splits):
            raise _native.InvalidArgument(
                f"all_to_all_single: invalid argument: {what} {splits} must be {self.world_size} counts >= 0"
            )
        # A host list becomes a device tensor: a host-to-device copy (not capturable in a CUDA
        # graph; pass splits as a CUDA tensor there).
        return torch.tensor(splits, dtype=torch.int64, device=self.device)

    # --- all-to-all ---------------------------------------------------------------------

    def all_to_all_single(self, out, inp, out_splits=None, in_splits=None, *, hooks=None, user=None):
        """torch.distributed.all_to_all_single: with no splits, `inp`'s dimension 0 is cut in
        world_size equal chunks, chunk p going to rank p, and `out` receives rank p's chunk at
        chunk p. `in_splits` (rows of dimension 0 for each rank) may be a CUDA int64 tensor that
        stays on the GPU (no host synchronisation; graph-capturable) or a list (copied to the
        GPU); data from rank p lands packed in rank order. `out_splits`, when given, must equal
        what the peers send (checked on the GPU for a tensor, by total on the host for a list).
        `hooks` / `user`: user hooks fused into the transfer and their arguments.

        Without splits and hooks, an `out` that lies inside a registration (`register`,
        `alloc_registered`) takes the registered route, `Comm::all_to_all_registered`: every
        rank's `out` must then lie at the same offset of the same registration."""
        if in_splits is None and out_splits is None:
            world = self.world_size
            if inp.dim() == 0 or inp.shape[0] % world != 0:
                raise _native.InvalidArgument(
                    f"all_to_all_single: invalid argument: inp's dimension 0 ({tuple(inp.shape)}) is not a multiple of world size {world}"
                )
            if hooks is None and user is None:  # the common case, kept short (docs/PYTHON.md, "Overhead")
                args = (self._id, self._token, out, inp, 0, None, 0)
            else:
                row_len = 0 if hooks is None or inp.dim() == 1 else self._rows(inp)
                args = (self._id, self._token, out, inp, hooks_id(hooks), self._user(user), row_len)
            if _compiling():
                torch.ops.devcomm.all_to_all(*args)
            else:
                _ops.all_to_all(*args)
            return None
        if in_splits is None:
            raise _native.InvalidArgument("all_to_all_single: invalid argument: out_splits without in_splits")
        if isinstance(out_splits, (list, tuple)) and inp.dim() > 0:
            if sum(out_splits) != out.shape[0]:
                raise _native.InvalidArgument(
                    f"all_to_all_single: invalid argument: out_splits sum to {sum(out_splits)} rows, out has {out.shape[0]}"
                )
        if isinstance(in_splits, (list, tuple)) and inp.dim() > 0 and sum(in_splits) != inp.shape[0]:
            raise _native.InvalidArgument(
                f"all_to_all_single: invalid argument: in_splits sum to {sum(in_splits)} rows, inp has {inp.shape[0]}"
            )
        counts, _ = self.all_to_all_v(out, inp, in_splits, hooks=hooks, user=user)
        if out_splits is not None:
            want = self._counts(out_splits, "out_splits")
            torch._assert_async(
                (counts == want).all(),
                "devcomm all_to_all_single: the rows received differ from out_splits",
            )
        return None

    def all_to_all_v(self, out, inp, in_splits, in_offsets=None, *, hooks=None, user=None):
        """All-to-all-v with counts on the GPU. `in_splits[p]` rows (of dimension 0) go to rank
        p, taken from row `in_offsets[p]` (or packed in rank order); `out` is a buffer of
        enough rows for everything received. Returns `(recv_counts, recv_offsets)`, int64 CUDA
        tensors of world_size entries written by the kernel (rows from each rank, packed in
        rank order). Counts that overrun a buffer raise `devcomm.CountOverflow` at the next
        check (nothing is written out of bounds)."""
        counts = self._counts(in_splits, "in_splits")
        offsets = None if in_offsets is None else self._counts(in_offsets, "in_offsets")
        row_len = self._rows(inp)
        args = (self._id, self._token, out, inp, counts, offsets, row_len, hooks_id(hooks), self._user(user))
        if _compiling():
            return torch.ops.devcomm.all_to_all_v(*args)
        return _ops.all_to_all_v(*args)

    # --- point to point -----------------------------------------------------------------

    def send(self, t, peer):
        """Sends `t` to `peer`, which posts a `recv` of the same size. A send and a recv with
        the same peer in opposite directions must be one `sendrecv`."""
        (torch.ops.devcomm.send if _compiling() else _ops.send)(self._id, self._token, t, peer)

    def recv(self, t, peer):
        """Receives from `peer` into `t`."""
        (torch.ops.devcomm.recv if _compiling() else _ops.recv)(self._id, self._token, t, peer)

    def sendrecv(self, send, send_peer, recv, recv_peer):
        """Sends `send` to `send_peer` and receives `recv` from `recv_peer` in one kernel."""
        (torch.ops.devcomm.sendrecv if _compiling() else _ops.sendrecv)(self._id, self._token, send, send_peer, recv, recv_peer)

    def barrier(self):
        """A barrier on the GPU, in stream order: work after it on any rank starts once every
        rank's work before it has finished. The host does not wait."""
        (torch.ops.devcomm.barrier if _compiling() else _ops.barrier)(self._id, self._token)

    # --- reductions ---------------------------------------------------------------------

    def all_reduce(self, t, op="sum"):
        """In-place all-reduce (reduced in rank order: identical on every rank)."""
        (torch.ops.devcomm.all_reduce if _compiling() else _ops.all_reduce)(self._id, self._token, t, _reduce_op(op))

    def reduce_scatter_tensor(self, out, inp, op="sum"):
        """`out` gets this rank's shard of the reduction of every rank's `inp`."""
        f = torch.ops.devcomm.reduce_scatter_tensor if _compiling() else _ops.reduce_scatter_tensor
        f(self._id, self._token, out, inp, _reduce_op(op))

    def all_gather_into_tensor(self, out, inp):
        """`out` gets every rank's `inp`, in rank order."""
        f = torch.ops.devcomm.all_gather_into_tensor if _compiling() else _ops.all_gather_into_tensor
        f(self._id, self._token, out, inp)

    # --- registered buffers (zero-copy) ---------------------------------------------------

    def _describe(self, t):
        # Anything but a torch tensor goes to the native layer as it is (DLPack,
        # __cuda_array_interface__), which reads or refuses it.
        return _ops.desc(t) if isinstance(t, torch.Tensor) else t

    def _deregister(self, rid):
        _native.deregister(self._native, rid)

    def register(self, tensor):
        """Collective: registers `tensor` (contiguous, on this rank's device, in
        `cudaMalloc`/`cuMemAlloc` memory, which torch's default caching allocator gives, or in
        fd-exportable VMM memory) so that peers write straight into it, and returns a
        `devcomm.Registration`. The registration holds the tensor (so its memory stays
        allocated) until `deregister()` or the communicator's end. A tensor inside a larger
        cached block registers its own bytes; peers map the whole block. Synchronises the
        device (a setup step: not inside a CUDA graph capture). A rank that refuses its tensor
        makes every rank raise `devcomm.InvalidArgument`."""
        rid, ptr, nbytes = _native.register(self._native, self._describe(tensor), tensor, _ops._stream(self._native))
        return Registration(self, rid, ptr, nbytes, tensor)

    def alloc_registered(self, shape, dtype=torch.float32):
        """Collective: allocates a contiguous tensor of `shape` and `dtype` with `cuMemAlloc`
        (its own allocation, not torch's cache), registers it and returns the
        `devcomm.Registration`; `.tensor` is the memory as a torch tensor (through DLPack).
        The memory is freed when the registration is released and the tensor (with every
        view of it) is gone, whichever comes last; the free waits for the device."""
        shape = [int(shape)] if isinstance(shape, int) else [int(s) for s in shape]
        name = _ops._DTYPES.get(dtype) or str(dtype)
        rid, ptr, nbytes, capsule = _native.alloc_registered(self._native, shape, name)
        return Registration(self, rid, ptr, nbytes, torch.from_dlpack(capsule))

    @staticmethod
    def _offset(op, offset):
        offset = int(offset)
        if offset < 0:
            raise _native.InvalidArgument(f"{op}: invalid argument: offset {offset} < 0")
        return offset

    def send_registered(self, t, peer, registration, offset=0):
        """Zero-copy send: `t`'s bytes go straight into `peer`'s buffer of `registration`,
        `offset` bytes in (a multiple of `t`'s element size). `peer` posts the matching
        `recv_registered` (or `sendrecv_registered`) with a tensor at that offset of its buffer
        of the same registration, of the same size; a mismatch writes nothing and raises
        `devcomm.Error` (zero-copy mismatch) at the next check. A range past the peer's
        registered size is refused before anything runs. `registration` may also be a tensor
        of the memory pool: `t` then lands in `peer`'s pool memory at that tensor's address
        plus `offset` (symmetric when the ranks allocated in the same order)."""
        if isinstance(registration, torch.Tensor):
            # A tensor of the memory pool: the peer's pool memory at the same address.
            offset = self._offset("send_registered", offset)
            dst = registration.data_ptr() + offset
            return _native.pool_send(self._native, self._describe(t), peer, dst, _ops._stream(self._native))
        rid = Registration._check(registration, "send_registered", self)
        offset = self._offset("send_registered", offset)
        f = torch.ops.devcomm.send_registered if _compiling() else _ops.send_registered
        f(self._id, self._token, t, peer, rid, offset)

    # --- the memory pool -----------------------------------------------------------------

    def grow_pool(self, nbytes):
        """Collective: adds a segment of at least `nbytes` (rounded up to the allocation
        granularity) to the communicator's memory pool; returns its index. Every rank calls
        it with the same size. `DEVCOMM_POOL_MIB` grows a first segment at `init()`."""
        return _native.pool_grow(self._native, int(nbytes))

    def mem_pool(self):
        """The `torch.cuda.MemPool` of the communicator's memory pool: tensors allocated
        inside `with torch.cuda.use_mem_pool(comm.mem_pool()):` live in memory every NVLink
        peer has mapped. Allocating is local; torch's caching allocator takes whole segments
        from the pool (2 MiB for small tensors, 20 MiB up to 10 MiB, else the size rounded to
        2 MiB), so the pool must hold those. An exhausted pool makes torch raise its
        out-of-memory error; devcomm's reason (the pool's segments, free bytes and the request)
        is printed and kept in `pool_last_error()`."""
        return _pool.mem_pool(self)

    def empty(self, shape, dtype=torch.float32):
        """A contiguous tensor of `shape` and `dtype` from the memory pool (local, not
        collective; uninitialised). `devcomm.PoolExhausted` when the pool has no room. Tensors
        that all ranks allocate in the same order lie at the same pool offset (symmetric)."""
        return _pool.empty(self, shape, dtype)

    def pool_usage(self):
        """The pool's `segments` (their sizes), `free` bytes, `largest_free` range and live
        `allocations`, as a dict."""
        return _native.pool_usage(self._native)

    def pool_lookup(self, t):
        """Where tensor `t` lies in the memory pool: `(segment, offset, segment_base,
        segment_bytes, device_handle)`, or None when it is not pool memory."""
        return _pool.lookup(self, t)

    def pool_last_error(self):
        """The last error of the pool's torch allocator on this device (None if none)."""
        return _native.pool_last_error(self._ordinal)

    def recv_registered(self, t, peer, registration=None):
        """Zero-copy receive: `peer` writes `t`'s size straight into `t`, which must lie
        inside `registration` (or, when None, inside some registration of this rank, the
        oldest that holds it, or inside the memory pool)."""
        rid = 0 if registration is None else Registration._check(registration, "recv_registered", self)
        f = torch.ops.devcomm.recv_registered if _compiling() else _ops.recv_registered
        f(self._id, self._token, t, peer, rid)

    def sendrecv_registered(self, send, send_peer, registration, offset, recv, recv_peer, recv_registration=None):
        """Both in one kernel (rings, exchanges): `send` into `send_peer`'s buffer of
        `registration` at `offset` bytes, and `recv` (inside `recv_registration`, or found)
        from `recv_peer`."""
        rid = Registration._check(registration, "sendrecv_registered", self)
        offset = self._offset("sendrecv_registered", offset)
        recv_rid = 0 if recv_registration is None else Registration._check(recv_registration, "sendrecv_registered", self)
        f = torch.ops.devcomm.sendrecv_registered if _compiling() else _ops.sendrecv_registered
        f(self._id, self._token, send, send_peer, rid, offset, recv, recv_peer, recv_rid)

    # --- state --------------------------------------------------------------------------

    def synchronize(self):
        """Waits for torch's current stream, then raises the first device error of this
        communicator (e.g. `devcomm.PeerTimeout`, naming the peer)."""
        self._native.synchronize(torch.cuda.current_stream(self.device).cuda_stream)

    def check(self):
        """Raises the first device error recorded so far, without waiting."""
        self._native.check()

    def abort(self):
        """Makes every in-flight device wait of this communicator return."""
        self._native.abort()

    def host_barrier(self):
        """A barrier of the processes through the store (no GPU work)."""
        self._native.host_barrier()

    # --- tracing (docs/TRACING.md) ------------------------------------------------------

    def trace_events(self):
        """This rank's trace since the last read (a dict: host calls, device events, clock
        offset), after synchronising the device; None unless DEVCOMM_TRACE=1."""
        import json

        text = self._native.trace_events()
        return None if text is None else json.loads(text)

    def write_trace(self, path, link_gbps=None):
        """Collective: every rank's trace merged at rank 0 into one Chrome / Perfetto trace
        file `path`. Rank 0 returns the per-operation summary (text), the others None."""
        return self._native.write_trace(os.fspath(path), link_gbps)


# Under torch.profiler each eager call is a range named devcomm::<op> (torch's own ops appear
# under their names; devcomm's eager path skips the dispatcher). The check is one C call when
# no profiler runs; while torch.compile traces, the op itself lands in the graph instead.
_profiler_enabled = torch.autograd._profiler_enabled


def _profiled(name, method):
    def call(self, *args, **kwargs):
        if not _compiling() and _profiler_enabled():
            with torch.profiler.record_function("devcomm::" + name):
                return method(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    call.__name__, call.__qualname__, call.__doc__ = method.__name__, method.__qualname__, method.__doc__
    call.__wrapped__ = method
    return call


for _name in (
    "all_to_all_single", "all_to_all_v", "send", "recv", "sendrecv", "barrier", "all_reduce",
    "reduce_scatter_tensor", "all_gather_into_tensor", "send_registered", "recv_registered",
    "sendrecv_registered",
):
    setattr(Comm, _name, _profiled(_name, getattr(Comm, _name)))
