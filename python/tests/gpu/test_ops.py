"""Every operation against a torch reference on fresh random data (see conftest.py)."""

import pytest
import torch

import devcomm
from conftest import rank_input


def splits_matrix(seed, world, most=9):
    """S[p][q]: rows rank p sends to rank q (zeros included)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, most + 1, (world, world), generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 7), (64, 33)])
def test_all_to_all_single(comm, seed, dtype, rows, cols):
    w, r = comm.world_size, comm.rank
    inputs = [rank_input(seed, p, (w * rows, cols), dtype, comm.device) for p in range(w)]
    out = torch.full_like(inputs[r], 77)
    comm.all_to_all_single(out, inputs[r])
    want = torch.cat([inputs[p][r * rows : (r + 1) * rows] for p in range(w)])
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def expected_v(inputs, S, r):
    w = S.shape[0]
    parts = []
    for p in range(w):
        first = int(S[p, :r].sum())
        parts.append(inputs[p][first : first + int(S[p, r])])
    return torch.cat(parts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_all_to_all_v_with_device_splits(comm, seed, dtype):
    w, r = comm.world_size, comm.rank
    S = splits_matrix(seed, w)
    inputs = [rank_input(seed, p, (int(S[p].sum()), 5), dtype, comm.device) for p in range(w)]
    capacity = int(S[:, r].sum()) + 3
    out = torch.full((capacity, 5), -1, dtype=dtype, device=comm.device)
    splits = S[r].to(comm.device)
    counts, offsets = comm.all_to_all_v(out, inputs[r], splits)
    torch.testing.assert_close(counts.cpu(), S[:, r])
    torch.testing.assert_close(offsets.cpu(), torch.cumsum(S[:, r], 0) - S[:, r])
    n = int(S[:, r].sum())
    torch.testing.assert_close(out[:n], expected_v(inputs, S, r), rtol=0, atol=0)
    assert (out[n:] == -1).all(), "rows past the received ones were written"


def test_all_to_all_v_with_offsets(comm, seed):
    w, r = comm.world_size, comm.rank
    S = splits_matrix(seed, w)
    # Each rank's rows for peer q start at a gap of 2 rows after the previous peer's.
    inputs = [rank_input(seed, p, (int(S[p].sum()) + 2 * w, 3), torch.float32, comm.device) for p in range(w)]
    offs = [torch.cumsum(S[p], 0) - S[p] + 2 * torch.arange(w) for p in range(w)]
    out = torch.zeros((int(S[:, r].sum()), 3), device=comm.device)
    comm.all_to_all_v(out, inputs[r], S[r].to(comm.device), offs[r].to(comm.device))
    want = torch.cat([inputs[p][int(offs[p][r]) : int(offs[p][r]) + int(S[p, r])] for p in range(w)])
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("as_tensor", [True, False])
def test_all_to_all_single_with_splits(comm, seed, as_tensor):
    w, r = comm.world_size, comm.rank
    S = splits_matrix(seed, w)
    inputs = [rank_input(seed, p, (int(S[p].sum()), 4), torch.float32, comm.device) for p in range(w)]
    out = torch.empty((int(S[:, r].sum()), 4), device=comm.device)
    in_splits = S[r].to(comm.device) if as_tensor else S[r].tolist()
    out_splits = S[:, r].to(comm.device) if as_tensor else S[:, r].tolist()
    comm.all_to_all_single(out, inputs[r], out_splits, in_splits)
    torch.testing.assert_close(out, expected_v(inputs, S, r), rtol=0, atol=0)


def test_sendrecv_ring_and_send_recv_pairs(comm, seed):
    w, r = comm.world_size, comm.rank
    nxt, prv = (r + 1) % w, (r - 1) % w
    inputs = [rank_input(seed, p, (1000, 3), torch.float32, comm.device) for p in range(w)]
    got = torch.empty_like(inputs[r])
    comm.sendrecv(inputs[r], nxt, got, prv)
    torch.testing.assert_close(got, inputs[prv], rtol=0, atol=0)
    # Pairs (0, 1), (2, 3), ...: the even rank sends, the odd one receives.
    if w % 2 == 0:
        big = [rank_input(seed + 1, p, (1 << 18,), torch.bfloat16, comm.device) for p in range(w)]
        if r % 2 == 0:
            comm.send(big[r], r + 1)
        else:
            into = torch.zeros_like(big[r])
            comm.recv(into, r - 1)
            torch.testing.assert_close(into, big[r - 1], rtol=0, atol=0)


def test_barrier_orders_work(comm):
    comm.barrier()
    comm.synchronize()


SCALE_ADD = """
struct ScaleAdd {
  using In = float; using Out = float; using Wire = float;
  static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
    devcomm::Tile<float> t = devcomm::load_tile<float>(c);
    const float s = static_cast<const float*>(c.user)[0];
    for (int k = 0; k < devcomm::Tile<float>::kElems; ++k) t.v[k] = t.v[k] * s + (float)c.rank;
    return t;
  }
  static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
    devcomm::store_tile<float>(c, t);
  }
};
"""


@pytest.mark.parametrize("user", [2.5, "tensor"])
def test_hooks_with_user_arguments(comm, seed, user):
    w, r = comm.world_size, comm.rank
    hooks = devcomm.Hooks(SCALE_ADD, in_dtype=torch.float32)
    inputs = [rank_input(seed, p, (w * 6, 10), torch.float32, comm.device) for p in range(w)]
    out = torch.empty_like(inputs[r])
    arg = torch.tensor([2.5], device=comm.device) if user == "tensor" else user
    comm.all_to_all_single(out, inputs[r], hooks=hooks, user=arg)
    want = torch.cat([inputs[p][r * 6 : (r + 1) * 6] * 2.5 + p for p in range(w)])
    torch.testing.assert_close(out, want)
    # The same hooks on all-to-all-v.
    S = splits_matrix(seed, w)
    vin = [rank_input(seed + 7, p, (int(S[p].sum()), 2), torch.float32, comm.device) for p in range(w)]
    vout = torch.empty((int(S[:, r].sum()), 2), device=comm.device)
    comm.all_to_all_v(vout, vin[r], S[r].to(comm.device), hooks=hooks, user=arg)
    want = torch.cat([x * 2.5 + p for p, x in enumerate(expected_v(vin, S, r).split(S[:, r].tolist()))])
    torch.testing.assert_close(vout, want)


def test_a_hook_that_does_not_compile_raises_compile_error(comm):
    bad = devcomm.Hooks("struct Bad { using In = float; using Out = float; using Wire = float; int oops = ; };")
    x = torch.zeros(comm.world_size * 4, device=comm.device)
    with pytest.raises(devcomm.CompileError) as e:
        comm.all_to_all_single(torch.empty_like(x), x, hooks=bad)
    assert "hooks.cu" in e.value.log


def test_bad_arguments_are_refused_before_anything_runs(comm):
    w, dev = comm.world_size, comm.device
    x = torch.zeros(w * 4, device=dev)
    cases = [
        (lambda: comm.all_to_all_single(torch.empty(w * 4, dtype=torch.float16, device=dev), x), "one dtype"),
        (lambda: comm.all_to_all_single(torch.empty(w * 4), x), "on cpu"),
        (lambda: comm.all_to_all_single(torch.empty(w * 8, device=dev)[::2], x), "not contiguous"),
        (lambda: comm.all_to_all_single(torch.empty(w * 4 + 1, device=dev), x), "world size"),
        (lambda: comm.all_to_all_v(x.clone(), x, torch.ones(w, dtype=torch.int32, device=dev)), "expected int64"),
        (lambda: comm.all_to_all_v(x.clone(), x, torch.ones(w + 1, dtype=torch.int64, device=dev)), "entries"),
        (lambda: comm.sendrecv(x, comm.rank, x.clone(), comm.rank), "peer"),
    ]
    for call, match in cases:
        with pytest.raises(devcomm.InvalidArgument, match=match):
            call()
    comm.check()


def test_count_overflow_is_an_error_with_fields_and_the_comm_stays_usable(comm, seed):
    w, r = comm.world_size, comm.rank
    splits = torch.full((w,), 4, dtype=torch.int64, device=comm.device)
    inp = torch.ones((4 * w, 2), device=comm.device)
    small = torch.zeros((4 * w - 1, 2), device=comm.device)  # one row short
    comm.all_to_all_v(small, inp, splits)
    with pytest.raises(devcomm.CountOverflow) as e:
        comm.synchronize()
    assert e.value.rank == r and e.value.side == "receive"
    assert (e.value.needed, e.value.capacity) == (4 * w, 4 * w - 1)
    assert (small == 0).all(), "an overflowing receive wrote into the buffer"
    out = torch.empty_like(inp)
    comm.all_to_all_v(out, inp, splits)
    comm.synchronize()
    assert (out == 1).all()


def test_reductions(comm, seed):
    w, r = comm.world_size, comm.rank
    xs = [rank_input(seed, p, (w * 8,), torch.float32, comm.device) for p in range(w)]
    total = torch.stack(xs).sum(0)
    if not devcomm._native.REDUCTIONS_BUILT:
        with pytest.raises(devcomm.NotBuiltError, match="not built yet"):
            comm.all_reduce(xs[r].clone())
        with pytest.raises(devcomm.NotBuiltError):
            comm.reduce_scatter_tensor(torch.empty(8, device=comm.device), xs[r])
        with pytest.raises(devcomm.NotBuiltError):
            comm.all_gather_into_tensor(torch.empty(w * 8, device=comm.device), xs[r][:8].clone())
        return
    t = xs[r].clone()
    comm.all_reduce(t)
    torch.testing.assert_close(t, total)
    shard = torch.empty(8, device=comm.device)
    comm.reduce_scatter_tensor(shard, xs[r])
    torch.testing.assert_close(shard, total[r * 8 : (r + 1) * 8])
    gathered = torch.empty(w * 8, device=comm.device)
    comm.all_gather_into_tensor(gathered, xs[r][:8].clone())
    torch.testing.assert_close(gathered, torch.cat([x[:8] for x in xs]))


@pytest.mark.parametrize("dtype", [torch.int16, torch.bool, torch.complex64, torch.complex128, torch.float8_e4m3fn])
def test_all_gather_of_any_dtype(comm, seed, dtype):
    """A gather reduces nothing: types devcomm does not reduce move bitwise (complex128: 16
    bytes)."""
    w, r = comm.world_size, comm.rank
    n = 1001
    g = torch.Generator().manual_seed(seed + r)
    bits = torch.randint(0, 256, (n * torch.empty((), dtype=dtype).element_size(),), generator=g, dtype=torch.uint8)
    mine = (bits & 1 if dtype == torch.bool else bits).view(dtype).to(comm.device)
    out = torch.zeros(w * n, dtype=dtype, device=comm.device)
    comm.all_gather_into_tensor(out, mine)
    gathered = [torch.empty_like(mine) for _ in range(w)]
    for p in range(w):
        gp = torch.Generator().manual_seed(seed + p)
        pb = torch.randint(0, 256, (bits.numel(),), generator=gp, dtype=torch.uint8)
        gathered[p] = (pb & 1 if dtype == torch.bool else pb).view(dtype)
    want = torch.cat(gathered).view(torch.uint8)
    assert torch.equal(out.cpu().view(torch.uint8), want), "the gathered bytes differ"


class OnlyDlpack:
    """A tensor seen only through DLPack."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None, **kw):
        return self.t.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class OnlyCai:
    """A tensor seen only through __cuda_array_interface__."""

    def __init__(self, t):
        self.__cuda_array_interface__ = t.__cuda_array_interface__


def test_the_native_layer_takes_dlpack_and_cuda_array_interface_objects(comm, seed):
    w, r = comm.world_size, comm.rank
    inputs = [rank_input(seed, p, (w * 32,), torch.float32, comm.device) for p in range(w)]
    out = torch.zeros_like(inputs[r])
    stream = torch.cuda.current_stream().cuda_stream
    ptr, dtype, shape, strides, device = devcomm.describe(OnlyDlpack(out), stream)
    assert (ptr, dtype, shape, device) == (out.data_ptr(), "float32", [w * 32], out.get_device())
    assert strides in (None, [1])
    comm._native.all_to_all(OnlyDlpack(out), OnlyCai(inputs[r]), stream)
    want = torch.cat([inputs[p][r * 32 : (r + 1) * 32] for p in range(w)])
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    with pytest.raises(devcomm.InvalidArgument, match="on cpu"):
        comm._native.all_to_all(OnlyDlpack(out.cpu()), OnlyCai(inputs[r]), stream)
