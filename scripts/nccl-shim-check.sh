#!/usr/bin/env bash
# GPU check of libdevcomm_nccl.so with NVIDIA's nccl-tests (docs/NCCL.md, "Checking it").
#
#   scripts/nccl-shim-check.sh NCCL_TESTS_SRC [GPUS] [MIN_BYTES] [MAX_BYTES]
#
# Builds nccl-tests from NCCL_TESTS_SRC against the real NCCL of PyTorch's site-packages
# (nvidia/nccl), then runs each test twice, with LD_PRELOAD=libdevcomm_nccl.so
# (DEVCOMM_NCCL_FALLBACK_LIB = the real libnccl.so.2) and plain, with data checks on (-c 1).
# How the GPUS ranks are driven (MODE):
#   threads (default)  one process, a thread per GPU (-t GPUS -g 1);
#   gpus               one process, one thread driving every GPU (-t 1 -g GPUS);
#   mpi                a process per GPU under MPI (-t 1 -g 1; MPI_HOME: an MPI with
#                      bin/mpiexec, include/mpi.h and lib/libmpi.so, e.g. PyPI's mpich wheel
#                      unpacked: its mpich-*.data/data folder).
# TYPES (nccl-tests' -d, default all), OPS (-o for the reductions, default all), ITERS (-n,
# default 5), WARMUP (-w, default 2), FACTOR (-f, default 4) and TESTS (default every test)
# narrow or lengthen the runs; EXTRA adds nccl-tests arguments to both runs (`EXTRA="-R 2"`:
# buffers from ncclMemAlloc registered as symmetric windows, which the shim adopts). Logs go to $OUT (or ./nccl-shim-out); a table of wrong counts
# and bus bandwidth, shim against plain, is printed last, and with SPEED=1 also every size's
# time and bus bandwidth, shim against plain ($OUT/speed.md); the table is also $OUT/table.txt.
# The library is taken from dist/ (scripts/stage.sh), else target/release/; BUILD_DIR (default
# under $TMPDIR or /tmp, outside $OUT) keeps the nccl-tests build (one per MPI setting) for
# later runs. Exit status 1 when any run fails or reports a
# wrong element.
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
mode=${MODE:-threads}
mpi=(MPI=0)
launch=()
case $mode in
  threads) shape=(-t "$gpus" -g 1) ;;
  gpus) shape=(-t 1 -g "$gpus") ;;
  mpi)
    : "${MPI_HOME:?MODE=mpi needs MPI_HOME}"
    shape=(-t 1 -g 1)
    mpi=(MPI=1 MPI_HOME="$MPI_HOME")
    launch=("$MPI_HOME/bin/mpiexec" -n "$gpus")
    export LD_LIBRARY_PATH="$MPI_HOME/lib:${LD_LIBRARY_PATH:-}" PATH="$MPI_HOME/bin:$PATH" ;;
  *) echo "MODE is threads, gpus or mpi, not $mode" >&2; exit 1 ;;
esac
# The build lives outside $OUT, so that a device run brings back the logs and not the binaries.
build=${BUILD_DIR:-"${TMPDIR:-/tmp}/nccl-tests-build-${mpi[0]#MPI=}"}
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
echo "== building nccl-tests from $src (CUDA $cuda_home, NCCL $nccl_dir, ${mpi[*]})"
if [ ! -x "$build/all_reduce_perf" ] && ! make -C "$src/src" -j 16 BUILDDIR="$build" NCCL_HOME="$home" \
    CUDA_HOME="$cuda_home" "${mpi[@]}" NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" \
    > "$out/build.log" 2>&1; then
  tail -n 30 "$out/build.log"; exit 1
fi
export LD_LIBRARY_PATH="$home/lib:${LD_LIBRARY_PATH:-}"
status=0
# TESTS="sendrecv alltoall" runs a subset.
for t in ${TESTS:-all_reduce reduce_scatter all_gather sendrecv alltoall broadcast reduce}; do
  args=("${shape[@]}" -p 1 -c 1 -b "$min" -e "$max" -f "${FACTOR:-4}" -n "${ITERS:-5}"
        -w "${WARMUP:-2}" -d "${TYPES:-all}")
  case $t in all_reduce|reduce_scatter|reduce) args+=(-o "${OPS:-all}") ;; esac
  # shellcheck disable=SC2206  # EXTRA is a list of words
  args+=(${EXTRA:-})
  for lib in shim plain; do
    log="$out/${t}_${lib}.log"
    echo "== $t ($lib, $mode): ${launch[*]} ${t}_perf ${args[*]}"
    if [ "$lib" = shim ]; then
      timeout 900 "${launch[@]}" env LD_PRELOAD="$shim" DEVCOMM_NCCL_FALLBACK_LIB="$real" \
        "$build/${t}_perf" "${args[@]}" > "$log" 2>&1
    else
      timeout 900 "${launch[@]}" "$build/${t}_perf" "${args[@]}" > "$log" 2>&1
    fi
    rc=$?
    [ $rc -eq 0 ] || { echo "   exit status $rc (tail of $log):"; tail -n 15 "$log"; status=1; }
  done
done
# The table: per test, type and operator, the wrong elements (out-of-place + in-place) and
# the out-of-place bus bandwidth at a few sizes, shim against plain.
tests=${TESTS:-all_reduce reduce_scatter all_gather sendrecv alltoall broadcast reduce}
SPEED=${SPEED:-0} python3 - "$out" $tests > "$out/table.txt" <<'PY' || status=1
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
            res[(f[2], f[3], int(f[0]))] = (wrong, float(f[7]), float(f[5]))
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
if os.environ.get("SPEED") == "1":
    # Every size: out-of-place time and bus bandwidth, shim against plain NCCL, same process
    # shape and buffers (ratio = plain time / shim time).
    lines = ["| test | type | op | bytes | shim us | NCCL us | shim busbw | NCCL busbw | ratio |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for t in sys.argv[2:]:
        s, p = rows(f"{out}/{t}_shim.log"), rows(f"{out}/{t}_plain.log")
        for key in sorted(s):
            ty, op, n = key
            ws, bs, ts = s[key]
            wp, bp, tp = p.get(key, (-1, 0.0, float("nan")))
            ratio = tp / ts if ts > 0 else float("nan")
            lines.append(f"| {t} | {ty} | {op} | {n} | {ts:.1f} | {tp:.1f} | {bs:.1f} | {bp:.1f} | {ratio:.2f} |")
    open(f"{out}/speed.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
sys.exit(1 if bad else 0)
PY
cat "$out/table.txt"
rm -rf "$home"
exit $status
