#!/usr/bin/env python3
"""Draws a devcomm trace (Chrome / Perfetto JSON from `devcomm trace`) as a timeline PNG: one
row per (rank, track), each complete event ("X") a bar, coloured by name. For a picture in
the docs where no trace viewer is at hand (matplotlib needed); open the JSON itself in
https://ui.perfetto.dev for the interactive view.

    usage: trace_plot.py TRACE.json OUT.png [--last-call] [--max-rows N]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--last-call", action="store_true", help="only the events of the last call id")
    ap.add_argument("--max-rows", type=int, default=48)
    a = ap.parse_args()
    d = json.load(open(a.trace))
    events = d["traceEvents"] if isinstance(d, dict) else d
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    bars = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if a.last_call:
        calls = [e.get("args", {}).get("call") for e in bars if e.get("args", {}).get("call") is not None]
        if calls:
            last = max(calls)
            bars = [e for e in bars if e.get("args", {}).get("call") in (None, last)]
            t_lo = min(e["ts"] for e in bars if e.get("args", {}).get("call") == last)
            bars = [e for e in bars if e["ts"] + e["dur"] >= t_lo]
    if not bars:
        raise SystemExit("no complete events in the trace")
    rows = sorted({(e["pid"], e["tid"]) for e in bars})[: a.max_rows]
    index = {r: i for i, r in enumerate(rows)}
    t0 = min(e["ts"] for e in bars)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({e["name"] for e in bars})
    cmap = plt.get_cmap("tab20")
    colour = {k: cmap(i % 20) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(12, 0.22 * len(rows) + 1.5))
    for e in bars:
        r = (e["pid"], e["tid"])
        if r in index:
            ax.barh(index[r], e["dur"], left=e["ts"] - t0, height=0.8, color=colour[e["name"]])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {p} {names.get((p, t), t)}" for p, t in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("us")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[k]) for k in kinds]
    ax.legend(handles, kinds, fontsize=6, loc="upper right", ncol=2)
    ax.set_title(a.trace.rsplit("/", 1)[-1])
    fig.tight_layout()
    fig.savefig(a.out, dpi=130)


if __name__ == "__main__":
    main()
