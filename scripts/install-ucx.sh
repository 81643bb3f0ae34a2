#!/usr/bin/env bash
# Installs UCX (libucp and its transports) from the libucx-cu13 wheel for the network transport
# and its tests, unless a system UCX is already on the loader path.
#
#   scripts/install-ucx.sh            installs into .tools/ucx (git-ignored)
#   DEVCOMM_UCX_PREFIX=DIR scripts/install-ucx.sh   installs into DIR instead
#   DEVCOMM_UCX_FORCE_WHEEL=1 ...     installs the wheel even where a system UCX exists
#
# Prints, on its last line, the directory that holds libucp.so: put it in DEVCOMM_UCX_LIB (or
# on LD_LIBRARY_PATH). UCX finds its transport modules (ucx/ beside libucp) relative to its own
# library, so UCX_MODULE_DIR need not be set.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${DEVCOMM_UCX_PREFIX:-$repo/.tools/ucx}"
version="${DEVCOMM_UCX_VERSION:-1.22.*}"

if [[ "${DEVCOMM_UCX_FORCE_WHEEL:-0}" != 1 ]] && ldconfig -p 2>/dev/null | grep -q 'libucp\.so\.0 '; then
  lib="$(ldconfig -p | awk '/libucp\.so\.0 / {print $NF; exit}')"
  echo "install-ucx: a system UCX is installed ($lib); nothing to do" >&2
  dirname "$lib"
  exit 0
fi

libdir="$prefix/libucx/lib"
if [[ ! -e "$libdir/libucp.so" && ! -e "$libdir/libucp.so.0" ]]; then
  echo "install-ucx: installing libucx-cu13==$version into $prefix" >&2
  mkdir -p "$prefix"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$prefix" "libucx-cu13==$version" >&2
fi
if [[ ! -e "$libdir/libucp.so" && ! -e "$libdir/libucp.so.0" ]]; then
  echo "install-ucx: libucp.so not found under $libdir after the install" >&2
  exit 1
fi
if [[ ! -d "$libdir/ucx" ]]; then
  echo "install-ucx: the transport modules ($libdir/ucx) are missing" >&2
  exit 1
fi
echo "$libdir"
