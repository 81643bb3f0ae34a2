"""The pure parts of `python -m devcomm.bench` (docs/PYTHON.md, "Benchmarks"): sizes, the
environment guard, nccl-tests' bandwidths, ratios, the table and the JSON document's shape.

No torch and no GPU here, so that all of it is tested on any machine
(python/tests/test_bench_report.py); `devcomm.bench` does the timing.
"""

import math
import re

OPS = ("all_reduce", "reduce_scatter", "all_gather")
DTYPES = ("bf16", "f32")
ELEM_BYTES = {"bf16": 2, "f32": 4}
MODES = ("eager", "graph")

# Every library the benchmark knows, in table order; each appears in the JSON document, timed
# or with the reason it was not.
LIBRARIES = (
    "devcomm",
    "devcomm_registered",
    "nccl",
    "nccl_pinned",
    "symm_mem_one_shot",
    "symm_mem_two_shot",
    "symm_mem_low_contention",
)
BASELINE = "devcomm"

# Multicast (NVLink SHARP) stays off for every library: what is compared is NVLink peer
# access alone, as devcomm uses it. The benchmark sets these where absent and refuses to run
# where one holds another value.
REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# vLLM's batch-invariant NCCL settings (vllm/model_executor/layers/batch_invariant.py sets
# these, with others, before its process group). NCCL_ALGO and NCCL_PROTO are strings NCCL
# reads when a communicator is created (ncclTopoTuneModel, through ncclGetEnv), so they may be
# set around one group's creation; `allreduce:tree` pins all-reduce alone (Tree has no
# reduce-scatter or all-gather: a bare `Tree` makes those calls fail). The channel counts are
# NCCL_PARAMs, read once per process and cached (src/include/param.h), so a second
# communicator cannot take them from the environment: it gets them from its ncclConfig_t
# (minCTAs = maxCTAs = 1 bound the channel count the same way, init.cc), or the whole process
# takes them (`--nccl-pinned-process`).
PINNED_PER_COMM = {"NCCL_ALGO": "allreduce:tree", "NCCL_PROTO": "Simple"}
PINNED_PROCESS = dict(PINNED_PER_COMM, NCCL_MIN_NCHANNELS="1", NCCL_MAX_NCHANNELS="1")

MIN_BYTES = 8
MAX_BYTES = 1 << 30

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


class BenchError(ValueError):
    """A bad option or environment, with the offending value in the message."""


def check_env(environ):
    """Sets the multicast switches in `environ` (a dict-like, e.g. os.environ) where absent;
    raises BenchError naming every variable set to another value. Returns the names set."""
    wrong = [f"{k}={environ[k]!r} (needs {v!r})" for k, v in REQUIRED_ENV.items() if k in environ and environ[k] != v]
    if wrong:
        raise BenchError("multicast must stay off for this benchmark: " + ", ".join(wrong))
    added = [k for k in REQUIRED_ENV if k not in environ]
    for k in added:
        environ[k] = REQUIRED_ENV[k]
    return added


