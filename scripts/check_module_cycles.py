#!/usr/bin/env python3
"""Fails when the modules of a Rust source tree import each other in a circle.

usage: scripts/check_module_cycles.py SRC_DIR...   (e.g. crates/devcomm-cli/src)

A module is a file (`a/b.rs` or `a/b/mod.rs` is `a::b`); an edge is a `crate::`, `super::` or
`self::` path in its code (comments left out) that names another module, leaving out a module's own ancestors and
descendants (a parent's re-exports and its children are one unit). Any strongly connected set
of two or more modules is printed and the script exits with 1.
"""
import os
import re
import sys


def modules(root):
    mods = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(dirpath, f)
                parts = os.path.relpath(path, root)[:-3].split(os.sep)
                if parts[-1] in ("mod", "main", "lib"):
                    parts = parts[:-1]
                mods["::".join(parts)] = path
    return mods


def resolve(mods, cur, path):
    segs = path.split("::")
    base = cur.split("::") if cur else []
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] == "super":
        base, segs = base[:-1], segs[1:]
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
    else:  # self
        segs = segs[1:]
    for i in range(len(segs), -1, -1):
        m = "::".join(base + segs[:i])
        if m in mods:
            return m
    return None


def related(a, b):
    return a == b or not a or not b or a.startswith(b + "::") or b.startswith(a + "::")


def cycles(root):
    mods = modules(root)
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        with open(path, encoding="utf-8") as fh:
            # Comments (doc links included) name modules without importing them.
            text = "\n".join(line.split("//")[0] for line in fh)
        for use in re.findall(r"\b(?:crate|super|self)(?:::\w+)+", text):
            t = resolve(mods, m, use)
            if t is not None and not related(m, t):
                edges[m].add(t)
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return len(mods), found


def main():
    bad = False
    for root in sys.argv[1:]:
        n, found = cycles(root)
        for comp in found:
            print(f"error: modules of {root} import each other in a circle: {', '.join(comp)}")
            bad = True
        if not found:
            print(f"{root}: {n} modules, no import circle")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
