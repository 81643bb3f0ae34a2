"""The pure parts of `python -m devcomm.bench` (devcomm/_bench_report.py): no torch, no GPU."""

import math
import sys

import pytest

from devcomm import _bench_report as rep


def test_bench_report_imports_no_torch():
    assert "torch" not in sys.modules


@pytest.mark.parametrize(
    "text,value",
    [("8", 8), ("4K", 4096), ("4kib", 4096), ("1MiB", 1 << 20), ("3m", 3 << 20), ("1G", 1 << 30), (" 2 GB ", 2 << 30)],
)
def test_parse_bytes(text, value):
    assert rep.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "x", "1.5M", "-4", "0", "4T", "K"])
def test_parse_bytes_refuses(text):
    with pytest.raises(rep.BenchError, match="bad size"):
        rep.parse_bytes(text)


def test_default_sizes_double_from_8_bytes_to_1_gib():
    sizes = rep.parse_sizes(None)
    assert sizes[0] == 8 and sizes[-1] == 1 << 30 and len(sizes) == 28
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))


def test_sizes_range_list_and_max_bytes():
    assert rep.parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert rep.parse_sizes("1000:5000") == [1024, 2048, 4096]  # the powers of two between
    assert rep.parse_sizes("4K,8,4K,1M") == [8, 4096, 1 << 20]  # sorted, unique
    assert rep.parse_sizes(None, max_bytes=64) == [8, 16, 32, 64]
    assert rep.parse_sizes("8,1M", max_bytes=4096) == [8]
    with pytest.raises(rep.BenchError, match="no size left"):
        rep.parse_sizes("1M", max_bytes=1024)
    with pytest.raises(rep.BenchError, match="8192 B > 1024 B"):
        rep.parse_sizes("8K:1K")


def test_point_counts_as_nccl_tests():
    assert rep.point("all_reduce", 1024, "bf16", 4) == (1024, 512)
    assert rep.point("all_reduce", 8, "f32", 8) == (8, 2)
    # Reduce-scatter: the input is the size, the count the output shard.
    assert rep.point("reduce_scatter", 1024, "f32", 4) == (1024, 64)
    # Rounded down to whole elements per rank: 3 ranks of 85 bf16 elements.
    assert rep.point("all_gather", 512, "bf16", 3) == (510, 85)
    assert rep.point("all_gather", 8, "f32", 4) is None  # less than one element per rank
    with pytest.raises(rep.BenchError, match="unknown op 'all_to_all'"):
        rep.point("all_to_all", 8, "f32", 2)
    with pytest.raises(rep.BenchError, match="unknown dtype 'f16'"):
        rep.point("all_reduce", 8, "f16", 2)


def test_bus_bandwidth_factors():
    assert rep.bus_factor("all_reduce", 2) == 1.0
    assert rep.bus_factor("all_reduce", 4) == 1.5
    assert rep.bus_factor("all_reduce", 8) == 1.75
    assert rep.bus_factor("reduce_scatter", 4) == 0.75
    assert rep.bus_factor("all_gather", 8) == 0.875
    # 1 GiB in 4523 us on 4 ranks: BASELINES.md's 356 GB/s for NCCL through PyTorch.
    assert round(rep.busbw_gbps("all_reduce", 4, 1 << 30, 4523.0)) == 356
    assert math.isclose(rep.algbw_gbps(1_000_000, 10.0), 100.0)
    assert rep.algbw_gbps(1024, None) is None and rep.algbw_gbps(1024, 0.0) is None


def test_ratio_is_reference_over_devcomm():
    assert rep.ratio(20.0, 10.0) == 2.0
    assert rep.ratio(None, 10.0) is None and rep.ratio(5.0, 0.0) is None


def test_calls_and_rotation_sets():
    assert rep.calls_per_sample(8) == 50 and rep.calls_per_sample(2 << 20) == 32 and rep.calls_per_sample(1 << 30) == 1
    assert rep.rotation_sets(8) == 8 and rep.rotation_sets(32 << 20) == 4 and rep.rotation_sets(1 << 30) == 1


def test_median():
    assert rep.median([3.0, 1.0, 2.0]) == 2.0
    assert rep.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert rep.median([]) is None


def test_env_guard_sets_missing_and_refuses_other_values():
    env = {"NCCL_NVLS_ENABLE": "0"}
    added = rep.check_env(env)
    assert added == ["TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"]
    assert env == rep.REQUIRED_ENV
    assert rep.check_env(env) == []
    bad = {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}
    with pytest.raises(rep.BenchError) as e:
        rep.check_env(bad)
    assert "NCCL_NVLS_ENABLE='1'" in str(e.value) and "TORCH_SYMM_MEM_DISABLE_MULTICAST='0'" in str(e.value)
    assert "NVSHMEM_DISABLE_NVLS" not in bad  # nothing set when refusing


def test_pinned_settings_leave_reduce_scatter_and_all_gather_free():
    assert rep.PINNED_PER_COMM == {"NCCL_ALGO": "allreduce:tree", "NCCL_PROTO": "Simple"}
    assert rep.PINNED_PROCESS["NCCL_MIN_NCHANNELS"] == rep.PINNED_PROCESS["NCCL_MAX_NCHANNELS"] == "1"


