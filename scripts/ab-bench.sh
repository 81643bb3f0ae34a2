#!/usr/bin/env bash
# A/B of two builds on one GPU machine: `devcomm bench` of build A and of build B in
# alternating processes (A B A B ...), so that what the machine does over the minutes falls
# on both alike, then a table per size of each build's median over its processes
# (docs/PERFORMANCE.md: predict, change, measure; a decision between two builds wants this,
# not two files from two machines).
#
#   usage: scripts/ab-bench.sh A_BIN B_BIN RANKS BENCH_ARGS...
#   e.g.   scripts/ab-bench.sh dist/devcomm dist/old/devcomm 4 --op all_reduce --max-bytes 1048576
#
# Each binary runs under its own `launch` (`A_BIN launch -n RANKS -- A_BIN bench ...`), with
# its own kernel cache (A_CACHE, B_CACHE; default dist/kernel-cache for A and a copy of it for
# B, so that B compiles only the kernels whose source differs). REPS processes each (default
# 3). JSON of every process and the table (ab.md) go to $OUT (or ./ab-out); the table is
# printed last. The environment of scripts/gpu-run.sh applies (NVLink multicast off).
set -uo pipefail
a=${1:?usage: scripts/ab-bench.sh A_BIN B_BIN RANKS BENCH_ARGS...}
b=${2:?usage: scripts/ab-bench.sh A_BIN B_BIN RANKS BENCH_ARGS...}
n=${3:?usage: scripts/ab-bench.sh A_BIN B_BIN RANKS BENCH_ARGS...}
shift 3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-./ab-out}
mkdir -p "$out"
a_cache=${A_CACHE:-$PWD/dist/kernel-cache}
b_cache=${B_CACHE:-$out/b-kernel-cache}
if [ -z "${B_CACHE:-}" ] && [ ! -d "$b_cache" ]; then
  cp -r "$a_cache" "$b_cache" 2>/dev/null || mkdir -p "$b_cache"
fi
status=0
for r in $(seq 1 "${REPS:-3}"); do
  for side in a b; do
    if [ $side = a ]; then bin=$a cache=$a_cache; else bin=$b cache=$b_cache; fi
    echo "== $side, process $r: $bin bench $*"
    DEVCOMM_CACHE_DIR=$cache timeout -k 5 "${STEP_LIMIT:-300}" \
      "$bin" launch -n "$n" -- "$bin" bench "$@" --json "$out/$side-$r.json" \
      > "$out/$side-$r.log" 2>&1 || { echo "   failed (tail of $out/$side-$r.log):"; tail -n 15 "$out/$side-$r.log"; status=1; }
  done
done
python3 - "$out" <<'PY' || status=1
import glob, json, os, statistics, sys
out = sys.argv[1]
def runs(side):
    got = {}
    for path in sorted(glob.glob(os.path.join(out, f"{side}-*.json"))):
        for rec in json.load(open(path)):
            key = (rec["op"], rec["bytes"], rec.get("both_directions", False), rec.get("reference", ""))
            got.setdefault(key, []).append((rec["devcomm_us"], rec.get("nccl_us")))
    return got
a, b = runs("a"), runs("b")
if not a or not b:
    print("no results from one of the builds"); sys.exit(1)
lines = ["| op | bytes | both ways | A us (median) | B us (median) | B / A | NCCL us (A's processes) | processes A, B |",
         "|---|---:|:-:|---:|---:|---:|---:|---|"]
for key in sorted(set(a) & set(b), key=lambda k: (k[0], k[3], k[2], k[1])):
    op, size, both, _ = key
    am = statistics.median(x for x, _ in a[key])
    bm = statistics.median(x for x, _ in b[key])
    nccl = [y for _, y in a[key] if y]
    nm = f"{statistics.median(nccl):.2f}" if nccl else "-"
    lines.append(f"| {op} | {size} | {'yes' if both else 'no'} | {am:.2f} | {bm:.2f} | {bm / am:.3f} | {nm} | {len(a[key])}, {len(b[key])} |")
text = "\n".join(lines) + "\n"
open(os.path.join(out, "ab.md"), "w").write(text)
print(text)
PY
exit $status
