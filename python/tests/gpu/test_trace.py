"""Tracing from Python (docs/TRACING.md): eager calls appear under their own names in
torch.profiler; without DEVCOMM_TRACE=1 there are no device events."""

import os

import torch


def test_eager_calls_are_named_in_the_torch_profiler(comm):
    t = torch.ones(1024, device=comm.device)
    out = torch.empty(comm.world_size * 8, device=comm.device)
    inp = torch.ones(comm.world_size * 8, device=comm.device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        comm.all_reduce(t)
        comm.all_to_all_single(out, inp)
    comm.synchronize()
    names = {e.name for e in prof.events()}
    assert {"devcomm::all_reduce", "devcomm::all_to_all_single"} <= names, sorted(names)
    # Outside the profiler the methods run unwrapped (no range is recorded, nothing fails).
    comm.all_reduce(t)
    comm.synchronize()


def test_trace_events_follow_the_setting(comm):
    events = comm.trace_events()
    if os.environ.get("DEVCOMM_TRACE", "0") in ("", "0"):
        assert events is None
        assert not comm._native.tracing
    else:
        assert set(events) >= {"rank", "calls", "events", "clock_offset_ns", "dropped"}
