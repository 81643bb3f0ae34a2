"""Registered buffers and the zero-copy routes (docs/PYTHON.md, "Registered buffers"), against
torch references on fresh random data (see conftest.py). Sizes span the routes below the copy
engine: low-latency (up to 256 KiB) and the middle (staged, or SM blocks with
DEVCOMM_ZC_STAGED=0). The copy-engine route (64 MiB by default) is in test_zy_registered_ce.py,
which runs after these."""

import pytest
import torch

import devcomm
from conftest import rank_input

SIZES = [4 << 10, 1 << 20, 2 << 20]  # bytes per message


def test_register_a_torch_tensor(comm):
    t = torch.zeros(1000, dtype=torch.float32, device=comm.device)
    reg = comm.register(t)
    try:
        assert reg.live and reg.tensor is t
        assert (reg.ptr, reg.nbytes) == (t.data_ptr(), 4000)
        assert reg.offset_of(t[10:20]) == 40
        assert reg.contains(t[990:]) and not reg.contains(torch.zeros(4, device=comm.device))
        with pytest.raises(devcomm.InvalidArgument, match="does not lie inside"):
            reg.offset_of(torch.zeros(4, device=comm.device))
    finally:
        reg.deregister()
    assert not reg.live and "deregistered" in repr(reg)


def test_alloc_registered_is_a_torch_tensor(comm):
    with comm.alloc_registered((3, 5), torch.bfloat16) as reg:
        t = reg.tensor
        assert t.shape == (3, 5) and t.dtype == torch.bfloat16 and t.device == comm.device
        assert t.is_contiguous() and t.data_ptr() == reg.ptr and reg.nbytes == 30
        t.fill_(2.5)
        assert float(t.float().sum()) == 2.5 * 15
    # The memory outlives the registration while the tensor lives.
    assert not reg.live
    t.add_(1)
    assert float(t.float().sum()) == 3.5 * 15


@pytest.mark.parametrize("nbytes", SIZES)
def test_send_and_recv_registered_in_pairs(comm, seed, nbytes):
    w, r = comm.world_size, comm.rank
    if w % 2:
        pytest.fail("the pair test needs an even world size")
    n = nbytes // 4
    pad = 16  # elements before the message in the registered buffer
    inputs = [rank_input(seed, p, (n,), torch.float32, comm.device) for p in range(w)]
    with comm.alloc_registered((pad + n + pad,), torch.float32) as reg:
        buf = reg.tensor
        buf.fill_(-7)
        # Even ranks send to the next odd rank, then the odd ones send back.
        for sender_even in (True, False):
            buf.fill_(-7)
            peer = r + 1 if r % 2 == 0 else r - 1
            if (r % 2 == 0) == sender_even:
                comm.send_registered(inputs[r], peer, reg, offset=pad * 4)
            else:
                comm.recv_registered(buf[pad : pad + n], peer, reg)
                torch.testing.assert_close(buf[pad : pad + n], inputs[peer], rtol=0, atol=0)
                assert (buf[:pad] == -7).all() and (buf[pad + n :] == -7).all(), "bytes outside the message were written"
            comm.barrier()
        comm.synchronize()


@pytest.mark.parametrize("nbytes", SIZES)
def test_sendrecv_registered_ring(comm, seed, nbytes):
    w, r = comm.world_size, comm.rank
    n = nbytes // 2
    inputs = [rank_input(seed, p, (n,), torch.float16, comm.device) for p in range(w)]
    t = torch.full((w, n), -3, dtype=torch.float16, device=comm.device)  # torch's own memory
    reg = comm.register(t)
    nxt, prv = (r + 1) % w, (r - 1) % w
    # Rank r writes into slot r of the next rank's buffer and receives slot prv of its own.
    comm.sendrecv_registered(inputs[r], nxt, reg, r * n * 2, t[prv], prv)
    torch.testing.assert_close(t[prv], inputs[prv], rtol=0, atol=0)
    others = [q for q in range(w) if q != prv]
    assert (t[others] == -3).all(), "slots other than the received one were written"
    comm.synchronize()
    reg.deregister()


@pytest.mark.parametrize("chunk_bytes", SIZES)
def test_all_to_all_single_into_a_registration(comm, seed, chunk_bytes):
    w, r = comm.world_size, comm.rank
    rows, cols = chunk_bytes // (4 * 64), 64
    inputs = [rank_input(seed, p, (w * rows, cols), torch.float32, comm.device) for p in range(w)]
    want = torch.cat([inputs[p][r * rows : (r + 1) * rows] for p in range(w)])
    with comm.alloc_registered((w * rows, cols), torch.float32) as reg:
        out = reg.tensor
        out.fill_(5)
        comm.all_to_all_single(out, inputs[r])
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        comm.synchronize()


