#!/usr/bin/env python3
"""The public methods of `Comm`, as docs/ARCHITECTURE.md lists them ("API naming").

usage: scripts/comm_methods.py [--write] [DOC]   (DOC: docs/ARCHITECTURE.md)

Reads every `pub fn` / `pub unsafe fn` of an `impl Comm` block in crates/devcomm/src/comm/,
and renders them: the data-moving calls as a matrix of operation by variant (the suffix rule
above the list), the rest by file. Without --write it fails when DOC's list (between the
`comm-methods` markers) is not what the code has, so a method added, removed or renamed
updates the list in the same change (`--write` rewrites it).
"""
import glob
import os
import re
import sys

SRC = "crates/devcomm/src/comm"
BEGIN, END = "<!-- comm-methods:begin -->", "<!-- comm-methods:end -->"
# Operations (rows) and variants (columns, suffix order as in "API naming").
OPS = ["send", "recv", "sendrecv", "all_to_all", "all_to_all_v", "all_reduce",
       "reduce_scatter", "all_gather"]
VARIANTS = ["", "_hooked", "_in_place", "_hooked_in_place", "_registered", "_raw",
            "_hooked_raw", "_registered_raw"]


def methods(src=SRC):
    """(name, unsafe, file) of every public method of `Comm`."""
    out = []
    for path in sorted(glob.glob(os.path.join(src, "*.rs"))):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        for m in re.finditer(r"^impl(?:<[^>]*>)? Comm(?:<[^>]*>)? \{", text, re.M):
            i, depth = m.end(), 1
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            for f in re.finditer(r"^    pub (unsafe )?fn (\w+)", text[m.end():i], re.M):
                out.append((f.group(2), bool(f.group(1)), os.path.basename(path)))
    return sorted(out)


def render(ms):
    names = {n for n, _, _ in ms}
    moving = {op + v for op in OPS for v in VARIANTS} & names
    lines = [f"{len(ms)} public methods: {len(moving)} move data (the matrix: `x` where the "
             "variant exists), the others below by file.", "",
             "| operation | " + " | ".join(f"`{v}`" if v else "(plain)" for v in VARIANTS) + " |",
             "|---|" + "---|" * len(VARIANTS)]
    for op in OPS:
        cells = ["x" if op + v in names else "" for v in VARIANTS]
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    lines.append("")
    by_file = {}
    for n, unsafe, f in ms:
        if n not in moving:
            by_file.setdefault(f, []).append(f"`{n}`" + (" (unsafe)" if unsafe else ""))
    for f in sorted(by_file):
        lines.append(f"- `comm/{f}`: " + ", ".join(by_file[f]))
    return "\n".join(lines)


def main():
    args = [a for a in sys.argv[1:] if a != "--write"]
    doc = args[0] if args else "docs/ARCHITECTURE.md"
    with open(doc, encoding="utf-8") as fh:
        text = fh.read()
    if BEGIN not in text or END not in text:
        sys.exit(f"{doc}: no {BEGIN} ... {END} section")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    want = f"{BEGIN}\n{render(methods())}\n{END}"
    new = head + want + tail
    if "--write" in sys.argv:
        with open(doc, "w", encoding="utf-8") as fh:
            fh.write(new)
        return
    if new != text:
        sys.exit(f"{doc}: the list of Comm's public methods is not the code's; "
                 "run scripts/comm_methods.py --write")
    print(f"{doc}: Comm's {len(methods())} public methods listed")


if __name__ == "__main__":
    main()
