#!/usr/bin/env bash
# Builds the release binary here and copies what the GPU machine runs into dist/ (git-ignored),
# so that a device run can carry it: the GPU machine has no Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
# The build folder (CARGO_TARGET_DIR, else target/).
tgt=${CARGO_TARGET_DIR:-target}
cargo build --release -p devcomm-cli
cargo build --release -p devcomm --examples
mkdir -p dist
cp "$tgt/release/devcomm" dist/devcomm
cp "$tgt/release/examples/transpose_all_to_all" "$tgt/release/examples/fp8_all_to_all" dist/
# The NCCL-compatible library and its GPU checks (docs/NCCL.md).
cargo build --release -p devcomm-nccl
cp "$tgt/release/libdevcomm_nccl.so" dist/libdevcomm_nccl.so
strip --strip-debug dist/libdevcomm_nccl.so
cp scripts/nccl-shim-check.sh scripts/nccl_shim_torch.py dist/
cp scripts/gpu-run.sh dist/gpu-run.sh
cp scripts/gpu-check.sh dist/gpu-check.sh
for ex in all_reduce_rmsnorm all_reduce_rmsnorm_fp8; do
  if [ -x "$tgt/release/examples/$ex" ]; then cp "$tgt/release/examples/$ex" dist/; fi
done
strip dist/devcomm dist/transpose_all_to_all dist/fp8_all_to_all
for ex in all_reduce_rmsnorm all_reduce_rmsnorm_fp8; do
  if [ -x "dist/$ex" ]; then strip "dist/$ex"; fi
done
# The kernels for Hopper (sm_90: H100 and H200), compiled here with the NVRTC wheel, so that the
# GPU machine starts with a warm cache (dist/kernel-cache; the GPU's NVRTC must be 13.0 too,
# which is part of the cache key: another version just compiles again).
nvrtc_lib="$(pwd)/.tools/nvrtc/nvidia/cu13/lib"
if [ ! -e "$nvrtc_lib/libnvrtc.so.13" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target .tools/nvrtc 'nvidia-cuda-nvrtc==13.0.*'
fi
# A fresh cache: entries of earlier builds would only add to what dist/ carries (64 MiB).
# DEVCOMM_STAGE_KEEP_CACHE=1 keeps it (a rebuild whose kernel sources did not change).
[ -n "${DEVCOMM_STAGE_KEEP_CACHE:-}" ] || rm -rf dist/kernel-cache
precompile() { # extra arguments of `devcomm precompile`
  LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    DEVCOMM_CACHE_DIR="$(pwd)/dist/kernel-cache" dist/devcomm precompile --arch 9.0 "$@"
}
precompile
# The collectives and reduction steps of communicators with network links (gpu-check.sh
# net-coll@N, net-red@N and the kill tests).
precompile --net --builtin copy1,copy4,copy8,examples,reduce
# UCX for the network route's steps (gpu-check.sh net@N, net-mixed@N, net-kill@N, net-bench@2),
# trimmed to what TCP over host memory needs: libucp, libuct, libucs, libucm and the
# shared-memory (cma) transport module, debug info stripped (dist/ travels in a 64 MiB limit).
# The CUDA modules are left out: the route stages through host memory, and libucm_cuda needs
# the wheel's own libcudart. The loader finds the libraries beside libucp ($ORIGIN) and UCX its
# modules in dist/ucx/lib/ucx/; gpu-check.sh sets DEVCOMM_UCX_LIB=$PWD/dist/ucx/lib.
ucx_wheel=$(DEVCOMM_UCX_FORCE_WHEEL=1 scripts/install-ucx.sh | tail -n 1)
rm -rf dist/ucx
mkdir -p dist/ucx/lib/ucx
for lib in libucp libuct libucs libucm; do
  cp -L "$ucx_wheel/$lib.so.0" "dist/ucx/lib/$lib.so.0"
done
cp -L "$ucx_wheel/ucx/libuct_cma.so.0" dist/ucx/lib/ucx/libuct_cma.so.0
chmod u+w dist/ucx/lib/*.so.0 dist/ucx/lib/ucx/*.so.0
strip --strip-debug dist/ucx/lib/*.so.0 dist/ucx/lib/ucx/*.so.0
# UCX's CUDA modules apart, with the wheel's libcudart that libucm_cuda finds through its rpath
# ($ORIGIN/../../../libucx_cu13.libs), and the transport's tests as a binary: only the probe of
# GPU memory over UCX loads them (gpu-check.sh net-gpu-mem, UCX_MODULE_DIR=dist/ucx-cuda/lib/ucx).
rm -rf dist/ucx-cuda dist/libucx_cu13.libs
mkdir -p dist/ucx-cuda/lib/ucx dist/libucx_cu13.libs
for m in libuct_cma libuct_cuda libucm_cuda; do
  cp -L "$ucx_wheel/ucx/$m.so.0" "dist/ucx-cuda/lib/ucx/$m.so.0"
done
cp -L "$ucx_wheel"/../../libucx_cu13.libs/libcudart-*.so.* dist/libucx_cu13.libs/
chmod u+w dist/ucx-cuda/lib/ucx/*.so.0
strip --strip-debug dist/ucx-cuda/lib/ucx/*.so.0
net_test=$(cargo test -p devcomm --release --test net_ucx --no-run 2>&1 |
  grep -o '[^ (]*/release/deps/net_ucx-[0-9a-f]*' | head -n 1)
cp "$net_test" dist/net_ucx_test
strip --strip-debug dist/net_ucx_test
du -sh dist/ucx dist/ucx-cuda
# The Python wheel (maturin as scripts/test-python.sh installs it into .tools/py), for
# gpu-check.sh's python steps.
if [ ! -x .tools/py/bin/maturin ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target .tools/py 'maturin>=1.5,<2' 'pytest>=7'
fi
(cd python && PYTHONPATH="$(pwd)/../.tools/py" CARGO_TARGET_DIR="$(cd .. && realpath -m "$tgt")" \
  ../.tools/py/bin/maturin build --release --quiet --out ../dist)
ls -la dist
