#!/usr/bin/env python3
"""One line per record of benchmark JSON files: file, op, bytes, devcomm us, reference us, ratio.
Usage: python3 scripts/bench_brief.py FILE.json..."""
import json
import os
import sys


def size(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return f"{b}B"


for path in sys.argv[1:]:
    try:
        records = json.load(open(path))
    except (OSError, ValueError) as err:
        print(f"{path}: {err}")
        continue
    name = os.path.basename(path)
    for r in records:
        print(f"{name:24s} {r['op'][:28]:28s} {size(r['bytes']):>8s} "
              f"{r['devcomm_us']:9.2f} {'-' if r.get('nccl_us') is None else format(r['nccl_us'], '9.2f'):>9s} "
              f"{'-' if r.get('ratio') is None else format(r['ratio'], '5.2f'):>5s}")
