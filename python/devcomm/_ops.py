"""The `torch.ops.devcomm.*` custom ops: each takes a communicator id (an int, so that the op
has a torch schema), runs its native operation on torch's current stream and never
synchronises the host; each has a fake implementation and declares the tensors it writes, so
that CUDA graph capture, `torch.compile(fullgraph=True)` and `torch.library.opcheck` work.

Every op takes the communicator's one-element `token` tensor and declares it written (no op
writes it): the ops then depend on each other in program order, so torch.compile neither
reorders them (the peers' calls must match in order) nor drops one that writes nothing else
(`send`, `barrier`), and the token, a tensor the compiled graph receives as an input, keeps
even an op whose other outputs are unused.

Tensors reach the native layer as descriptions `(ptr, dtype, shape, strides, device)` that it
checks itself (dtype, device, contiguity, sizes) before anything runs.
"""

import itertools
import weakref
from typing import Optional, Tuple

import torch

from . import _native

_COMMS = {}  # id -> devcomm._native.Comm
_HOOKS = {}  # id -> devcomm._native.Hooks (0: the copy hooks)

_DTYPES = {
    torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
    torch.int32: "int32", torch.int64: "int64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64",
    torch.complex64: "complex64", torch.complex128: "complex128",
}
for _name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _name

try:
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - older torch

    def _raw_stream(device):
        return torch.cuda.current_stream(device).cuda_stream


def desc(t):
    """The native layer's description of a tensor: (ptr, dtype, shape, strides, device)."""
    return (t.data_ptr(), _DTYPES.get(t.dtype) or str(t.dtype)[6:], t.shape, t.stride(), t.get_device())


def register_comm(native):
    cid = len(_COMMS) + 1
    _COMMS[cid] = native
    return cid


def hooks_id(hooks):
    """The id of a `devcomm.Hooks` (0 for None: the copy hooks)."""
    if hooks is None:
        return 0
    if hooks._id is None:
        hooks._id = len(_HOOKS) + 1
        _HOOKS[hooks._id] = hooks._native
    return hooks._id


def _comm(cid):
    try:
        return _COMMS[cid]
    except KeyError:
        raise _native.InvalidArgument(f"devcomm: invalid argument: no communicator {cid}") from None


def _stream(c):
    return _raw_stream(c.device)


def _user(user):
    return 0 if user is None else user.data_ptr()


# --- all-to-all ---------------------------------------------------------------------------


def all_to_all(comm: int, token: torch.Tensor, dst: torch.Tensor, src: torch.Tensor, hooks: int, user: Optional[torch.Tensor], row_len: int) -> None:
    """All-to-all of equal chunks (`Comm.all_to_all_single` without splits)."""
    c = _comm(comm)
    c.all_to_all(desc(dst), desc(src), _stream(c), _HOOKS.get(hooks), _user(user), row_len)


def _fake_all_to_all(comm, token, dst, src, hooks, user, row_len):
    return None


def all_to_all_v(
    comm: int,
    token: torch.Tensor,
    dst: torch.Tensor,
    src: torch.Tensor,
    send_counts: torch.Tensor,
    send_offsets: Optional[torch.Tensor],
    row_len: int,
    hooks: int,
    user: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor]:
    """All-to-all-v with counts on the GPU; returns (recv_counts, recv_offsets), int64 CUDA
    tensors of world size entries written by the kernel."""
    c = _comm(comm)
    world = c.world_size
    recv_counts = torch.empty(world, dtype=torch.int64, device=dst.device)
    recv_offsets = torch.empty(world, dtype=torch.int64, device=dst.device)
    s = _stream(c)
    c.all_to_all_v(
        desc(dst),
        desc(src),
        desc(send_counts),
        None if send_offsets is None else desc(send_offsets),
        desc(recv_counts),
        desc(recv_offsets),
        s,
        row_len,
        _HOOKS.get(hooks),
        _user(user),
    )
    return recv_counts, recv_offsets


def _fake_all_to_all_v(comm, token, dst, src, send_counts, send_offsets, row_len, hooks, user):
    world = send_counts.shape[0]
    return (
        dst.new_empty((world,), dtype=torch.int64),
        dst.new_empty((world,), dtype=torch.int64),
    )


