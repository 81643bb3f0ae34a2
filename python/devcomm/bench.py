"""`python -m devcomm.bench OP`: devcomm's reductions against what a PyTorch user has, side by
side in the same processes on the same input data (docs/PYTHON.md, "Benchmarks").

    torchrun --nproc-per-node 4 -m devcomm.bench all_reduce --json ar.json --plot ar.png
    devcomm launch -n 4 -- python3 -m devcomm.bench reduce_scatter --sizes 1K:64M

OP is all_reduce, reduce_scatter or all_gather (sum), or `moe` (MoE dispatch + combine against
torch.distributed on NCCL; `python -m devcomm.bench moe --help`). Libraries: devcomm on ordinary tensors
and on registered memory; torch.distributed on NCCL with default settings and pinned as vLLM's
batch-invariant mode pins it; PyTorch's symmetric memory (one-shot, two-shot, low-contention,
whichever the op has). Each in eager mode and replayed from a CUDA graph. Per size: fresh data
from a formula every rank can recompute, one checked call of each library against a float64
reference, then every library timed in turn (CUDA events around back-to-back calls, median;
the slowest rank's median). Multicast stays off (`_bench_report.REQUIRED_ENV`).
"""

import argparse
import datetime
import json
import os
import sys

from . import _bench_report as rep

# Relative error ||out - ref|| / ||ref|| allowed against the float64 reference: a few
# roundings of the element type (docs: /work/.library/device/METHOD.md's bands).
TOLERANCE = {"bf16": 1e-2, "f32": 1e-5}
# Elements of the reference computed at once (float64: 128 MiB).
REF_CHUNK = 1 << 24
# Free device memory left for what NCCL, symmetric memory and graphs allocate lazily.
HEADROOM = 2 << 30


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m devcomm.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("op", choices=rep.OPS)
    ap.add_argument("--dtypes", default="bf16,f32", help="comma list of bf16, f32 (default both)")
    ap.add_argument("--sizes", default=None, help="LO:HI (doubling sweep) or a comma list, e.g. 8,4K,1M (default 8:1G)")
    ap.add_argument("--max-bytes", default=str(rep.MAX_BYTES), help="largest size (default 1G)")
    ap.add_argument("--iters", type=int, default=50, help="timed samples per library and size (median)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed samples first")
    ap.add_argument("--libs", default=",".join(rep.LIBRARIES), help="comma list of libraries to run")
    ap.add_argument("--modes", default="eager,graph", help="eager, graph or both")
    ap.add_argument("--nccl-pinned-process", action="store_true",
                    help="pin every NCCL communicator of the process as vLLM does (also the channel "
                         "counts through the environment) instead of the second group only; "
                         "the default-settings NCCL is then not timed")
    ap.add_argument("--json", help="write the results here (rank 0)")
    ap.add_argument("--plot", help="write a PNG of time against size here (rank 0; needs matplotlib)")
    args = ap.parse_args(argv)
    try:
        args.dtype_list = _choices(args.dtypes, rep.DTYPES, "--dtypes")
        args.lib_list = _choices(args.libs, rep.LIBRARIES, "--libs")
        args.mode_list = _choices(args.modes, rep.MODES, "--modes")
        args.size_list = rep.parse_sizes(args.sizes, rep.parse_bytes(args.max_bytes))
        if args.iters < 1 or args.warmup < 0:
            raise rep.BenchError(f"--iters {args.iters} must be >= 1 and --warmup {args.warmup} >= 0")
    except rep.BenchError as e:
        ap.error(str(e))
    return args


def _choices(text, allowed, what):
    got = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in got if x not in allowed]
    if bad or not got:
        raise rep.BenchError(f"{what} {text!r}: {', '.join(bad) or 'empty'}; choose from {', '.join(allowed)}")
    return got


def rank_data(torch, rank, start, n, dtype, seed, device):
    """Rank `rank`'s input elements [start, start + n): a hash of the index, rank and seed in
    [-1, 1), cast to `dtype`. Any rank recomputes any rank's data, chunk by chunk (no second
    communication library for the reference, and no host copy of a whole buffer)."""
    h = torch.arange(start, start + n, device=device, dtype=torch.int64)
    h = (h * 0x9E3779B1 + (rank + 1) * 0x85EBCA77 + seed * 0xC2B2AE3D) & 0xFFFFFFFF
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h = h ^ (h >> 12)
    return ((h & 0xFFFF).to(torch.float32) / 32768.0 - 1.0).to(dtype)


