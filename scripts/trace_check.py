#!/usr/bin/env python3
"""Checks a `devcomm trace` file headless with Perfetto's trace processor: it loads, and a query
finds kernel slices on every rank (docs/TRACING.md, "Checking a trace").

    usage: scripts/trace_check.py TRACE.json[.gz] --ranks N [--wasm DIR | --shell PATH]

Two ways to run the trace processor:
- --wasm DIR (the default, DIR = .tools/perfetto, installed by scripts/install-perfetto.sh):
  Perfetto's WebAssembly build under Node.js (scripts/perfetto_query.mjs);
- --shell PATH: the native trace_processor_shell through the `perfetto` Python package.
Prints the kernel slices, phases and waits per rank and exits non-zero when the trace does not
load, or a rank of 0..N-1 has no kernel slice.
"""

import argparse
import os
import subprocess
import sys

QUERY = """
select p.pid as rank, s.category as cat, count(*) as n, sum(s.dur) as dur
from slice s
join thread_track tt on s.track_id = tt.id
join thread t using (utid)
join process p using (upid)
group by p.pid, s.category
order by p.pid, s.category
"""

HERE = os.path.dirname(os.path.abspath(__file__))


def rows_wasm(trace, wasm_dir):
    """(rank, category, slices, total duration in ns) rows from the WebAssembly build."""
    query = os.path.join(HERE, "perfetto_query.mjs")
    done = subprocess.run(
        ["node", query, wasm_dir, trace, QUERY], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        sys.exit(f"FAIL: Perfetto's trace processor did not load {trace} or run the query")
    lines = done.stdout.splitlines()
    header = lines[0].split("\t")
    out = []
    for line in lines[1:]:
        r = dict(zip(header, line.split("\t")))
        dur = 0 if r["dur"] in ("null", "") else int(r["dur"])
        cat = None if r["cat"] == "null" else r["cat"]
        out.append((int(r["rank"]), cat, int(r["n"]), dur))
    return out


def rows_shell(trace, shell):
    """The same rows from the native trace_processor_shell (the `perfetto` package)."""
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    except ImportError:
        sys.exit("the perfetto package is missing: pip install perfetto")
    tp = TraceProcessor(trace=trace, config=TraceProcessorConfig(bin_path=shell))
    out = [(r.rank, r.cat, r.n, r.dur or 0) for r in tp.query(QUERY)]
    tp.close()
    return out


def missing_kernel_ranks(rows, ranks):
    """The ranks of 0..ranks-1 without a kernel slice (pure)."""
    kernels = {rank for rank, cat, n, _ in rows if cat == "kernel" and n > 0}
    return [r for r in range(ranks) if r not in kernels]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--ranks", type=int, required=True)
    group = ap.add_mutually_exclusive_group()
    group.add_argument(
        "--wasm",
        default=os.path.join(HERE, "..", ".tools", "perfetto"),
        help="folder of Perfetto's WebAssembly trace processor (scripts/install-perfetto.sh)",
    )
    group.add_argument("--shell", help="path of trace_processor_shell (the perfetto package)")
    args = ap.parse_args()
    if args.shell:
        rows = rows_shell(args.trace, args.shell)
    else:
        if not os.path.exists(os.path.join(args.wasm, "trace_processor.wasm")):
            sys.exit(f"no trace_processor.wasm in {args.wasm}: run scripts/install-perfetto.sh")
        rows = rows_wasm(args.trace, args.wasm)
    for rank, cat, n, dur in rows:
        print(f"rank {rank}: {n:6d} {cat or '-':7s} slices, {dur / 1e3:12.1f} us in all")
    missing = missing_kernel_ranks(rows, args.ranks)
    if missing:
        sys.exit(f"FAIL: no kernel slices on rank(s) {missing}")
    print(f"OK: kernel slices on every one of {args.ranks} ranks")


if __name__ == "__main__":
    main()
