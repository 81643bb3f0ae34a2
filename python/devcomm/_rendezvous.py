"""How `devcomm.init()` finds its store (docs/PYTHON.md, "Starting ranks").

Under `devcomm launch`, rank 0 hosts devcomm's store on MASTER_PORT. Under torchrun's agent
store (`TORCHELASTIC_USE_AGENT_STORE=True`) or beside an initialised torch.distributed, a
torch store already holds that port; the ranks then meet through the torch store instead:
rank 0 of the group hosts a fresh devcomm store on an ephemeral port with a fresh job token
and publishes `ADDR:PORT:TOKEN` there under a key unique to this `init`, and the other ranks
wait for the key and join.

The helpers here take the environment and a store-like object (`add`, `set`, `get`, `wait`:
torch's `Store` methods) as arguments, so they are tested without torch; `torch_store` is the
one place that imports torch.
"""

import datetime
import os
import socket

from . import _native

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
HOST_ENV = "DEVCOMM_STORE_HOST"
LOOPBACK = "127.0.0.1"
# What rank 0 publishes instead of an address when it cannot host the store (no address
# starts with it).
FAILED = "failed: "


def agent_store_in_use(env):
    """Whether torchrun's agent hosts a store on MASTER_PORT (torch compares with "True")."""
    return env.get(AGENT_STORE_ENV) == "True"


def use_torch_store(env, group, dist_initialized):
    """Whether init meets through a torch store rather than binding MASTER_PORT."""
    return group is not None or dist_initialized or agent_store_in_use(env)


def agent_prefix(env):
    """Key prefix in torchrun's agent store: one namespace per restart of the workers."""
    return f"devcomm/torchrun/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def group_prefix(group_name):
    """Key prefix for a process group, named by its group name (alike on its ranks)."""
    return f"devcomm/group/{group_name}"


def counter_key(prefix, rank):
    """Each rank counts its own `init`s here, so the n-th init of every rank meets at one key."""
    return f"{prefix}/inits/{rank}"


def address_key(prefix, n):
    """Where rank 0 publishes the n-th communicator's store address."""
    return f"{prefix}/{n}/address"


def _int_env(env, var):
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise _native.InvalidArgument(f"devcomm.init: invalid argument: {var}={raw!r} is not an integer") from None


def local_placement(env, world_size):
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) when the environment gives them for a group of
    `world_size` ranks spanning the whole job (WORLD_SIZE), else None: a subgroup, or a process
    group started without a launcher, takes its local rank from the topology."""
    local_rank, local_world, world = (_int_env(env, v) for v in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"))
    if None in (local_rank, local_world, world) or world != world_size:
        return None
    return local_rank, local_world


def single_host(env):
    """True when every rank of the job runs on this host (LOCAL_WORLD_SIZE == WORLD_SIZE),
    False when not, None when the environment does not say."""
    local_world, world = _int_env(env, "LOCAL_WORLD_SIZE"), _int_env(env, "WORLD_SIZE")
    if local_world is None or world is None:
        return None
    return local_world == world


def routed_address(target, port=9):
    """This host's address on the route to `target` (a UDP socket connected there: nothing is
    sent). The address other hosts reach this one on when `target` is a peer of the job."""
    last = None
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(target, port, type=socket.SOCK_DGRAM):
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(sockaddr)
                return s.getsockname()[0]
        except OSError as e:
            last = e
    raise OSError(f"no route from this host to {target}: {last}")


def torch_store_host(store):
    """The host of a torch TCPStore under any PrefixStores, or None (a FileStore, say)."""
    seen = 0
    while hasattr(store, "underlying_store") and seen < 16:
        store, seen = store.underlying_store, seen + 1
    host = getattr(store, "host", None)
    return host if isinstance(host, str) and host else None


def choose_host(env, target, route=routed_address):
    """The address rank 0 binds devcomm's store on: DEVCOMM_STORE_HOST when set; 127.0.0.1 when
    every rank runs on this host; else this host's address on the route to `target` (the torch
    store's host: MASTER_ADDR, which need not be this host under a multi-node torchrun); with
    no target, the route to this host's name."""
    override = env.get(HOST_ENV, "").strip()
    if override:
        return override
    if single_host(env):
        return LOOPBACK
    try:
        return route(target or socket.gethostname())
    except OSError as e:
        raise _native.SetupError(
            f"devcomm.init: cannot choose the address to host devcomm's store on ({e}); set {HOST_ENV} to an address of this host that the other ranks reach"
        ) from None