# --- send / recv --------------------------------------------------------------------------


def send(comm: int, token: torch.Tensor, t: torch.Tensor, peer: int) -> None:
    c = _comm(comm)
    c.send(desc(t), peer, _stream(c))


def _fake_send(comm, token, t, peer):
    return None


def recv(comm: int, token: torch.Tensor, t: torch.Tensor, peer: int) -> None:
    c = _comm(comm)
    c.recv(desc(t), peer, _stream(c))


def _fake_recv(comm, token, t, peer):
    return None


def sendrecv(comm: int, token: torch.Tensor, send: torch.Tensor, send_peer: int, recv: torch.Tensor, recv_peer: int) -> None:
    c = _comm(comm)
    c.sendrecv(desc(send), send_peer, desc(recv), recv_peer, _stream(c))


def _fake_sendrecv(comm, token, send, send_peer, recv, recv_peer):
    return None


def barrier(comm: int, token: torch.Tensor) -> None:
    c = _comm(comm)
    c.barrier(_stream(c))


def _fake_barrier(comm, token):
    return None


# --- reductions ---------------------------------------------------------------------------


def all_reduce(comm: int, token: torch.Tensor, t: torch.Tensor, op: str) -> None:
    c = _comm(comm)
    c.all_reduce(desc(t), op, _stream(c))


def _fake_all_reduce(comm, token, t, op):
    return None


def reduce_scatter_tensor(comm: int, token: torch.Tensor, dst: torch.Tensor, src: torch.Tensor, op: str) -> None:
    c = _comm(comm)
    c.reduce_scatter(desc(dst), desc(src), op, _stream(c))


def _fake_reduce_scatter_tensor(comm, token, dst, src, op):
    return None


