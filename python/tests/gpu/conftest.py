"""GPU tests: every rank is a pytest process started by `devcomm launch` (torchrun-style
variables set), e.g. `scripts/shared-gpu.sh 2 python3 -m pytest -x -q python/tests/gpu`. All
ranks run the same tests in the same order, so every collective call is matched. Inputs are
random, drawn from seeds every rank knows, so that each rank can compute the reference of what
it should receive without a second communication library."""

import os
import zlib

import pytest

import torch

import devcomm


@pytest.fixture(scope="session")
def comm():
    # Not a skip: these tests are only collected where they must run.
    if "RANK" not in os.environ or not torch.cuda.is_available():
        raise RuntimeError("the GPU tests run under `devcomm launch` on a GPU machine (docs/PYTHON.md)")
    c = devcomm.init()
    c.aborted_by_test = False
    yield c
    torch.cuda.synchronize()
    if not c.aborted_by_test:  # test_zz_timeout.py ends with an aborted communicator on purpose
        c.check()


@pytest.fixture
def seed(request):
    """A seed from the test's name: the same on every rank, new for every test."""
    return zlib.crc32(request.node.name.encode())


def rank_input(seed, rank, shape, dtype, device):
    """Rank `rank`'s input of a test, computable on every rank."""
    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + rank)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g)
    else:
        x = torch.randint(-1000, 1000, shape, generator=g)
    return x.to(dtype).to(device)
