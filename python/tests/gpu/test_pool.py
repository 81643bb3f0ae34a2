"""The communicator's memory pool (docs/PYTHON.md, "The memory pool"): tensors from
`comm.empty` and from `torch.cuda.use_mem_pool(comm.mem_pool())` used by the operations,
zero-copy between pool tensors found by address, and exhaustion as a named error."""

import pytest
import torch

import devcomm
from conftest import rank_input

MIB = 1 << 20


@pytest.fixture(scope="module")
def pool(comm):
    """One collective growth for the module: every later decision is local."""
    index = comm.grow_pool(128 * MIB)
    usage = comm.pool_usage()
    assert len(usage["segments"]) == index + 1 and usage["segments"][index] >= 128 * MIB
    return comm


def test_empty_is_pool_memory_found_by_address(pool):
    comm = pool
    before = comm.pool_usage()["allocations"]
    t = comm.empty((3, 1000), torch.float32)
    assert t.shape == (3, 1000) and t.dtype == torch.float32 and t.device == comm.device
    assert t.is_contiguous() and t.data_ptr() % 256 == 0
    segment, offset, base, size, handle = comm.pool_lookup(t)
    assert base + offset == t.data_ptr() and offset + 12000 <= size and handle != 0
    assert comm.pool_lookup(t[1:])[1] == offset + 4000
    assert comm.pool_lookup(torch.zeros(4, device=comm.device)) is None
    t.fill_(1.5)
    assert float(t.sum()) == 1.5 * 3000
    assert comm.pool_usage()["allocations"] == before + 1
    del t
    torch.cuda.synchronize()
    assert comm.pool_usage()["allocations"] == before


def test_empty_of_an_exhausted_pool_names_the_pool(pool):
    comm = pool
    usage = comm.pool_usage()
    ask = usage["largest_free"] + 1
    keep = comm.empty((1024,), torch.uint8)
    keep.fill_(7)
    with pytest.raises(devcomm.PoolExhausted, match="pool exhausted") as e:
        comm.empty((ask,), torch.uint8)
    assert e.value.requested == ask and e.value.segments == usage["segments"]
    assert comm.pool_usage()["allocations"] == usage["allocations"] + 1
    assert int(keep.sum()) == 7 * 1024


def test_mem_pool_tensors_in_the_operations(pool, seed):
    comm = pool
    w, r = comm.world_size, comm.rank
    n = 4096
    inputs = [rank_input(seed, p, (n,), torch.float32, comm.device) for p in range(w)]
    with torch.cuda.use_mem_pool(comm.mem_pool()):
        x = torch.empty(n, dtype=torch.float32, device=comm.device)
        gathered = torch.empty(w * n, dtype=torch.float32, device=comm.device)
    assert comm.pool_lookup(x) is not None and comm.pool_lookup(gathered) is not None
    x.copy_(inputs[r])
    comm.all_gather_into_tensor(gathered, x)
    comm.all_reduce(x)
    torch.cuda.synchronize()
    assert torch.equal(gathered, torch.cat(inputs))
    # The reference adds in rank order, as the reduction does for these sizes.
    ref = inputs[0].clone()
    for p in range(1, w):
        ref += inputs[p]
    torch.testing.assert_close(x, ref)


def test_mem_pool_exhaustion_names_the_pool(pool):
    comm = pool
    ask = sum(comm.pool_usage()["segments"]) + 64 * MIB
    with pytest.raises(torch.OutOfMemoryError):
        with torch.cuda.use_mem_pool(comm.mem_pool()):
            torch.empty(ask, dtype=torch.uint8, device=comm.device)
    assert "pool exhausted" in comm.pool_last_error()


@pytest.mark.parametrize("nbytes", [4 << 10, 1 << 20, 3 << 20])
def test_zero_copy_between_pool_tensors_in_pairs(pool, seed, nbytes):
    comm = pool
    w, r = comm.world_size, comm.rank
    if w % 2:
        pytest.fail("the pair test needs an even world size")
    n = nbytes // 4
    pad = 64
    inputs = [rank_input(seed, p, (n,), torch.float32, comm.device) for p in range(w)]
    # Allocated in the same order on every rank: the same offset (checked through the pool).
    buf = comm.empty((pad + n + pad,), torch.float32)
    offsets = torch.tensor([comm.pool_lookup(buf)[1]], dtype=torch.int64, device=comm.device)
    every = torch.empty(w, dtype=torch.int64, device=comm.device)
    comm.all_gather_into_tensor(every, offsets)
    assert len(set(every.tolist())) == 1, f"pool offsets differ across ranks: {every.tolist()}"
    peer = r + 1 if r % 2 == 0 else r - 1
    for sender_even in (True, False):
        buf.fill_(-7)
        comm.barrier()
        if (r % 2 == 0) == sender_even:
            comm.send_registered(inputs[r], peer, buf, offset=pad * 4)
        else:
            # No registration given: the receive finds the pool by address.
            comm.recv_registered(buf[pad : pad + n], peer)
        comm.synchronize()
        if (r % 2 == 0) != sender_even:
            assert torch.equal(buf[pad : pad + n], inputs[peer])
            assert bool((buf[:pad] == -7).all()) and bool((buf[pad + n :] == -7).all())
    comm.barrier()
    comm.synchronize()


@pytest.mark.parametrize("nbytes", [8, 64 << 10, 1 << 20, 6 << 20])
def test_reductions_on_pool_tensors_equal_ordinary_tensors(pool, seed, nbytes):
    """Pool tensors take the zero-copy reductions; their results are the staged paths' bits."""
    comm = pool
    w, r = comm.world_size, comm.rank
    n = max(1, nbytes // 2)
    x = rank_input(seed, r, (w * n,), torch.bfloat16, comm.device)
    with torch.cuda.use_mem_pool(comm.mem_pool()):
        px = torch.empty_like(x)
        pout = torch.empty(n, dtype=torch.bfloat16, device=comm.device)
        pall = torch.empty(w * n, dtype=torch.bfloat16, device=comm.device)
    assert comm.pool_lookup(px) is not None and comm.pool_lookup(pall) is not None
    px.copy_(x)
    ox = x.clone()
    # In-place all-reduce of the whole buffer (the tensor-parallel call), reduce-scatter of it,
    # all-gather of a shard: on pool tensors and on ordinary ones.
    comm.all_reduce(px, op="sum")
    comm.all_reduce(ox, op="sum")
    out = torch.empty(n, dtype=torch.bfloat16, device=comm.device)
    comm.reduce_scatter_tensor(pout, px, op="max")
    comm.reduce_scatter_tensor(out, ox, op="max")
    every = torch.empty(w * n, dtype=torch.bfloat16, device=comm.device)
    comm.all_gather_into_tensor(pall, pout)
    comm.all_gather_into_tensor(every, out)
    comm.synchronize()
    assert torch.equal(px.view(torch.int16), ox.view(torch.int16))
    assert torch.equal(pout.view(torch.int16), out.view(torch.int16))
    assert torch.equal(pall.view(torch.int16), every.view(torch.int16))
    # The rank-order sum, as both paths add.
    ref = rank_input(seed, 0, (w * n,), torch.bfloat16, comm.device).float()
    for p in range(1, w):
        ref = (ref + rank_input(seed, p, (w * n,), torch.bfloat16, comm.device).float())
    assert torch.equal(ox.view(torch.int16), ref.bfloat16().view(torch.int16))
