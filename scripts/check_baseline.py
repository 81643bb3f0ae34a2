#!/usr/bin/env python3
"""Compares new `devcomm bench` results against a baseline of headline ratios
(docs/benchmarks/<device-kind>/baseline.json) and prints every regression.

  python3 scripts/check_baseline.py BASELINE.json RESULT.json [RESULT.json ...] [--tolerance 0.10]

A baseline entry names one measurement (op, world_size, both_directions, reference, bytes) and
the ratio NCCL time / devcomm time it had. Every result record with the same five fields is
compared: a ratio below baseline x (1 - tolerance) is a regression, one above baseline x
(1 + tolerance) an improvement (printed, so that the baseline can be renewed). Where a result
file holds the same measurement more than once (repeated processes), the median ratio counts.
Exit status: 0 without regressions, 1 with one or more, 2 when nothing in the results matched
the baseline (wrong device kind or file). The tolerance defaults to the baseline's own
"tolerance" field, else 0.10.

  python3 scripts/check_baseline.py --make OUT.json --device KIND --commit HASH \\
      --sizes 8,64K,1M,1G RESULT.json [...]

writes a baseline from result files: one entry per record whose size is listed (`all` keeps
every size), the median ratio where a measurement repeats; --append adds to an existing
baseline (results of another file or commit), refusing a measurement it already holds.
"""
import argparse
import json
import statistics
import sys

KEY = ("op", "world_size", "both_directions", "reference", "bytes")


def parse_size(text):
    text = text.strip()
    for suffix, shift in (("K", 10), ("M", 20), ("G", 30)):
        if text.upper().endswith(suffix):
            return int(text[:-1]) << shift
    return int(text)


def size_name(b):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def key_of(record):
    missing = [k for k in KEY if k not in record]
    if missing:
        raise ValueError(f"record without {', '.join(missing)}: {record}")
    return tuple(record[k] for k in KEY)


def load_records(paths):
    """Maps each measurement key to the ratios of every record with that key."""
    ratios = {}
    for path in paths:
        with open(path) as f:
            rows = json.load(f)
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of bench records")
        for r in rows:
            ratio = r.get("ratio")
            if ratio is None or ratio != ratio:  # NaN: no reference timing
                continue
            ratios.setdefault(key_of(r), []).append(float(ratio))
    return ratios


def describe(key):
    op, world, both, reference, nbytes = key
    way = "both ways" if both else "one way"
    return f"{op} {size_name(nbytes)} {way}, {world} ranks, against {reference}"


def check(baseline, results, tolerance):
    """Returns (regressions, improvements, matched) as lists of printable lines."""
    regressions, improvements, matched = [], [], []
    for entry in baseline["entries"]:
        key = key_of(entry)
        got = results.get(key)
        if not got:
            continue
        ratio = statistics.median(got)
        base = float(entry["ratio"])
        line = f"{describe(key)}: {ratio:.3f} against {base:.3f} ({entry.get('file', '?')})"
        matched.append(line)
        if ratio < base * (1 - tolerance):
            regressions.append(line)
        elif ratio > base * (1 + tolerance):
            improvements.append(line)
    return regressions, improvements, matched


def dumps(baseline):
    """One entry a line, so that a renewed baseline reads as a short diff."""
    head = {k: v for k, v in baseline.items() if k != "entries"}
    lines = [json.dumps(e) for e in baseline["entries"]]
    body = json.dumps(head, indent=1)[:-2]
    return body + ',\n "entries": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def make(args):
    sizes = None if args.sizes == "all" else {parse_size(s) for s in args.sizes.split(",")}
    entries = []
    for path in args.results:
        for key, ratios in load_records([path]).items():
            if sizes is not None and key[4] not in sizes:
                continue
            entry = dict(zip(KEY, key))
            entry["ratio"] = round(statistics.median(ratios), 3)
            entry["file"] = path.split("/")[-1]
            entry["commit"] = args.commit
            entries.append(entry)
    if not entries:
        sys.exit("no record of the listed sizes in the result files")
    out = {"device": args.device, "tolerance": args.tolerance if args.tolerance is not None else 0.10, "entries": []}
    if args.append:
        with open(args.make) as f:
            out = json.load(f)
    known = {key_of(e) for e in out["entries"]}
    clash = [describe(key_of(e)) for e in entries if key_of(e) in known]
    if clash:
        sys.exit(f"{args.make} already has: {'; '.join(clash)}")
    out["entries"].extend(entries)
    with open(args.make, "w") as f:
        f.write(dumps(out))
    print(f"{args.make}: {len(entries)} entries added, {len(out['entries'])} in all")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="BASELINE.json RESULT.json ... (or, with --make, RESULT.json ...)")
    p.add_argument("--tolerance", type=float, default=None, help="relative slack, default the baseline's or 0.10")
    p.add_argument("--make", metavar="OUT.json", help="write a baseline from the result files instead")
    p.add_argument("--device", default="", help="with --make: the device kind, e.g. nvidia-h200-x2")
    p.add_argument("--commit", default="", help="with --make: the commit the results were measured with")
    p.add_argument("--append", action="store_true", help="with --make: add to an existing baseline")
    p.add_argument("--sizes", default="all", help="with --make: sizes to keep (8,64K,1M,1G) or all")
    args = p.parse_args()
    if args.tolerance is not None and not 0 <= args.tolerance < 1:
        sys.exit(f"--tolerance must be in [0, 1), got {args.tolerance}")
    if args.make:
        args.results = args.files
        make(args)
        return 0
    if len(args.files) < 2:
        sys.exit("usage: check_baseline.py BASELINE.json RESULT.json [RESULT.json ...]")
    with open(args.files[0]) as f:
        baseline = json.load(f)
    tolerance = args.tolerance if args.tolerance is not None else float(baseline.get("tolerance", 0.10))
    results = load_records(args.files[1:])
    regressions, improvements, matched = check(baseline, results, tolerance)
    if not matched:
        print(f"nothing in {', '.join(args.files[1:])} matches {args.files[0]} "
              f"(device {baseline.get('device', '?')})", file=sys.stderr)
        return 2
    print(f"{len(matched)} headline figures compared (tolerance {tolerance:.0%}, "
          f"baseline of {baseline.get('device', '?')})")
    for line in regressions:
        print(f"REGRESSION  {line}")
    for line in improvements:
        print(f"improved    {line}")
    if not regressions:
        print("no regression")
    return 1 if regressions else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"check_baseline: {e}")
