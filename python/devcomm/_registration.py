"""`devcomm.Registration`: a buffer registered with a communicator, so that peers' kernels
write straight into it (the zero-copy routes; docs/PYTHON.md, "Registered buffers").

Made by `Comm.register(tensor)` or `Comm.alloc_registered(shape, dtype)`, both collective.
This module imports no torch, so that its state checks are testable without it.
"""

from . import _native


class Registration:
    """A registered buffer: `tensor` is the registered tensor (the user's, or the one
    `alloc_registered` made), `ptr` and `nbytes` the range registered, `id` the number every
    rank gives this registration (registrations are collective, so ids agree).

    `deregister()` is collective (every rank calls it, in the same order as the other
    collective calls); so is leaving a `with` block. Dropping the object does not deregister
    (that would be a collective call at an unknown time): the registration lasts until
    `deregister()` or until the communicator is destroyed. Any use after `deregister()` raises
    `devcomm.InvalidArgument`."""

    __slots__ = ("_comm", "id", "ptr", "nbytes", "tensor", "_live", "__weakref__")

    def __init__(self, comm, rid, ptr, nbytes, tensor):
        self._comm = comm
        self.id = rid
        self.ptr = ptr
        self.nbytes = nbytes
        self.tensor = tensor
        self._live = True

    @property
    def live(self):
        """False once deregistered."""
        return self._live

    def _check(self, op, comm):
        if not isinstance(self, Registration):
            raise _native.InvalidArgument(f"{op}: invalid argument: {self!r} is not a devcomm.Registration")
        if self._comm is not comm:
            raise _native.InvalidArgument(f"{op}: invalid argument: registration {self.id} belongs to another communicator")
        if not self._live:
            raise _native.InvalidArgument(f"{op}: invalid argument: registration {self.id} was deregistered")
        return self.id

    def offset_of(self, t):
        """The byte offset of tensor `t` in this registration; `devcomm.InvalidArgument` when
        `t` does not lie wholly inside it (or is not contiguous)."""
        self._check("offset_of", self._comm)
        return _native.locate_in(self._comm._describe(t), self.ptr, self.nbytes, self._comm._ordinal)

    def contains(self, t):
        """Whether tensor `t` lies wholly inside this (live) registration."""
        if not self._live:
            return False
        try:
            self.offset_of(t)
        except _native.InvalidArgument:
            return False
        return True

    def deregister(self):
        """Collective: releases the registration (waits for this device's work and for every
        rank; a deregistered or unknown registration on any rank fails on every rank). What
        it kept alive is released after; a tensor of `alloc_registered` stays usable as an
        ordinary tensor while referenced."""
        self._comm._deregister(self.id)
        self._live = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._live:
            self.deregister()
        return False

    def __repr__(self):
        state = "live" if self._live else "deregistered"
        return f"devcomm.Registration(id={self.id}, ptr={self.ptr:#x}, nbytes={self.nbytes}, {state})"
