"""User hooks: CUDA C++ source handed to the collectives (docs/PYTHON.md, "Hooks")."""

import re

from . import _native

# Element sizes by dtype name; torch dtypes are accepted too (their name without "torch.").
_SIZES = {
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "complex64": 8,
    "complex128": 16,
}

_STRUCT = re.compile(r"\bstruct\s+([A-Za-z_]\w*)")


def _size(dtype, what):
    name = str(dtype).removeprefix("torch.")
    if name not in _SIZES:
        raise _native.InvalidArgument(f"Hooks: invalid argument: {what} {dtype!r} is not a dtype devcomm moves")
    return _SIZES[name]


class Hooks:
    """A pair of hooks, `produce(ctx) -> tile` and `consume(ctx, tile)`, in a C++ struct in
    `source` (see crates/devcomm/cuda/devcomm/hooks.cuh and the examples). `name`: the struct
    (default: the first struct in `source`); `in_dtype` / `out_dtype`: the dtypes of the tensors
    the hooks read and write (their `In` and `Out` types must be as large). Compiled by NVRTC
    into the collective kernel the first time it is used; a compile error raises
    `devcomm.CompileError` with the hooks' own line numbers."""

    def __init__(self, source, name=None, in_dtype="float32", out_dtype=None):
        if not isinstance(source, str) or not source.strip():
            raise _native.InvalidArgument("Hooks: invalid argument: source must be CUDA C++ text")
        if name is None:
            m = _STRUCT.search(source)
            if m is None:
                raise _native.InvalidArgument("Hooks: invalid argument: no `struct NAME` in the source; pass name=")
            name = m.group(1)
        out_dtype = in_dtype if out_dtype is None else out_dtype
        self.source = source
        self.name = name
        self.in_dtype = in_dtype
        self.out_dtype = out_dtype
        self._native = _native.Hooks(name, source, _size(in_dtype, "in_dtype"), _size(out_dtype, "out_dtype"))
        self._id = None  # set when first used by a torch op (see _ops.hooks_id)

    def __repr__(self):
        return f"devcomm.Hooks({self.name!r}, in_dtype={self.in_dtype}, out_dtype={self.out_dtype})"
