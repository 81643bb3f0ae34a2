"""Registered buffers without a GPU or torch: the native checks the zero-copy operations make
before anything runs (a tensor inside a registration, send offsets), and the state of a
`devcomm.Registration` (refused after deregistration)."""

import pytest

import devcomm
from devcomm._native import check_send_offset, locate_in

BASE, SIZE = 0x10000, 4096


def tup(ptr, shape, dtype="float32", strides=None, device=0):
    return (ptr, dtype, shape, strides, device)


def test_a_tensor_inside_the_registration_is_located():
    assert locate_in(tup(BASE, (1024,)), BASE, SIZE) == 0
    assert locate_in(tup(BASE + 64, (16,)), BASE, SIZE) == 64
    assert locate_in(tup(BASE + SIZE - 8, (2,)), BASE, SIZE) == SIZE - 8


@pytest.mark.parametrize(
    "ptr, shape",
    [
        (BASE - 4, (4,)),  # starts before
        (BASE + SIZE - 4, (2,)),  # ends after
        (BASE + SIZE, (1,)),  # just past
        (BASE, (1025,)),  # one element too many
    ],
)
def test_a_tensor_not_inside_is_refused(ptr, shape):
    with pytest.raises(devcomm.InvalidArgument, match="does not lie inside the registration"):
        locate_in(tup(ptr, shape), BASE, SIZE)


def test_located_tensors_are_checked_like_any_operand():
    with pytest.raises(devcomm.InvalidArgument, match="not contiguous"):
        locate_in(tup(BASE, (4, 4), strides=(1, 4)), BASE, SIZE)
    with pytest.raises(devcomm.InvalidArgument, match="cuda:1"):
        locate_in(tup(BASE, (4,), device=1), BASE, SIZE, 0)
    with pytest.raises(devcomm.InvalidArgument, match="cpu"):
        locate_in(tup(BASE, (4,), device="cpu"), BASE, SIZE)
    # A range that wraps around the address space is not inside anything.
    with pytest.raises(devcomm.InvalidArgument, match="does not lie inside"):
        locate_in(tup(2**64 - 8, (4,)), 2**64 - 16, 16)


def test_send_offsets_must_be_whole_elements():
    check_send_offset(0, 4, 1024)
    check_send_offset(4096, 8, 8)
    with pytest.raises(devcomm.InvalidArgument, match="not a multiple of the message's 4-byte elements"):
        check_send_offset(2, 4, 1024)
    with pytest.raises(devcomm.InvalidArgument, match="overflow"):
        check_send_offset(2**64 - 16, 1, 32)


class FakeComm:
    """Stands in for `devcomm.Comm`: records deregistrations (the real one is collective)."""

    _ordinal = 0

    def __init__(self):
        self.deregistered = []

    def _deregister(self, rid):
        if rid in self.deregistered:
            raise devcomm.InvalidArgument(f"deregister: registration {rid} was deregistered")
        self.deregistered.append(rid)

    def _describe(self, t):
        return t


def test_a_registration_refuses_use_after_deregistration():
    comm = FakeComm()
    reg = devcomm.Registration(comm, 3, BASE, SIZE, tensor=None)
    assert reg._check("send_registered", comm) == 3
    assert reg.offset_of(tup(BASE + 8, (2,))) == 8
    assert reg.contains(tup(BASE, (4,))) and not reg.contains(tup(BASE - 4, (4,)))
    reg.deregister()
    assert comm.deregistered == [3] and not reg.live
    with pytest.raises(devcomm.InvalidArgument, match="registration 3 was deregistered"):
        reg._check("send_registered", comm)
    with pytest.raises(devcomm.InvalidArgument, match="deregistered"):
        reg.offset_of(tup(BASE, (4,)))
    assert not reg.contains(tup(BASE, (4,)))
    # A second deregistration still goes to the communicator (collective: every rank fails).
    with pytest.raises(devcomm.InvalidArgument):
        reg.deregister()


def test_a_registration_belongs_to_its_communicator():
    a, b = FakeComm(), FakeComm()
    reg = devcomm.Registration(a, 1, BASE, SIZE, tensor=None)
    with pytest.raises(devcomm.InvalidArgument, match="another communicator"):
        reg._check("recv_registered", b)
    with pytest.raises(devcomm.InvalidArgument, match="not a devcomm.Registration"):
        devcomm.Registration._check(object(), "send_registered", a)


def test_leaving_a_with_block_deregisters_once():
    comm = FakeComm()
    with devcomm.Registration(comm, 7, BASE, SIZE, tensor=None) as reg:
        assert reg.live
    assert comm.deregistered == [7] and not reg.live
    assert "deregistered" in repr(reg)