def parse_bytes(text):
    """'8', '4K', '1MiB', '2g' -> bytes (binary units); BenchError otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m and m.group(2).lower()
    if not m or unit not in _UNITS:
        raise BenchError(f"bad size {text!r}: a whole number with an optional unit K, M, G (KiB, MiB, GiB)")
    value = int(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise BenchError(f"bad size {text!r}: must be > 0")
    return value


def doubling(lo, hi):
    """Every power of two from 8 B to 1 GiB within [lo, hi]."""
    out, b = [], MIN_BYTES
    while b <= min(hi, MAX_BYTES):
        if b >= lo:
            out.append(b)
        b *= 2
    return out


def parse_sizes(spec, max_bytes=MAX_BYTES):
    """`--sizes`: None (the doubling sweep 8 B..1 GiB), 'LO:HI' (the doubling sweep between
    them) or a comma list ('8,4K,1M'); sizes above `max_bytes` are dropped. Sorted, unique;
    BenchError when nothing remains."""
    if spec is None or str(spec).strip() == "":
        sizes = doubling(MIN_BYTES, MAX_BYTES)
    elif ":" in spec:
        lo, hi = (parse_bytes(p) for p in spec.split(":", 1))
        if lo > hi:
            raise BenchError(f"bad --sizes {spec!r}: {lo} B > {hi} B")
        sizes = doubling(lo, hi)
    else:
        sizes = [parse_bytes(p) for p in spec.split(",") if p.strip()]
    kept = sorted({s for s in sizes if s <= max_bytes})
    if not kept:
        raise BenchError(f"no size left from --sizes {spec!r} at --max-bytes {max_bytes}")
    return kept


def point(op, nominal, dtype, world):
    """(bytes, count) of one size, as nccl-tests and `devcomm bench` count them: `count` is
    the call's element count (the all-reduce buffer, the reduce-scatter output shard, the
    all-gather input shard) and `bytes` the largest buffer (the all-reduce buffer, the
    reduce-scatter input, the all-gather output), rounded down to whole elements per rank.
    None when the size holds less than one element per rank."""
    if op not in OPS:
        raise BenchError(f"unknown op {op!r} ({', '.join(OPS)})")
    if dtype not in ELEM_BYTES:
        raise BenchError(f"unknown dtype {dtype!r} ({', '.join(DTYPES)})")
    if world < 1:
        raise BenchError(f"world size {world} < 1")
    elems = nominal // ELEM_BYTES[dtype]
    count = elems if op == "all_reduce" else elems // world
    if count == 0:
        return None
    total = count if op == "all_reduce" else count * world
    return total * ELEM_BYTES[dtype], count


def bus_factor(op, world):
    """nccl-tests' bus-bandwidth factor: 2(n-1)/n for all-reduce (the data crosses the links
    twice), (n-1)/n for reduce-scatter and all-gather."""
    n = float(world)
    return 2.0 * (n - 1.0) / n if op == "all_reduce" else (n - 1.0) / n


def algbw_gbps(nbytes, us):
    """Algorithm bandwidth, GB/s (10^9 B/s): `nbytes` (the size as `point` counts it) over the
    time."""
    return nbytes / us / 1e3 if us and us > 0 else None


def busbw_gbps(op, world, nbytes, us):
    a = algbw_gbps(nbytes, us)
    return None if a is None else a * bus_factor(op, world)


def ratio(ref_us, devcomm_us):
    """reference time / devcomm time: above 1, devcomm is faster."""
    if not ref_us or not devcomm_us or ref_us <= 0 or devcomm_us <= 0:
        return None
    return ref_us / devcomm_us


def calls_per_sample(nbytes):
    """Back-to-back calls between two events (and calls per captured graph): enough that one
    sample lasts well over the launch gap; as `devcomm bench` (timing.rs)."""
    return max(1, min(50, (64 << 20) // max(nbytes, 1)))


def rotation_sets(set_bytes, total=128 << 20, most=8):
    """Input sets to rotate among so that one pass over them exceeds the L2 cache (50 MiB on
    H100 and H200) where it can: up to `most` sets, `total` bytes together."""
    return max(1, min(most, -(-total // max(set_bytes, 1))))


def median(xs):
    s = sorted(xs)
    if not s:
        return None
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def human(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def fill_derived(results, op, world):
    """Adds algbw, busbw and the ratio to devcomm (same dtype, size and mode) to every timed
    result, in place; returns `results`."""
    base = {(r["dtype"], r["bytes"], r["mode"]): r["us"] for r in results if r["library"] == BASELINE and r.get("us")}
    for r in results:
        us = r.get("us")
        r["algbw_gbps"] = algbw_gbps(r["bytes"], us)
        r["busbw_gbps"] = busbw_gbps(op, world, r["bytes"], us)
        r["ratio"] = ratio(us, base.get((r["dtype"], r["bytes"], r["mode"])))
    return results


def _fmt(x, spec):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_table(results, libraries=LIBRARIES):
    """The short table rank 0 prints: per dtype, mode and size, each library's time in us and
    its ratio to devcomm (reference time / devcomm time), and devcomm's bus bandwidth."""
    libs = [lib for lib in libraries if any(r["library"] == lib and r.get("us") for r in results)]
    if not libs:
        return "(no library was timed)"
    lines = []
    keys = sorted({(r["dtype"], r["mode"]) for r in results}, key=lambda k: (DTYPES.index(k[0]) if k[0] in DTYPES else 9, k[1]))
    for dtype, mode in keys:
        rows = [r for r in results if r["dtype"] == dtype and r["mode"] == mode]
        head = f"{'bytes':>9} | " + " | ".join(f"{lib[:22]:>22}" for lib in libs) + " | devcomm busbw GB/s"
        lines += ["", f"{dtype} {mode}: us per call (ratio: time / devcomm's time)", head, "-" * len(head)]
        for nbytes in sorted({r["bytes"] for r in rows}):
            by = {r["library"]: r for r in rows if r["bytes"] == nbytes}
            cells = []
            for lib in libs:
                r = by.get(lib)
                if r is None or not r.get("us"):
                    cells.append(f"{'-':>22}")
                else:
                    mark = "" if r.get("check", "ok") == "ok" else " !"
                    rat = "" if lib == BASELINE else f" ({_fmt(r.get('ratio'), '.2f')})"
                    cells.append(f"{_fmt(r['us'], '.1f') + rat + mark:>22}")
            bus = by.get(BASELINE, {}).get("busbw_gbps")
            lines.append(f"{human(nbytes):>9} | " + " | ".join(cells) + f" | {_fmt(bus, '.1f')}")
    return "\n".join(lines).lstrip("\n")


