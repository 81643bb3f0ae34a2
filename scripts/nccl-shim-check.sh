#!/usr/bin/env bash
# GPU check of libdevcomm_nccl.so with NVIDIA's nccl-tests (docs/NCCL.md, "Checking it").
#
#   scripts/nccl-shim-check.sh NCCL_TESTS_SRC [GPUS] [MIN_BYTES] [MAX_BYTES]
#
# Builds nccl-tests from NCCL_TESTS_SRC (no MPI: several GPUs in one process, one thread per
# GPU that creates and drives its own communicator, `-t GPUS -g 1 -p 1`; one thread driving
# several communicators, `-g GPUS`, would block in devcomm's first launch of each kernel, which
# waits on the host until every peer has loaded it)
# against the real NCCL of PyTorch's site-packages (nvidia/nccl), then runs each test twice,
# with LD_PRELOAD=libdevcomm_nccl.so (DEVCOMM_NCCL_FALLBACK_LIB = the real libnccl.so.2) and
# plain, with data checks on (-c 1), every type (-d all) and, for reductions, every operator
# (-o all). Logs go to $OUT (or ./nccl-shim-out); a table of wrong counts and bus bandwidth,
# shim against plain, is printed last. The library is taken from dist/ (scripts/stage.sh),
# else target/release/. Exit status 1 when any run fails or reports a wrong element.
set -uo pipefail
src=${1:?usage: scripts/nccl-shim-check.sh NCCL_TESTS_SRC [GPUS] [MIN_BYTES] [MAX_BYTES]}
gpus=${2:-$(nvidia-smi -L | wc -l)}
min=${3:-8}
max=${4:-1G}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/nccl-shim-out}
mkdir -p "$out"
shim=""
for p in "$here/dist/libdevcomm_nccl.so" "$here/target/release/libdevcomm_nccl.so"; do
  if [ -e "$p" ]; then shim=$p; break; fi
done
[ -n "$shim" ] || { echo "libdevcomm_nccl.so not found (run scripts/stage.sh)" >&2; exit 1; }
# The real NCCL: the nvidia-nccl wheel PyTorch depends on (headers and lib only there).
nccl_dir=$(python3 -c 'import nvidia, os; print(next(p for p in (os.path.join(d, "nccl") for d in nvidia.__path__) if os.path.isdir(p)))') ||
  { echo "no nvidia/nccl in site-packages" >&2; exit 1; }
real="$nccl_dir/lib/libnccl.so.2"
[ -e "$real" ] || { echo "$real missing" >&2; exit 1; }
# nccl-tests links -lnccl: a folder with include/ and lib/libnccl.so -> libnccl.so.2.
home=$(mktemp -d)
mkdir -p "$home/lib"
ln -s "$nccl_dir/include" "$home/include"
ln -s "$real" "$home/lib/libnccl.so"
ln -s "$real" "$home/lib/libnccl.so.2"
build="$out/nccl-tests-build"
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
echo "== building nccl-tests from $src (CUDA $cuda_home, NCCL $nccl_dir)"
if ! make -C "$src/src" -j 16 BUILDDIR="$build" NCCL_HOME="$home" CUDA_HOME="$cuda_home" MPI=0 \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > "$out/build.log" 2>&1; then
  tail -n 30 "$out/build.log"; exit 1
fi
export LD_LIBRARY_PATH="$home/lib:${LD_LIBRARY_PATH:-}"
status=0
# TESTS="sendrecv alltoall" runs a subset.
for t in ${TESTS:-all_reduce reduce_scatter all_gather sendrecv alltoall broadcast reduce}; do
  args=(-t "$gpus" -g 1 -p 1 -c 1 -b "$min" -e "$max" -f 4 -n 5 -w 2 -d all)
  case $t in all_reduce|reduce_scatter|reduce) args+=(-o all) ;; esac
  for mode in shim plain; do
    log="$out/${t}_${mode}.log"
    echo "== $t ($mode): ${t}_perf ${args[*]}"
    if [ "$mode" = shim ]; then
      env LD_PRELOAD="$shim" DEVCOMM_NCCL_FALLBACK_LIB="$real" \
        timeout 900 "$build/${t}_perf" "${args[@]}" > "$log" 2>&1
    else
      timeout 900 "$build/${t}_perf" "${args[@]}" > "$log" 2>&1
    fi
    rc=$?
    [ $rc -eq 0 ] || { echo "   exit status $rc (tail of $log):"; tail -n 15 "$log"; status=1; }
  done
done
# The table: per test, type and operator, the wrong elements (out-of-place + in-place) and
# the out-of-place bus bandwidth at a few sizes, shim against plain.
tests=${TESTS:-all_reduce reduce_scatter all_gather sendrecv alltoall broadcast reduce}
python3 - "$out" $tests <<'PY' || status=1
import glob, os, re, sys
out = sys.argv[1]
def rows(path):
    res = {}
    if not os.path.exists(path):
        return res
    for line in open(path, errors="replace"):
        f = line.split()
        # size count type redop root time algbw busbw #wrong time algbw busbw #wrong
        if len(f) >= 13 and f[0].isdigit():
            # nccl-tests prints N/A for a check it does not make (the in-place half of
            # sendrecv and alltoall); the out-of-place count must be there.
            num = lambda x: None if x == "N/A" else int(x)
            try:
                oop, inp = num(f[8]), num(f[12])
                wrong = -1 if oop is None else oop + (inp or 0)
            except ValueError:
                wrong = -1
            res[(f[2], f[3], int(f[0]))] = (wrong, float(f[7]))
    return res
bad = False
print(f"{'test':15} {'type':9} {'op':5} {'wrong shim/plain':>17}  busbw GB/s shim/plain at sizes")
for t in sys.argv[2:]:
    s, p = rows(f"{out}/{t}_shim.log"), rows(f"{out}/{t}_plain.log")
    if not s:
        print(f"{t:15} no results from the shim run"); bad = True; continue
    for ty, op in sorted({(k[0], k[1]) for k in s}):
        sizes = sorted(k[2] for k in s if k[:2] == (ty, op))
        ws = sum(max(s[(ty, op, n)][0], 0) for n in sizes)
        wp = sum(max(p.get((ty, op, n), (0, 0))[0], 0) for n in sizes)
        bad |= ws > 0 or any(s[(ty, op, n)][0] < 0 for n in sizes)
        pick = sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]})
        bw = "  ".join(f"{n}B {s[(ty, op, n)][1]:.1f}/{p.get((ty, op, n), (0, 0))[1]:.1f}" for n in pick)
        print(f"{t:15} {ty:9} {op:5} {ws:>8}/{wp:<8}  {bw}")
sys.exit(1 if bad else 0)
PY
rm -rf "$home"
exit $status