def rendezvous(store, rank, world_size, prefix, host, *, local=None, timeout_ms=None, native=None):
    """Meets the group's other ranks on a fresh devcomm store through `store` (torch's) and
    returns the joined `_native.Store`. `host()` gives rank 0's bind address (called on rank 0
    only). Collective: every rank of the group calls it, as often as the others."""
    native = native or _native.Store
    timeout_ms = _native.setup_timeout_ms() if timeout_ms is None else timeout_ms
    local_rank, local_world = local if local is not None else (None, None)
    n = int(store.add(counter_key(prefix, rank), 1))
    key = address_key(prefix, n)
    if rank == 0:
        try:
            s = native.host(world_size, host(), local_rank, local_world, timeout_ms)
        except Exception as e:
            # The others fail at once with rank 0's reason instead of waiting out the timeout.
            store.set(key, FAILED + f"{type(e).__name__}: {e}")
            raise
        store.set(key, s.address)
        return s
    try:
        store.wait([key], datetime.timedelta(milliseconds=timeout_ms))
    except Exception as e:  # torch raises its DistStoreError (or a RuntimeError) on timeout
        raise _native.SetupError(
            f"devcomm.init: rank {rank}: rank 0 did not publish devcomm's store address under the key {key!r} of torch's store within {timeout_ms} ms ({e}); "
            "every rank of the group must call devcomm.init (with the same group) as often as the others"
        ) from None
    address = store.get(key)
    address = address.decode() if isinstance(address, (bytes, bytearray)) else str(address)
    if address.startswith(FAILED):
        raise _native.SetupError(f"devcomm.init: rank {rank}: rank 0 could not host devcomm's store: {address[len(FAILED):]}")
    return native.join(address, rank, world_size, local_rank, local_world, timeout_ms)


def torch_store(group, env=None):
    """The torch store to meet through, this rank, the group's size and the key prefix:
    the process group's (`group`, or the default group once torch.distributed is initialised),
    or under torchrun without torch.distributed a client of the agent's store on
    MASTER_ADDR:MASTER_PORT."""
    import torch.distributed as dist

    env = os.environ if env is None else env
    if group is not None or (dist.is_available() and dist.is_initialized()):
        from torch.distributed import distributed_c10d as c10d

        if not dist.is_initialized():
            raise _native.InvalidArgument("devcomm.init: invalid argument: group given, but torch.distributed is not initialised")
        pg = group if group is not None else dist.group.WORLD
        rank = dist.get_rank(pg)
        if rank < 0:
            raise _native.InvalidArgument("devcomm.init: invalid argument: this process is not a member of the group")
        name = getattr(pg, "group_name", None) or c10d._get_process_group_name(pg)
        return c10d._get_default_store(), rank, dist.get_world_size(pg), group_prefix(name)
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not env.get(v)]
    if missing:
        raise _native.InvalidArgument(f"devcomm.init: invalid argument: torchrun's agent store is in use but {', '.join(missing)} is not set")
    timeout = datetime.timedelta(milliseconds=_native.setup_timeout_ms())
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timeout)
    return store, int(env["RANK"]), int(env["WORLD_SIZE"]), agent_prefix(env)


def join(group=None, env=None, dist_initialized=False):
    """`(store, local)` for `devcomm.init` through a torch store: the joined `_native.Store`
    and the local placement (None: give the device, the local rank comes from the topology);
    or None when init binds MASTER_PORT itself, as under `devcomm launch`."""
    env = os.environ if env is None else env
    if not use_torch_store(env, group, dist_initialized):
        return None
    store, rank, world_size, prefix = torch_store(group, env)
    local = local_placement(env, world_size)
    s = rendezvous(store, rank, world_size, prefix, lambda: choose_host(env, torch_store_host(store)), local=local)
    return s, local