def test_graph_capture_replays_registered_operations(comm, seed):
    w, r = comm.world_size, comm.rank
    # 2 MiB messages and chunks (the copy-engine route: test_zy_registered_ce.py).
    n, rows, cols = (2 << 20) // 4, (2 << 20) // (4 * 64), 64
    nxt, prv = (r + 1) % w, (r - 1) % w
    src = torch.zeros(n, device=comm.device)
    a2a_in = torch.zeros(w * rows, cols, device=comm.device)
    with comm.alloc_registered((w, n), torch.float32) as ring, comm.alloc_registered((w * rows, cols), torch.float32) as a2a:
        # Warm-up (loads the kernels, which must not happen inside a capture).
        comm.sendrecv_registered(src, nxt, ring, r * n * 4, ring.tensor[prv], prv)
        comm.all_to_all_single(a2a.tensor, a2a_in)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            comm.sendrecv_registered(src, nxt, ring, r * n * 4, ring.tensor[prv], prv)
            comm.all_to_all_single(a2a.tensor, a2a_in)
        for it in range(20):
            s = seed + 7919 * it
            ring_in = [rank_input(s, p, (n,), torch.float32, comm.device) for p in range(w)]
            a_in = [rank_input(s + 1, p, (w * rows, cols), torch.float32, comm.device) for p in range(w)]
            src.copy_(ring_in[r])
            a2a_in.copy_(a_in[r])
            g.replay()
            torch.testing.assert_close(ring.tensor[prv], ring_in[prv], rtol=0, atol=0)
            want = torch.cat([a_in[p][r * rows : (r + 1) * rows] for p in range(w)])
            torch.testing.assert_close(a2a.tensor, want, rtol=0, atol=0)
        torch.cuda.synchronize()
        comm.check()
        del g


def test_compiled_registered_ring(comm, seed):
    w, r = comm.world_size, comm.rank
    n = 4096
    nxt, prv = (r + 1) % w, (r - 1) % w
    inputs = [rank_input(seed, p, (n,), torch.float32, comm.device) for p in range(w)]
    with comm.alloc_registered((w, n), torch.float32) as reg:
        buf = reg.tensor

        def step(x):
            comm.sendrecv_registered(x * 2, nxt, reg, r * n * 4, buf[prv], prv)
            return buf[prv] + 1

        got = torch.compile(step, fullgraph=True)(inputs[r])
        torch.testing.assert_close(got, inputs[prv] * 2 + 1, rtol=0, atol=0)
        comm.synchronize()


def test_bad_arguments_are_refused_before_anything_runs(comm):
    w, r = comm.world_size, comm.rank
    peer = (r + 1) % w
    x = torch.ones(256, device=comm.device)
    with comm.alloc_registered((1024,), torch.float32) as reg:
        with pytest.raises(devcomm.InvalidArgument, match="multiple"):
            comm.send_registered(x, peer, reg, offset=2)  # inside a float32
        with pytest.raises(devcomm.InvalidArgument, match="< 0"):
            comm.send_registered(x, peer, reg, offset=-4)
        with pytest.raises(devcomm.InvalidArgument) as e:
            comm.send_registered(x, peer, reg, offset=4096 - 512)  # past the peer's 4096 bytes
        assert e.value.capacity == 4096
        outside = torch.zeros(256, device=comm.device)
        with pytest.raises(devcomm.InvalidArgument, match="does not lie inside"):
            comm.recv_registered(outside, peer, reg)
        with pytest.raises(devcomm.InvalidArgument, match="inside no registration"):
            comm.recv_registered(outside, peer)
        with pytest.raises(devcomm.InvalidArgument, match="not a devcomm.Registration"):
            comm.send_registered(x, peer, object())
    comm.synchronize()


def test_register_refusals_reach_every_rank(comm):
    # Rank 0 offers a CPU tensor; every rank raises, none waits for it.
    t = torch.zeros(64, device="cpu" if comm.rank == 0 else comm.device)
    with pytest.raises(devcomm.InvalidArgument, match="on cpu" if comm.rank == 0 else "rank 0: .*on cpu"):
        comm.register(t)
    # The communicator still registers afterwards.
    reg = comm.register(torch.zeros(64, device=comm.device))
    reg.deregister()


def test_a_deregistered_registration_is_refused(comm):
    w, r = comm.world_size, comm.rank
    peer = (r + 1) % w
    reg = comm.alloc_registered((256,), torch.float32)
    inside = reg.tensor[:64]
    reg.deregister()
    x = torch.ones(64, device=comm.device)
    with pytest.raises(devcomm.InvalidArgument, match="deregistered"):
        comm.send_registered(x, peer, reg, 0)
    with pytest.raises(devcomm.InvalidArgument, match="deregistered"):
        comm.recv_registered(inside, peer, reg)
    with pytest.raises(devcomm.InvalidArgument, match="inside no registration"):
        comm.recv_registered(inside, peer)
    # The native layer refuses the id too (not only the Python object's flag).
    with pytest.raises(devcomm.InvalidArgument, match="deregistered"):
        devcomm._native.send_registered(comm._native, devcomm.ops.desc(x), peer, reg.id, 0, torch.cuda.current_stream().cuda_stream)
    # A second deregistration fails on every rank (collectively), and nothing hangs.
    with pytest.raises(devcomm.InvalidArgument, match="deregistered"):
        reg.deregister()
    # An all-to-all into the released memory takes the ordinary route.
    inp = torch.arange(64, dtype=torch.float32, device=comm.device)
    comm.all_to_all_single(inside, inp)
    comm.synchronize()
