"""The copy-engine route of the registered operations (from DEVCOMM_ZC_CE_MIN, 64 MiB by
default): 64 MiB messages and all-to-all chunks. In a file of its own that runs after
test_registered.py, since a hang here aborts the communicator for every later test.

Seen on nvidia-h100-x1 (2 and 4 ranks sharing the GPU under MPS, torch 2.11, 2026-11-24, with
DEVCOMM_ZC_CE_MIN=4 MiB): a send or receive alone by copy engine passed; a call whose send went
by copy engine while the same rank also received (`sendrecv_registered`, an exchange or a ring
step) timed out: the peer's pacer never saw this rank's receive descriptor, as if the receive
kernel, enqueued after the copy stream's wait for GO, waited behind it (streams sharing a
hardware queue). The ring runs on a side stream and on torch's default stream; running this
file with CUDA_DEVICE_MAX_CONNECTIONS=32 tells whether queue sharing is the cause."""

import pytest
import torch

import devcomm
from conftest import rank_input

CE = 64 << 20  # bytes: the default DEVCOMM_ZC_CE_MIN


def test_ce_send_and_recv_in_pairs(comm, seed):
    w, r = comm.world_size, comm.rank
    if w % 2:
        pytest.fail("the pair test needs an even world size")
    n = CE // 4
    x = rank_input(seed, r, (n,), torch.float32, comm.device)
    with comm.alloc_registered((n + 64,), torch.float32) as reg:
        buf = reg.tensor
        buf.fill_(-7)
        peer = r + 1 if r % 2 == 0 else r - 1
        if r % 2 == 0:
            comm.send_registered(x, peer, reg, offset=64 * 4)
        else:
            comm.recv_registered(buf[64:], peer, reg)
            want = rank_input(seed, peer, (n,), torch.float32, comm.device)
            torch.testing.assert_close(buf[64:], want, rtol=0, atol=0)
            assert (buf[:64] == -7).all(), "bytes before the message were written"
        comm.synchronize()


@pytest.mark.parametrize("side_stream", [True, False], ids=["side-stream", "default-stream"])
def test_ce_sendrecv_ring(comm, seed, side_stream):
    w, r = comm.world_size, comm.rank
    n = CE // 4
    nxt, prv = (r + 1) % w, (r - 1) % w
    x = rank_input(seed, r, (n,), torch.float32, comm.device)
    with comm.alloc_registered((w, n), torch.float32) as reg:
        reg.tensor.fill_(-3)
        s = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            comm.sendrecv_registered(x, nxt, reg, r * n * 4, reg.tensor[prv], prv)
        torch.cuda.current_stream().wait_stream(s)
        want = rank_input(seed, prv, (n,), torch.float32, comm.device)
        torch.testing.assert_close(reg.tensor[prv], want, rtol=0, atol=0)
        comm.synchronize()


def test_ce_all_to_all_single_into_a_registration(comm, seed):
    w, r = comm.world_size, comm.rank
    rows, cols = CE // (4 * 256), 256
    inputs = [rank_input(seed, p, (w * rows, cols), torch.float32, comm.device) for p in range(w)]
    want = torch.cat([inputs[p][r * rows : (r + 1) * rows] for p in range(w)])
    with comm.alloc_registered((w * rows, cols), torch.float32) as reg:
        reg.tensor.fill_(5)
        comm.all_to_all_single(reg.tensor, inputs[r])
        torch.testing.assert_close(reg.tensor, want, rtol=0, atol=0)
        comm.synchronize()


def test_ce_graph_replays(comm, seed):
    w, r = comm.world_size, comm.rank
    n = CE // 4
    nxt, prv = (r + 1) % w, (r - 1) % w
    src = torch.zeros(n, device=comm.device)
    with comm.alloc_registered((w, n), torch.float32) as reg:
        comm.sendrecv_registered(src, nxt, reg, r * n * 4, reg.tensor[prv], prv)  # warm-up
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            comm.sendrecv_registered(src, nxt, reg, r * n * 4, reg.tensor[prv], prv)
        for it in range(5):
            src.copy_(rank_input(seed + it, r, (n,), torch.float32, comm.device))
            g.replay()
            want = rank_input(seed + it, prv, (n,), torch.float32, comm.device)
            torch.testing.assert_close(reg.tensor[prv], want, rtol=0, atol=0)
        torch.cuda.synchronize()
        comm.check()
        del g