class Bench:
    """One run on this rank: the communicator, the libraries and a gloo group for the
    benchmark's own host-side agreement (maxima, checks)."""

    def __init__(self, comm, args):
        import torch
        import torch.distributed as dist

        from . import _bench_libs as libs

        if not dist.is_initialized():
            raise RuntimeError("devcomm.bench needs torch.distributed initialised (any backend); main() does it")
        self.torch, self.dist, self.libs_mod = torch, dist, libs
        self.comm, self.args = comm, args
        self.world, self.rank, self.device = comm.world_size, comm.rank, comm.device
        self.agg = dist.new_group(backend="gloo")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        # NCCL refuses two ranks on one GPU; symmetric memory there is untested. Ranks that
        # share a GPU time devcomm alone, as a smoke test (`meaningful: false`).
        self.shared = local > torch.cuda.device_count()
        self.info = {}
        self.libraries = self._make_libraries()

    def _note(self, name, available, label="", reason=""):
        self.info[name] = {"available": available, "label": label, "reason": reason}

    def _make_libraries(self):
        libs, want, op = self.libs_mod, set(self.args.lib_list), self.args.op
        made = []
        for name in rep.LIBRARIES:
            if name not in want:
                self._note(name, False, reason="not selected (--libs)")
        for cls in (libs.Devcomm, libs.DevcommRegistered):
            if cls.name in want:
                lib = cls(self.comm)
                made.append(lib)
                self._note(lib.name, True, lib.label)
        nccl_names = [n for n in ("nccl", "nccl_pinned") if n in want]
        if nccl_names and self.shared:
            for n in nccl_names:
                self._note(n, False, reason="ranks share a GPU: NCCL refuses two ranks on one device")
        elif nccl_names:
            default, pinned, how = libs.nccl_groups(self.args.nccl_pinned_process, self.device)
            if "nccl" in want:
                if default is None:
                    self._note("nccl", False, reason="--nccl-pinned-process: every NCCL communicator of this run is pinned")
                else:
                    made.append(libs.Nccl("nccl", "torch.distributed on NCCL, default settings", default))
                    self._note("nccl", True, made[-1].label)
            if "nccl_pinned" in want:
                if pinned is None:
                    self._note("nccl_pinned", False, reason=how)
                else:
                    made.append(libs.Nccl("nccl_pinned", f"torch.distributed on NCCL pinned as vLLM's batch-invariant mode: {how}", pinned))
                    self._note("nccl_pinned", True, made[-1].label)
            self.symm_group = default or pinned
        for variant in ("one_shot", "two_shot", "low_contention"):
            name = f"symm_mem_{variant}"
            if name not in want:
                continue
            if self.shared:
                self._note(name, False, reason="ranks share a GPU: symmetric memory is timed on a GPU per rank only")
                continue
            try:
                lib = libs.SymmMem(variant, op, getattr(self, "symm_group", None) or self.dist.group.WORLD)
            except libs.Skip as e:
                self._note(name, False, reason=str(e))
                continue
            made.append(lib)
            self._note(name, True, lib.label)
        return made

    # --- host-side agreement --------------------------------------------------------------

    def max_over_ranks(self, values):
        t = self.torch.tensor(values, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.agg)
        return t.tolist()

    def gather(self, obj):
        out = [None] * self.world
        self.dist.all_gather_object(out, obj, group=self.agg)
        return out

    # --- one size -------------------------------------------------------------------------

    def fits(self, p_bytes):
        """Whether a size's buffers fit: the plain slab, one per library with memory of its
        own, the reference's chunks and headroom, on the rank with the least free memory."""
        free, _ = self.torch.cuda.mem_get_info(self.device)
        free = -self.max_over_ranks([-float(free)])[0]
        if self.shared:
            free //= self.world
        sets = rep.rotation_sets(2 * p_bytes)
        own = sum(1 for lib in self.libraries if not lib.uses_plain)
        return (1 + own) * sets * 2 * p_bytes + REF_CHUNK * 8 * 3 + HEADROOM <= free

    def run_point(self, dtype_name, nbytes, count, seed):
        torch = self.torch
        dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
        op = self.args.op
        in_bytes = count * self.world * dtype.itemsize if op == "reduce_scatter" else count * dtype.itemsize
        p = self.libs_mod.Point(op, dtype, count, self.world, rep.rotation_sets(in_bytes + nbytes), self.device)

        def fill(t):
            t.copy_(rank_data(torch, self.rank, 0, t.numel(), dtype, seed, self.device))

        status, ready = {}, []
        for lib in self.libraries:
            try:
                lib.prepare(p, fill)
                ready.append(lib)
            except Exception as e:  # noqa: BLE001 - recorded, and the same on every rank
                status[lib.name] = f"skipped: {type(e).__name__}: {e}"
        self.torch.cuda.synchronize(self.device)
        status.update(self.check(p, ready, fill, dtype_name, seed))
        # A library that failed its check is still timed (and marked): only one that did not
        # run is left out.
        timed = [lib for lib in ready if not status.get(lib.name, "skipped").startswith("skipped")]
        times = self.time(p, timed, nbytes)
        for lib in ready:
            lib.release()
        torch.cuda.synchronize(self.device)
        self.comm.host_barrier()
        out = []
        for lib in self.libraries:
            for mode in self.args.mode_list:
                us = times.get((lib.name, mode))
                check = status.get(lib.name, "skipped")
                if us is None and (lib.name, mode) in times.get("errors", {}):
                    check = times["errors"][(lib.name, mode)]
                out.append({"library": lib.name, "mode": mode, "dtype": dtype_name, "bytes": nbytes,
                            "count": count, "us": us, "check": check})
        return out

    def check(self, p, ready, fill, dtype_name, seed):
        """One call of each library on set 0 with fresh data and a poisoned output, against
        the float64 reference; devcomm on registered memory bitwise against devcomm on
        ordinary tensors; devcomm's all-reduce and all-gather identical on every rank. The
        verdicts agreed over the ranks (a failure on any rank is every rank's)."""
        torch = self.torch
        verdict, base = {}, None
        for lib in ready:
            inp, out = lib.bufs[0]
            fill(inp)
            if out.data_ptr() != inp.data_ptr():
                out.fill_(float("nan"))
            try:
                lib.call(0)
                torch.cuda.synchronize(self.device)
            except Exception as e:  # noqa: BLE001 - an argument refused before any transfer
                verdict[lib.name] = f"skipped: {type(e).__name__}: {e}"
                continue
            res = lib.result(0)
            verdict[lib.name] = self.compare(res, dtype_name, seed)
            if lib.name == "devcomm":
                base = res.clone()
                if p.op != "reduce_scatter":
                    verdict["devcomm/ranks"] = _checksum(torch, res)
            elif lib.name == "devcomm_registered" and base is not None and not torch.equal(res, base):
                diff = int((res != base).sum())
                verdict[lib.name] = f"failed: {diff} elements differ from devcomm on ordinary tensors (must be bitwise equal)"
        agreed = {}
        everyone = self.gather(verdict)
        sums = {v.get("devcomm/ranks") for v in everyone}
        for name in verdict:
            if name == "devcomm/ranks":
                continue
            bad = [(r, v.get(name, "skipped: not run")) for r, v in enumerate(everyone) if v.get(name) != "ok"]
            agreed[name] = "ok" if not bad else f"{bad[0][1]} (rank {bad[0][0]})"
        if "devcomm" in agreed and len(sums) > 1 and agreed["devcomm"] == "ok":
            agreed["devcomm"] = "failed: the ranks' results differ (devcomm reduces in rank order: they must be identical)"
        return agreed

    def compare(self, res, dtype_name, seed):
        """'ok' or 'failed: ...' for this rank's output against the float64 reference."""
        torch, op, w, r = self.torch, self.args.op, self.world, self.rank
        dtype = res.dtype
        n = res.numel()
        num = den = 0.0
        for a in range(0, n, REF_CHUNK):
            m = min(REF_CHUNK, n - a)
            got = res[a : a + m]
            if op == "all_gather":
                # Chunks may straddle two ranks' shards: build the expected chunk piecewise.
                want = torch.cat([rank_data(torch, q, s, k, dtype, seed, self.device) for q, s, k in _shards(a, m, n // w)])
                if not torch.equal(got, want):
                    bad = int((got != want).sum()) if not got.isnan().any() else int(got.isnan().sum())
                    return f"failed: {bad} elements of [{a}, {a + m}) differ from the inputs (all-gather must copy exactly)"
                continue
            start = a + (r * n if op == "reduce_scatter" else 0)
            ref = sum(rank_data(torch, q, start, m, dtype, seed, self.device).double() for q in range(w))
            num += float(((got.double() - ref) ** 2).sum())
            den += float((ref**2).sum())
        if op == "all_gather":
            return "ok"
        rel = (num / den) ** 0.5 if den > 0 else float("inf")
        tol = TOLERANCE[dtype_name]
        if not rel <= tol:  # NaN (an element not written) fails too
            return f"failed: relative error {rel:.3g} > {tol:g} against the float64 reference"
        return "ok"

    def time(self, p, libs, nbytes):
        """Median us per call of every (library, mode), libraries in turn: each sample starts
        after a host barrier; rounds alternate forward and backward so that drift falls on all
        alike. A graph holds `calls` calls; eager samples make the same calls between events."""
        torch = self.torch
        calls = rep.calls_per_sample(nbytes)
        cands, errors = [], {}
        for lib in libs:
            sets = len(lib.bufs)

            def eager(lib=lib, sets=sets):
                for j in range(calls):
                    lib.call(j % sets)

            if "eager" in self.args.mode_list:
                cands.append(((lib.name, "eager"), eager))
            if "graph" in self.args.mode_list:
                try:
                    graph = torch.cuda.CUDAGraph()
                    torch.cuda.synchronize(self.device)
                    # thread_local: NCCL's watchdog thread queries events while we capture.
                    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                        eager()
                    torch.cuda.synchronize(self.device)
                    cands.append(((lib.name, "graph"), graph.replay))
                except Exception as e:  # noqa: BLE001 - recorded for this mode and size
                    errors[(lib.name, "graph")] = f"skipped: capture failed: {type(e).__name__}: {e}"
        # A capture that failed on one rank leaves the others with a graph their peers never
        # replay: agree on the candidates first.
        failed = set().union(*self.gather(sorted(errors)))
        cands = [c for c in cands if c[0] not in failed]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = {key: [] for key, _ in cands}
        for rnd in range(self.args.warmup + self.args.iters):
            for key, fn in cands if rnd % 2 == 0 else cands[::-1]:
                self.comm.host_barrier()
                start.record()
                fn()
                end.record()
                end.synchronize()
                if rnd >= self.args.warmup:
                    samples[key].append(start.elapsed_time(end) * 1e3 / calls)
        keys = [key for key, _ in cands]
        worst = self.max_over_ranks([rep.median(samples[k]) for k in keys]) if keys else []
        out = dict(zip(keys, worst))
        out["errors"] = {k: errors.get(k, "skipped: capture failed on another rank") for k in failed}
        return out

    def run(self):
        results = []
        seed = 1
        for dtype_name in self.args.dtype_list:
            for nominal in self.args.size_list:
                pt = rep.point(self.args.op, nominal, dtype_name, self.world)
                if pt is None:
                    continue
                nbytes, count = pt
                if not self.fits(nbytes):
                    if self.rank == 0:
                        print(f"devcomm.bench: {dtype_name} {rep.human(nbytes)} does not fit in device memory; larger sizes skipped", flush=True)
                    break
                seed += 1
                got = self.run_point(dtype_name, nbytes, count, seed)
                results += got
                if self.rank == 0:
                    print(_progress(got), flush=True)
        rep.fill_derived(results, self.args.op, self.world)
        return self.document(results)

    def document(self, results):
        torch = self.torch
        from . import __version__

        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - reporting only
            nccl = None
        registered = next((lib.how for lib in self.libraries if lib.name == "devcomm_registered"), None)
        return {
            "op": self.args.op,
            "redop": None if self.args.op == "all_gather" else "sum",
            "world_size": self.world,
            "device": torch.cuda.get_device_name(self.device),
            "meaningful": not self.shared,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "torch": torch.__version__,
            "nccl": nccl,
            "devcomm": __version__,
            "symm_mem_backend": self.libs_mod.symm_backend(self.device),
            "memory": registered or "not run",
            "iters": self.args.iters,
            "warmup": self.args.warmup,
            "env": {k: os.environ.get(k) for k in sorted(os.environ) if k.startswith(("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_", "DEVCOMM_"))},
            "ratio": "reference time / devcomm time, same dtype, size and mode (above 1: devcomm faster)",
            "bytes": "the all-reduce buffer, the reduce-scatter input, the all-gather output (nccl-tests' size)",
            "libraries": self.info,
            "results": results,
            "failures": sum(1 for r in results if r["check"].startswith("failed")),
        }


def _shards(a, m, shard):
    """(rank, start, n) pieces of all-gather output elements [a, a + m) with `shard` per rank."""
    out = []
    while m > 0:
        q, s = divmod(a, shard)
        k = min(m, shard - s)
        out.append((q, s, k))
        a, m = a + k, m - k
    return out


def _checksum(torch, t):
    """Two sums of the output's bits (exactly equal outputs give equal sums)."""
    bits = t.view({2: torch.int16, 4: torch.int32}[t.element_size()]).to(torch.int64)
    weights = torch.arange(1, bits.numel() + 1, device=t.device, dtype=torch.int64) % 1021
    return (int(bits.sum()), int((bits * weights).sum()))


def _progress(rows):
    if not rows:
        return "devcomm.bench: no library to run"
    r0 = rows[0]
    cells = [f"{r['library']}/{r['mode']} {r['us']:.1f}" for r in rows if r["us"] is not None]
    bad = [f"{r['library']}: {r['check']}" for r in rows if r["check"] != "ok" and r["mode"] == "eager"]
    return f"{r0['dtype']} {rep.human(r0['bytes'])}: " + ", ".join(cells) + (" | " + "; ".join(bad) if bad else "")


def plot(doc, path):
    """Time against size per library and mode, one panel per dtype; None, or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no plot: matplotlib is not installed ({e})"
    dtypes = sorted({r["dtype"] for r in doc["results"]})
    fig, axes = plt.subplots(1, max(1, len(dtypes)), figsize=(7 * max(1, len(dtypes)), 5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        for lib in rep.LIBRARIES:
            for mode in rep.MODES:
                pts = sorted((r["bytes"], r["us"]) for r in doc["results"]
                             if r["library"] == lib and r["mode"] == mode and r["dtype"] == dtype and r["us"])
                if pts:
                    ax.plot(*zip(*pts), marker="o", markersize=3, linestyle="-" if mode == "eager" else "--", label=f"{lib} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("us per call")
        ax.set_title(f"{doc['op']} {dtype}, {doc['world_size']} ranks, {doc['device']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["moe"]:
        # MoE dispatch + combine against torch.distributed's path (its own options).
        from . import _bench_moe

        return _bench_moe.main(argv[1:])
    args = parse_args(argv)
    try:
        added = rep.check_env(os.environ)
    except rep.BenchError as e:
        print(f"devcomm.bench: {e}", file=sys.stderr)
        return 2
    if args.nccl_pinned_process:
        os.environ.update(rep.PINNED_PROCESS)
    # torch only now: the environment above is in place before anything reads it.
    import torch
    import torch.distributed as dist

    import devcomm

    if "RANK" not in os.environ or not torch.cuda.is_available():
        print("devcomm.bench: start it with torchrun or `devcomm launch`, one process per GPU, on a GPU machine", file=sys.stderr)
        return 2
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group(backend="gloo")
    comm = devcomm.init()
    if comm.rank == 0 and added:
        print(f"devcomm.bench: set {', '.join(f'{k}={rep.REQUIRED_ENV[k]}' for k in added)}", flush=True)
    bench = Bench(comm, args)
    if comm.rank == 0:
        for name, info in bench.info.items():
            print(f"devcomm.bench: {name}: {info['label'] if info['available'] else 'not run: ' + info['reason']}", flush=True)
    doc = bench.run()
    comm.synchronize()
    rc = 0
    if comm.rank == 0:
        print(rep.format_table(doc["results"]))
        problems = rep.validate(doc)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
        if args.plot:
            why = plot(doc, args.plot)
            if why:
                print(f"devcomm.bench: {why}")
        if problems:
            print("devcomm.bench: malformed results: " + "; ".join(problems), file=sys.stderr)
            rc = 1
        if doc["failures"]:
            print(f"devcomm.bench: {doc['failures']} results failed their check (marked '!')", file=sys.stderr)
            rc = 1
        if not doc["meaningful"]:
            print("devcomm.bench: ranks share a GPU: a smoke test; the times say nothing of NVLink")
    rc = int(bench.max_over_ranks([rc])[0])
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
