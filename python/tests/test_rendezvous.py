"""How `devcomm.init()` finds its store under torchrun and beside torch.distributed
(`devcomm/_rendezvous.py`), without torch or a GPU: the pure helpers, and ranks on threads
meeting on fresh native stores through a fake of torch's store."""

import threading

import pytest

import devcomm
from devcomm import _native, _rendezvous as rdv


class FakeTorchStore:
    """The part of torch.distributed.Store that the rendezvous uses: add, set, get, wait."""

    def __init__(self):
        self.kv = {}
        self.cond = threading.Condition()

    def add(self, key, amount):
        with self.cond:
            value = int(self.kv.get(key, b"0")) + amount
            self.kv[key] = str(value).encode()
            self.cond.notify_all()
            return value

    def set(self, key, value):
        with self.cond:
            self.kv[key] = value.encode() if isinstance(value, str) else bytes(value)
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            return self.kv[key]

    def wait(self, keys, timeout):
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.kv for k in keys), timeout.total_seconds()):
                raise RuntimeError(f"Socket Timeout waiting for {keys}")


# --- pure helpers --------------------------------------------------------------------------


def test_torchruns_agent_store_and_process_groups_select_the_torch_store():
    assert rdv.agent_store_in_use({"TORCHELASTIC_USE_AGENT_STORE": "True"})
    # torch compares with "True" exactly.
    assert not rdv.agent_store_in_use({"TORCHELASTIC_USE_AGENT_STORE": "False"})
    assert not rdv.agent_store_in_use({})
    assert not rdv.use_torch_store({}, None, False)
    assert rdv.use_torch_store({}, object(), False)
    assert rdv.use_torch_store({}, None, True)
    assert rdv.use_torch_store({"TORCHELASTIC_USE_AGENT_STORE": "True"}, None, False)


def test_keys_separate_groups_restarts_and_inits():
    assert rdv.agent_prefix({"TORCHELASTIC_RESTART_COUNT": "2"}) == "devcomm/torchrun/attempt_2"
    assert rdv.agent_prefix({}) == "devcomm/torchrun/attempt_0"
    assert rdv.group_prefix("3") == "devcomm/group/3"
    p = rdv.group_prefix("0")
    assert rdv.counter_key(p, 1) != rdv.counter_key(p, 2)
    assert rdv.address_key(p, 1) != rdv.address_key(p, 2)
    assert rdv.address_key(p, 1) != rdv.address_key(rdv.group_prefix("1"), 1)


def test_local_placement_only_for_the_whole_job():
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}
    assert rdv.local_placement(env, 4) == (1, 2)
    assert rdv.local_placement(env, 2) is None, "a subgroup takes its local rank from the topology"
    assert rdv.local_placement({"LOCAL_RANK": "0"}, 4) is None
    with pytest.raises(devcomm.InvalidArgument, match="LOCAL_RANK='x'"):
        rdv.local_placement({**env, "LOCAL_RANK": "x"}, 4)


def test_the_store_binds_loopback_on_one_host_else_the_route_to_the_master():
    routes = []

    def route(target):
        routes.append(target)
        return "10.1.2.3"

    one_host = {"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4"}
    assert rdv.choose_host(one_host, "10.9.9.9", route) == "127.0.0.1"
    assert routes == []
    two_hosts = {"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}
    assert rdv.choose_host(two_hosts, "master.cluster", route) == "10.1.2.3"
    assert routes == ["master.cluster"]
    assert rdv.choose_host({"DEVCOMM_STORE_HOST": "10.7.7.7", **two_hosts}, "m", route) == "10.7.7.7"


def test_an_unroutable_master_names_the_override():
    def route(target):
        raise OSError("network unreachable")

    with pytest.raises(devcomm.SetupError, match="DEVCOMM_STORE_HOST"):
        rdv.choose_host({}, "10.9.9.9", route)


def test_routed_address_of_loopback_is_loopback():
    assert rdv.routed_address("127.0.0.1") == "127.0.0.1"


def test_the_torch_stores_host_is_found_under_prefix_stores():
    class TCP:
        host = "node-0"

    class Prefix:
        def __init__(self, inner):
            self.underlying_store = inner

    assert rdv.torch_store_host(Prefix(Prefix(TCP()))) == "node-0"
    assert rdv.torch_store_host(Prefix(object())) is None


# --- the native store ------------------------------------------------------------------


def test_a_malformed_address_is_refused_without_echoing_the_token():
    with pytest.raises(devcomm.Error, match="ADDR:PORT:TOKEN") as e:
        _native.Store.join("127.0.0.1:notaport:secret", 1, 2, timeout_ms=1000)
    assert "secret" not in str(e.value)


def test_local_rank_and_size_come_together():
    with pytest.raises(devcomm.InvalidArgument, match="together"):
        _native.Store.host(2, "127.0.0.1", 0, None, 1000)


def test_a_store_without_local_rank_needs_the_device():
    s = _native.Store.host(1, "127.0.0.1", timeout_ms=1000)
    with pytest.raises(devcomm.InvalidArgument, match="device must be given"):
        _native.Comm.from_store(s)
    assert not s.taken


# --- ranks meeting through a fake torch store ------------------------------------------


def run_ranks(world, fn):
    """Runs fn(rank) for every rank on its own thread; returns the results, or raises the first
    exception (by rank)."""
    results, errors = [None] * world, [None] * world

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # handed to the test thread
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for e in errors:
        if e is not None:
            raise e
    return results


def test_ranks_meet_on_a_fresh_store_per_init():
    world, torch_store, prefix = 3, FakeTorchStore(), rdv.group_prefix("0")
    hosts = []

    def host():
        hosts.append(1)
        return "127.0.0.1"

    def init(rank):
        s = rdv.rendezvous(torch_store, rank, world, prefix, host, local=(rank, world), timeout_ms=20_000)
        assert (s.rank, s.world_size) == (rank, world)
        s.barrier("met", 20_000)
        return s

    def addresses(stores):
        # Rank 0's store, when dropped, waits (holding the GIL) for the others to leave it:
        # drop theirs first.
        out = [s.address for s in stores]
        del stores[1:]
        del stores[0]
        return out

    first = addresses(run_ranks(world, init))
    second = addresses(run_ranks(world, init))
    assert len(set(first)) == 1 and len(set(second)) == 1, "every rank joined rank 0's store"
    assert first[0] != second[0], "the second init hosts a store of its own"
    assert hosts == [1, 1], "only rank 0 chooses an address"
    assert torch_store.get(rdv.address_key(prefix, 2)).decode() == second[0]
    assert second[0].startswith("127.0.0.1:")


def test_a_rank_whose_rank_0_never_comes_names_the_key():
    with pytest.raises(devcomm.SetupError, match="devcomm/group/7/1/address"):
        rdv.rendezvous(FakeTorchStore(), 1, 2, rdv.group_prefix("7"), lambda: "127.0.0.1", timeout_ms=200)


def test_rank_0_failing_to_host_fails_the_others_at_once():
    torch_store, prefix = FakeTorchStore(), rdv.group_prefix("0")

    def init(rank):
        # TEST-NET-1: never an address of this host, so rank 0 cannot bind it.
        return rdv.rendezvous(torch_store, rank, 2, prefix, lambda: "192.0.2.1", timeout_ms=20_000)

    with pytest.raises(devcomm.Error, match="not an address of this host"):
        init(0)
    with pytest.raises(devcomm.SetupError, match="rank 0 could not host devcomm's store.*not an address of this host"):
        init(1)
