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