_RESULT_KEYS = {"library": str, "mode": str, "dtype": str, "bytes": int, "count": int, "check": str}
_DERIVED = ("us", "algbw_gbps", "busbw_gbps", "ratio")


def validate(doc):
    """The problems of a benchmark JSON document (an empty list when it is well formed): the
    top-level fields, every library of LIBRARIES listed (timed or with a reason), and every
    result with its time, bandwidths and ratio (None only where it has no time, or no devcomm
    time to compare with)."""
    problems = []
    for key in ("op", "world_size", "device", "date", "meaningful", "memory", "libraries", "results"):
        if key not in doc:
            problems.append(f"missing top-level key {key!r}")
    if problems:
        return problems
    if doc["op"] not in OPS:
        problems.append(f"op {doc['op']!r} not one of {OPS}")
    libs = doc["libraries"]
    for lib in LIBRARIES:
        entry = libs.get(lib)
        if entry is None:
            problems.append(f"library {lib!r} not listed")
        elif not entry.get("available") and not entry.get("reason"):
            problems.append(f"library {lib!r} not available and no reason given")
    timed_base = {(r.get("dtype"), r.get("bytes"), r.get("mode")) for r in doc["results"] if r.get("library") == BASELINE and r.get("us")}
    for i, r in enumerate(doc["results"]):
        for key, kind in _RESULT_KEYS.items():
            if not isinstance(r.get(key), kind):
                problems.append(f"result {i}: {key!r} missing or not {kind.__name__}")
        for key in _DERIVED:
            if key not in r:
                problems.append(f"result {i}: {key!r} missing")
        if r.get("library") not in LIBRARIES:
            problems.append(f"result {i}: unknown library {r.get('library')!r}")
        if r.get("mode") not in MODES:
            problems.append(f"result {i}: unknown mode {r.get('mode')!r}")
        if r.get("us") is not None:
            for key in ("algbw_gbps", "busbw_gbps"):
                if not isinstance(r.get(key), float):
                    problems.append(f"result {i}: timed but {key!r} is {r.get(key)!r}")
            if (r.get("dtype"), r.get("bytes"), r.get("mode")) in timed_base and not isinstance(r.get("ratio"), float):
                problems.append(f"result {i}: timed beside devcomm but no ratio")
    return problems
