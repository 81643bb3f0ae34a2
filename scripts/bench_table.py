#!/usr/bin/env python3
"""Renders devcomm benchmark JSON records (the shape every `devcomm bench` writes) as a
markdown table: python3 scripts/bench_table.py FILE.json [FILE.json ...]"""
import json
import sys


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:g} {unit}"
        n /= 1024
    return str(n)


def size(b):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def table(path):
    rows = json.load(open(path))
    if not rows:
        return ""
    r0 = rows[0]
    out = [f"`{path.split('/')[-1]}`: {r0['op']}, {r0['world_size']} ranks, {r0['device']}, {r0['date']}", ""]
    out.append("| bytes | both ways | devcomm us | reference us | devcomm GB/s | reference GB/s | ratio | SMs | config | reference |")
    out.append("|---:|:-:|---:|---:|---:|---:|---:|---:|---|---|")
    def num(x, fmt):  # NaN (no reference) is written as null
        return "-" if x is None or x != x else format(x, fmt)

    # Files with several operations or token counts (the MoE benchmark) name both per row.
    ops = {r["op"] for r in rows}
    if len(ops) > 1 or any(r.get("tokens") for r in rows):
        out[2] = "| op | tokens " + out[2]
        out[3] = "|---|---:" + out[3]
    for r in rows:
        lead = f"| {r['op']} | {r.get('tokens') or '-'} " if out[2].startswith("| op") else ""
        out.append(
            lead + f"| {size(r['bytes'])} | {'yes' if r['both_directions'] else 'no'} | {r['devcomm_us']:.2f} | "
            f"{num(r['nccl_us'], '.2f')} | {num(r['devcomm_gbps'], '.1f')} | {num(r['nccl_gbps'], '.1f')} | "
            f"{num(r['ratio'], '.2f')} | {r['sms']} | {r.get('config', '')} | {r['reference']} |"
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print("\n".join(table(p) for p in sys.argv[1:]))
