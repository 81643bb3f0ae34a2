#!/usr/bin/env python3
"""Fails when a module of the library imports one from a layer above it.

usage: scripts/check_layers.py [SRC_DIR] [EXCEPTIONS]
       (defaults: crates/devcomm/src, scripts/layer-exceptions.txt)

The layers are the table at the top of SRC_DIR/lib.rs: rows `//! | <layer> | <modules> | <what> |`
in order from the bottom; the modules column names the top-level modules of that layer in
backticks. Every top-level module that lib.rs declares must be in exactly one row. A module's
import is a `crate::<module>` path (or `crate::{<module>, ...}`) in its code, comments and test
files (`tests.rs`, `*_tests.rs`, `tests/`) left out; an import of a module in a higher row is an
error unless EXCEPTIONS lists it as a line `<from> -> <to>: <why>`. A listed exception that no
longer occurs is an error too, so the list only shrinks.
"""
import os
import re
import sys

ROW = re.compile(r"^//! \| ([^|]+?) \| ([^|]+?) \| .* \|\s*$", re.M)
DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)


def layers(lib_text):
    """Module -> row index, from lib.rs's layer table (header and rule rows skipped)."""
    out = {}
    rows = [r for r in ROW.findall(lib_text) if r[0].strip() not in ("layer", "---")]
    for i, (_, modules) in enumerate(rows):
        for name in re.findall(r"`(\w+)`", modules):
            if name in out:
                raise SystemExit(f"lib.rs's layer table names `{name}` twice")
            out[name] = i
    return out


def source_files(src, module):
    """The non-test .rs files of a top-level module (`m.rs` and everything under `m/`)."""
    files = []
    if os.path.exists(os.path.join(src, module + ".rs")):
        files.append(os.path.join(src, module + ".rs"))
    for d, dirs, fs in os.walk(os.path.join(src, module)):
        dirs[:] = [x for x in dirs if x != "tests"]
        files += [os.path.join(d, f) for f in fs if f.endswith(".rs")]
    return [f for f in files if not (f.endswith("tests.rs") or f.endswith("_tests.rs"))]


def imports(path):
    """Top-level modules named by `crate::` paths in a file's code."""
    with open(path, encoding="utf-8") as fh:
        text = "\n".join(line.split("//")[0] for line in fh)
    names = set(re.findall(r"\bcrate::(\w+)", text))
    for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
        names.update(re.findall(r"(?:^|,)\s*(\w+)", group))
    return names


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "crates/devcomm/src"
    exceptions_path = sys.argv[2] if len(sys.argv) > 2 else "scripts/layer-exceptions.txt"
    with open(os.path.join(src, "lib.rs"), encoding="utf-8") as fh:
        lib = fh.read()
    layer = layers(lib)
    declared = set(DECL.findall(lib))
    errors = [f"module `{m}` is not in lib.rs's layer table" for m in sorted(declared - set(layer))]
    errors += [f"lib.rs's layer table names `{m}`, which lib.rs does not declare"
               for m in sorted(set(layer) - declared)]
    allowed = {}
    with open(exceptions_path, encoding="utf-8") as fh:
        for line in fh:
            line = line.split("#")[0].strip()
            if line:
                m = re.match(r"(\w+)\s*->\s*(\w+)\s*:\s*\S", line)
                if not m:
                    raise SystemExit(f"{exceptions_path}: not `<from> -> <to>: <why>`: {line}")
                allowed[(m.group(1), m.group(2))] = False
    for module in sorted(layer):
        for path in source_files(src, module):
            for target in sorted(imports(path)):
                if target not in layer or layer[target] <= layer[module]:
                    continue
                if (module, target) in allowed:
                    allowed[(module, target)] = True
                    continue
                rel = os.path.relpath(path, src)
                errors.append(f"{rel}: `{module}` (row {layer[module]}) imports `{target}` "
                              f"(row {layer[target]}), a layer above it")
    errors += [f"{exceptions_path}: `{a} -> {b}` no longer occurs: remove it"
               for (a, b), seen in sorted(allowed.items()) if not seen]
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        sys.exit(1)
    print(f"layers: {len(layer)} modules in order, {len(allowed)} listed exception(s)")


if __name__ == "__main__":
    main()