def all_gather_into_tensor(comm: int, token: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> None:
    c = _comm(comm)
    c.all_gather(desc(dst), desc(src), _stream(c))


def _fake_all_gather_into_tensor(comm, token, dst, src):
    return None


# --- registered buffers (zero-copy) -------------------------------------------------------
# `reg` is a `devcomm.Registration`'s id; 0 for a receive: the registration that holds the
# tensor (the oldest, when several do).


def send_registered(comm: int, token: torch.Tensor, t: torch.Tensor, peer: int, reg: int, offset: int) -> None:
    """`t`'s bytes straight into `peer`'s buffer of registration `reg`, `offset` bytes in."""
    c = _comm(comm)
    _native.send_registered(c, desc(t), peer, reg, offset, _stream(c))


def _fake_send_registered(comm, token, t, peer, reg, offset):
    return None


def recv_registered(comm: int, token: torch.Tensor, t: torch.Tensor, peer: int, reg: int) -> None:
    """`t`'s bytes from `peer`, written by the peer straight into `t` (inside a registration)."""
    c = _comm(comm)
    _native.recv_registered(c, desc(t), peer, reg or None, _stream(c))


def _fake_recv_registered(comm, token, t, peer, reg):
    return None


def sendrecv_registered(
    comm: int,
    token: torch.Tensor,
    send: torch.Tensor,
    send_peer: int,
    reg: int,
    offset: int,
    recv: torch.Tensor,
    recv_peer: int,
    recv_reg: int,
) -> None:
    c = _comm(comm)
    _native.sendrecv_registered(c, desc(send), send_peer, reg, offset, desc(recv), recv_peer, recv_reg or None, _stream(c))


def _fake_sendrecv_registered(comm, token, send, send_peer, reg, offset, recv, recv_peer, recv_reg):
    return None


# --- MoE dispatch and combine (devcomm.moe.Buffer, docs/MOE.md) ---------------------------
# `buffer` is a Buffer's id (`register_moe`): the layer's configuration (rows, dtype, local
# experts) and its native object. Ids are never reused, and the table holds its Buffers weakly
# (a Buffer owns scratch of about four times max_tokens x world_size x hidden elements).
# The op implementations allocate their outputs; the fakes give the same shapes, all fixed by
# the Buffer's configuration and the op's int arguments (out_rows, tokens).

_MOES = weakref.WeakValueDictionary()  # id -> devcomm.moe.Buffer
_moe_ids = itertools.count(1)


def register_moe(buffer):
    mid = next(_moe_ids)
    _MOES[mid] = buffer
    return mid


def _moe(mid, fp8_out=None):
    """The Buffer of id `mid`; with `fp8_out` given, one whose dispatch returns FP8 (True) or
    not (False), as the op asked for its output types."""
    b = _MOES.get(mid)
    if b is None:
        raise _native.InvalidArgument(f"moe: invalid argument: no MoE buffer {mid} (released?)")
    if fp8_out is not None and b.fp8_out != fp8_out:
        op = "moe_dispatch_fp8" if b.fp8_out else "moe_dispatch"
        raise _native.InvalidArgument(f"moe: invalid argument: MoE buffer {mid} is dispatched with {op}")
    return b


def moe_dispatch_run(b, x, topk_idx, topk_weights, rows):
    """`Buffer.dispatch`'s work, eager or as the op: new `(recv_x, recv_weights,
    tokens_per_expert, recv_scales)` with `rows` expert-major rows; `recv_x` float8_e4m3fn and
    `recv_scales` float32 `[rows, scales_per_row]` when the Buffer returns FP8, else `recv_x`
    of its dtype and `recv_scales` None."""
    dev = x.device
    if b.fp8_out:
        recv_x = torch.empty((rows, b.hidden), dtype=torch.float8_e4m3fn, device=dev)
        recv_s = torch.empty((rows, b.scales_per_row), dtype=torch.float32, device=dev)
    else:
        recv_x = torch.empty((rows, b.hidden), dtype=b.dtype, device=dev)
        recv_s = None
    recv_w = torch.empty((rows,), dtype=torch.float32, device=dev)
    counts = torch.empty((b.local_experts,), dtype=torch.int64, device=dev)
    x, topk_idx, topk_weights = x.contiguous(), topk_idx.contiguous(), topk_weights.contiguous()
    s = _raw_stream(b._comm._ordinal)
    scales = None if recv_s is None else desc(recv_s)
    b._native.dispatch(desc(x), desc(topk_idx), desc(topk_weights), desc(recv_x), desc(recv_w), desc(counts), s, scales)
    return recv_x, recv_w, counts, recv_s


def moe_combine_run(b, y, out):
    """`Buffer.combine`'s work, eager or as the op: `y` of the last dispatch into `out`."""
    b._native.combine(desc(y.contiguous()), desc(out), _raw_stream(b._comm._ordinal))


def moe_dispatch(
    buffer: int,
    token: torch.Tensor,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    out_rows: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(recv_x [out_rows, hidden], recv_weights float32 [out_rows], tokens_per_expert int64
    [local_experts])` on `x`'s device."""
    return moe_dispatch_run(_moe(buffer, False), x, topk_idx, topk_weights, out_rows)[:3]


def _fake_moe_dispatch(buffer, token, x, topk_idx, topk_weights, out_rows):
    b = _moe(buffer, False)
    return (
        x.new_empty((out_rows, b.hidden), dtype=b.dtype),
        x.new_empty((out_rows,), dtype=torch.float32),
        x.new_empty((b.local_experts,), dtype=torch.int64),
    )


def moe_dispatch_fp8(
    buffer: int,
    token: torch.Tensor,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    out_rows: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Buffer that returns FP8: `(recv_x float8_e4m3fn [out_rows, hidden], recv_scales
    float32 [out_rows, scales_per_row], recv_weights float32 [out_rows], tokens_per_expert
    int64 [local_experts])` on `x`'s device."""
    recv_x, recv_w, counts, recv_s = moe_dispatch_run(_moe(buffer, True), x, topk_idx, topk_weights, out_rows)
    return recv_x, recv_s, recv_w, counts


def _fake_moe_dispatch_fp8(buffer, token, x, topk_idx, topk_weights, out_rows):
    b = _moe(buffer, True)
    return (
        x.new_empty((out_rows, b.hidden), dtype=torch.float8_e4m3fn),
        x.new_empty((out_rows, b.scales_per_row), dtype=torch.float32),
        x.new_empty((out_rows,), dtype=torch.float32),
        x.new_empty((b.local_experts,), dtype=torch.int64),
    )


# `tokens_per_expert` is the dispatch's output: the combine kernels read it (the native layer
# keeps its address from the dispatch), so the op takes it to keep it alive and unchanged until
# the combine has run (a compiled graph would otherwise free or reuse its memory earlier).


def moe_combine(buffer: int, token: torch.Tensor, y: torch.Tensor, tokens_per_expert: torch.Tensor, tokens: int) -> torch.Tensor:
    """A new `[tokens, hidden]` output on `y`'s device."""
    b = _moe(buffer)
    out = torch.empty((tokens, b.hidden), dtype=b.dtype, device=y.device)
    moe_combine_run(b, y, out)
    return out


def _fake_moe_combine(buffer, token, y, tokens_per_expert, tokens):
    b = _moe(buffer)
    return y.new_empty((tokens, b.hidden), dtype=b.dtype)


def moe_combine_out(buffer: int, token: torch.Tensor, y: torch.Tensor, tokens_per_expert: torch.Tensor, out: torch.Tensor) -> None:
    """Into the caller's `out` (`[tokens, hidden]`, contiguous)."""
    moe_combine_run(_moe(buffer), y, out)


def _fake_moe_combine_out(buffer, token, y, tokens_per_expert, out):
    return None


# --- registration ---------------------------------------------------------------------
# The functions above are the implementations; each becomes `torch.ops.devcomm.NAME` with its
# fake. `Comm` calls an implementation directly in eager mode (no dispatcher on the way) and
# the op while torch.compile traces.

torch.library.custom_op("devcomm::all_to_all", all_to_all, mutates_args=("token", "dst")).register_fake(_fake_all_to_all)
torch.library.custom_op("devcomm::all_to_all_v", all_to_all_v, mutates_args=("token", "dst")).register_fake(_fake_all_to_all_v)
torch.library.custom_op("devcomm::send", send, mutates_args=("token",)).register_fake(_fake_send)
torch.library.custom_op("devcomm::recv", recv, mutates_args=("token", "t")).register_fake(_fake_recv)
torch.library.custom_op("devcomm::sendrecv", sendrecv, mutates_args=("token", "recv")).register_fake(_fake_sendrecv)
torch.library.custom_op("devcomm::barrier", barrier, mutates_args=("token",)).register_fake(_fake_barrier)
torch.library.custom_op("devcomm::all_reduce", all_reduce, mutates_args=("token", "t")).register_fake(_fake_all_reduce)
torch.library.custom_op("devcomm::reduce_scatter_tensor", reduce_scatter_tensor, mutates_args=("token", "dst")).register_fake(_fake_reduce_scatter_tensor)
torch.library.custom_op("devcomm::all_gather_into_tensor", all_gather_into_tensor, mutates_args=("token", "dst")).register_fake(_fake_all_gather_into_tensor)

torch.library.custom_op("devcomm::send_registered", send_registered, mutates_args=("token",)).register_fake(_fake_send_registered)
torch.library.custom_op("devcomm::recv_registered", recv_registered, mutates_args=("token", "t")).register_fake(_fake_recv_registered)
torch.library.custom_op("devcomm::sendrecv_registered", sendrecv_registered, mutates_args=("token", "recv")).register_fake(_fake_sendrecv_registered)

torch.library.custom_op("devcomm::moe_dispatch", moe_dispatch, mutates_args=("token",)).register_fake(_fake_moe_dispatch)
torch.library.custom_op("devcomm::moe_dispatch_fp8", moe_dispatch_fp8, mutates_args=("token",)).register_fake(_fake_moe_dispatch_fp8)
torch.library.custom_op("devcomm::moe_combine", moe_combine, mutates_args=("token",)).register_fake(_fake_moe_combine)
torch.library.custom_op("devcomm::moe_combine_out", moe_combine_out, mutates_args=("token", "out")).register_fake(_fake_moe_combine_out)
