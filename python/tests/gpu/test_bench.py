"""`python -m devcomm.bench`'s core (devcomm/bench.py) on two tiny sizes with few samples: every
library listed (timed, or with the reason it was not), every check passed, and every timed
result with its bandwidths and its ratio to devcomm. Ranks sharing a GPU time devcomm alone
(NCCL refuses two ranks on one device): there the NCCL and symmetric-memory entries carry
their reasons."""

import json
import os

import pytest
import torch
import torch.distributed as dist

from devcomm import _bench_report as rep
from devcomm import bench


@pytest.fixture(scope="module")
def process_group(comm):
    """The benchmark needs torch.distributed (its gloo group agrees on checks and maxima, and
    the NCCL groups are new groups): a gloo process group over a file store, since
    `devcomm launch`'s MASTER_PORT already hosts devcomm's own store."""
    if dist.is_initialized():
        yield
        return
    # The launcher is every rank's parent: one file per run.
    path = f"/tmp/devcomm-bench-test-{os.getppid()}-{os.environ.get('MASTER_PORT', '0')}"
    if comm.rank == 0 and os.path.exists(path):
        os.remove(path)
    comm.host_barrier()
    dist.init_process_group("gloo", store=dist.FileStore(path, comm.world_size), rank=comm.rank, world_size=comm.world_size)
    yield
    comm.host_barrier()
    dist.destroy_process_group()
    if comm.rank == 0 and os.path.exists(path):
        os.remove(path)


# All-reduce only: after the reduce-scatter and all-gather runs (which graph-capture PyTorch's
# symmetric-memory ops of those collectives), torch 2.11 aborted the process at exit in
# ~MemPool (`captures_underway.empty()` assertion) although every check had passed (4 H200s,
# 2026-11-27; docs/PYTHON.md, "Benchmarks").
@pytest.mark.parametrize("op", ["all_reduce"])
def test_bench_core_reports_every_library_and_ratio(comm, process_group, op, tmp_path):
    assert rep.check_env(dict(os.environ)) is not None  # the launcher's environment passes the guard
    args = bench.parse_args([op, "--sizes", "4K,64K", "--iters", "3", "--warmup", "1"])
    doc = bench.Bench(comm, args).run()
    torch.cuda.synchronize()
    comm.check()
    assert rep.validate(doc) == []
    assert doc["failures"] == 0, [r for r in doc["results"] if r["check"] != "ok"]
    assert set(doc["libraries"]) == set(rep.LIBRARIES)
    sizes = {r["bytes"] for r in doc["results"]}
    assert len(sizes) == 2
    # devcomm on both kinds of memory: timed in both modes at both sizes in both dtypes, and
    # the registered result bitwise equal to the ordinary one (its check says so).
    for name in ("devcomm", "devcomm_registered"):
        rows = [r for r in doc["results"] if r["library"] == name]
        assert len(rows) == 2 * 2 * 2, rows
        assert all(r["check"] == "ok" and r["us"] > 0 and isinstance(r["ratio"], float) for r in rows), rows
    assert all(r["ratio"] == 1.0 for r in doc["results"] if r["library"] == "devcomm")
    assert doc["memory"].startswith("comm.")
    for name, info in doc["libraries"].items():
        rows = [r for r in doc["results"] if r["library"] == name]
        if not info["available"]:
            assert info["reason"] and not rows, (name, info)
            continue
        assert info["label"] and rows, (name, info)
        for r in rows:  # timed with a ratio, or skipped at this size or mode with the reason
            assert (r["us"] and isinstance(r["ratio"], float)) or r["check"].startswith("skipped: "), r
    if doc["meaningful"]:  # a GPU per rank: NCCL runs here
        assert doc["libraries"]["nccl"]["available"] and doc["libraries"]["nccl_pinned"]["available"]
    else:
        assert "share a GPU" in doc["libraries"]["nccl"]["reason"]
    path = tmp_path / f"{op}.json"
    path.write_text(json.dumps(doc))
    assert rep.validate(json.loads(path.read_text())) == []
    if comm.rank == 0:
        print(rep.format_table(doc["results"]))
