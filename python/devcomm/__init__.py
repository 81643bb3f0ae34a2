"""devcomm for PyTorch: device-initiated GPU communication (docs/PYTHON.md).

    import devcomm, torch
    comm = devcomm.init()                       # joins from the torchrun / `devcomm launch` environment
    comm.all_to_all_single(out, inp)            # on torch's current stream, no host synchronisation
    recv_counts, recv_offsets = comm.all_to_all_v(out, inp, in_splits)   # splits stay on the GPU

Importing the package needs neither torch nor a GPU; `init()` and the operations need both.
"""

from . import _native
from ._native import (
    Aborted,
    CompileError,
    CountOverflow,
    CudaError,
    Error,
    InvalidArgument,
    NotBuiltError,
    PeerTimeout,
    PoolExhausted,
    SetupError,
    __version__,
    check_tensor,
    describe,
)
from ._hooks import Hooks
from ._registration import Registration

__all__ = [
    "Aborted",
    "Comm",
    "CompileError",
    "CountOverflow",
    "CudaError",
    "Error",
    "Hooks",
    "InvalidArgument",
    "NotBuiltError",
    "PeerTimeout",
    "PoolExhausted",
    "Registration",
    "SetupError",
    "__version__",
    "check_tensor",
    "describe",
    "init",
]


def init(device=None, group=None):
    """Joins the process group, opens this rank's GPU (the local rank's, or `device`), makes it
    torch's current device and returns a `devcomm.Comm`. Collective: every rank of the group
    calls it.

    The group: `group` (a torch.distributed process group: its ranks, met through its store),
    else torch.distributed's default group once it is initialised, else the environment
    (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) of torchrun,
    met through torchrun's store, or of `devcomm launch` (docs/PYTHON.md, "Starting ranks")."""
    from ._comm import Comm

    return Comm._from_env(device, group)


def __getattr__(name):
    # `devcomm.Comm` and `devcomm.ops` import torch: only when asked for.
    if name == "Comm":
        from ._comm import Comm

        return Comm
    if name == "ops":
        from . import _ops

        return _ops
    raise AttributeError(f"module 'devcomm' has no attribute {name!r}")
