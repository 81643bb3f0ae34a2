#!/usr/bin/env python3
"""Checks a `devcomm trace` file headless with Perfetto's trace processor: it loads, and a query
finds kernel slices on every rank (docs/TRACING.md, "Checking a trace").

    usage: scripts/trace_check.py TRACE.json --ranks N [--shell PATH/trace_processor_shell]

Needs the `perfetto` Python package; its TraceProcessor runs `trace_processor_shell`, which it
downloads on first use unless --shell names one (machines without internet access: copy the
binary from https://get.perfetto.dev/trace_processor beforehand). Prints the kernel slices,
phases and waits per rank and exits non-zero when a rank has no kernel slice.
"""

import argparse
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--shell", help="path of trace_processor_shell (else the package's download)")
    args = ap.parse_args()
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    except ImportError:
        sys.exit("the perfetto package is missing: pip install perfetto")
    config = TraceProcessorConfig(bin_path=args.shell) if args.shell else TraceProcessorConfig()
    tp = TraceProcessor(trace=args.trace, config=config)
    rows = list(tp.query(QUERY))
    kernels = {}
    for r in rows:
        print(f"rank {r.rank}: {r.n:6d} {r.cat or '-':7s} slices, {(r.dur or 0) / 1e3:12.1f} us in all")
        if r.cat == "kernel":
            kernels[r.rank] = r.n
    missing = [r for r in range(args.ranks) if not kernels.get(r)]
    tp.close()
    if missing:
        sys.exit(f"FAIL: no kernel slices on rank(s) {missing}")
    print(f"OK: kernel slices on every one of {args.ranks} ranks")


if __name__ == "__main__":
    main()