def _results():
    rows = []
    for mode, dc, nc in (("eager", 10.0, 40.0), ("graph", 5.0, 12.5)):
        rows.append({"library": "devcomm", "mode": mode, "dtype": "bf16", "bytes": 1 << 20, "count": 1 << 19, "us": dc, "check": "ok"})
        rows.append({"library": "nccl", "mode": mode, "dtype": "bf16", "bytes": 1 << 20, "count": 1 << 19, "us": nc, "check": "ok"})
        rows.append({"library": "symm_mem_two_shot", "mode": mode, "dtype": "bf16", "bytes": 1 << 20, "count": 1 << 19, "us": None,
                     "check": "skipped: RuntimeError: no"})
    return rows


def _doc(results):
    libs = {name: {"available": True, "label": name, "reason": ""} for name in rep.LIBRARIES}
    libs["nccl_pinned"] = {"available": False, "label": "", "reason": "ranks share a GPU"}
    return {"op": "all_reduce", "world_size": 4, "device": "GPU", "date": "2026-11-28", "meaningful": True,
            "memory": "comm.alloc_registered", "libraries": libs, "results": results}


def test_derived_fields_and_schema():
    rows = rep.fill_derived(_results(), "all_reduce", 4)
    nccl = [r for r in rows if r["library"] == "nccl"]
    assert [r["ratio"] for r in nccl] == [4.0, 2.5]
    dc = rows[0]
    assert math.isclose(dc["algbw_gbps"], (1 << 20) / 10.0 / 1e3)
    assert math.isclose(dc["busbw_gbps"], dc["algbw_gbps"] * 1.5)
    assert dc["ratio"] == 1.0
    skipped = [r for r in rows if r["us"] is None]
    assert all(r["ratio"] is None and r["busbw_gbps"] is None for r in skipped)
    assert rep.validate(_doc(rows)) == []


def test_schema_names_what_is_missing():
    rows = rep.fill_derived(_results(), "all_reduce", 4)
    doc = _doc(rows)
    del doc["libraries"]["symm_mem_one_shot"]
    doc["libraries"]["nccl_pinned"]["reason"] = ""
    rows[1]["ratio"] = None
    del rows[2]["busbw_gbps"]
    rows[3]["mode"] = "compiled"
    problems = rep.validate(doc)
    assert "library 'symm_mem_one_shot' not listed" in problems
    assert "library 'nccl_pinned' not available and no reason given" in problems
    assert "result 1: timed beside devcomm but no ratio" in problems
    assert "result 2: 'busbw_gbps' missing" in problems
    assert "result 3: unknown mode 'compiled'" in problems
    assert rep.validate({"op": "all_reduce"})[0] == "missing top-level key 'world_size'"


def test_table_shows_times_ratios_and_failed_checks():
    rows = rep.fill_derived(_results(), "all_reduce", 4)
    rows[1]["check"] = "failed: relative error 0.5 > 0.01"
    table = rep.format_table(rows)
    lines = table.splitlines()
    assert lines[0] == "bf16 eager: us per call (ratio: time / devcomm's time)"
    assert "devcomm" in lines[1] and "nccl" in lines[1] and "symm_mem_two_shot" not in lines[1]  # never timed
    eager = lines[3]
    assert eager.lstrip().startswith("1 MiB") and "10.0" in eager and "40.0 (4.00) !" in eager
    assert eager.rstrip().endswith("| 157.3")  # devcomm: 1 MiB in 10 us, x 1.5 on 4 ranks (GB/s)
    assert "12.5 (2.50)" in table and "bf16 graph" in table
    assert rep.format_table([]) == "(no library was timed)"
    assert rep.human(1 << 30) == "1 GiB" and rep.human(510) == "510 B" and rep.human(3 << 10) == "3 KiB"


def test_command_line():
    from devcomm import bench

    a = bench.parse_args(["reduce_scatter", "--sizes", "1K:4K", "--dtypes", "f32", "--modes", "graph"])
    assert (a.op, a.size_list, a.dtype_list, a.mode_list, a.iters) == ("reduce_scatter", [1024, 2048, 4096], ["f32"], ["graph"], 50)
    assert a.lib_list == list(rep.LIBRARIES)
    assert bench.parse_args(["all_gather", "--max-bytes", "64"]).size_list == [8, 16, 32, 64]
    for bad in (["all_to_all"], ["all_reduce", "--libs", "nccl,gloo"], ["all_reduce", "--dtypes", "f16"],
                ["all_reduce", "--sizes", "1Q"], ["all_reduce", "--iters", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert "torch" not in sys.modules


def test_main_refuses_multicast_before_importing_torch(monkeypatch, capsys):
    from devcomm import bench

    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    assert bench.main(["all_reduce"]) == 2
    assert "NCCL_NVLS_ENABLE='1' (needs '0')" in capsys.readouterr().err
    assert "torch" not in sys.modules


def test_all_gather_check_splits_chunks_at_shards():
    from devcomm.bench import _shards

    assert _shards(0, 10, 4) == [(0, 0, 4), (1, 0, 4), (2, 0, 2)]
    assert _shards(6, 5, 4) == [(1, 2, 2), (2, 0, 3)]
