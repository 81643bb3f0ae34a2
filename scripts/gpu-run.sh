#!/usr/bin/env bash
# Runs on a GPU machine from the repository root, with dist/ carried there (scripts/stage.sh):
# the GPU self-test on every GPU, then the quick benchmarks. Full logs and JSON go to $OUT
# (or ./gpu-out), and a short summary is printed last.
#   usage: dist/gpu-run.sh [device-kind] [what...]
#   what: info selftest selftest2 p2p traced coll coll-mixed examples latency launch put sendrecv graph
#         large tune zc zc-routes zc-bench a2a a2a-zc a2av moe all_reduce reduce_scatter all_gather
#         reduce-tune reduce-smoke
#   The product's checks and benchmarks only: the comparisons of settings already decided are
#   logged in docs/PERFORMANCE.md, and the steps that ran them are in git history.
#   The reductions take REDUCE_ARGS (e.g. "--dtype f32 --redop max" or "--max-bytes 67108864";
#   reduce-smoke sets its own --max-bytes: SMOKE_MAX, 16 MiB).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DEVCOMM_CACHE_DIR=${DEVCOMM_CACHE_DIR:-/tmp/devcomm-cache}
export DEVCOMM_TIMEOUT_MS=${DEVCOMM_TIMEOUT_MS:-5000} DEVCOMM_SETUP_TIMEOUT_MS=${DEVCOMM_SETUP_TIMEOUT_MS:-30000}
step_limit=${STEP_LIMIT:-240}
kind=${1:-unknown}; shift || true
what=${*:-info selftest latency put}
out=${OUT:-./gpu-out}; mkdir -p "$out"
bin=dist/devcomm
n=$(nvidia-smi -L | wc -l)
summary=()
step() { # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout -k 5 "$step_limit" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t0)))")
}
nvidia-smi topo -m > "$out/topo.txt" 2>&1
for w in $what; do
  case $w in
    info)
      step info $bin launch -n "$n" -- $bin info
      step info-override env DEVCOMM_TOPOLOGY_OVERRIDE="0-1=net,2-*=shm" $bin launch -n "$n" -- $bin info ;;
    # The self-test at the default setup timeout: its cold-compile checks compile every module
    # on one rank while the others wait, which takes longer than the 30 s set above.
    selftest) step selftest env DEVCOMM_SETUP_TIMEOUT_MS=120000 $bin launch -n "$n" -- $bin selftest ;;
    selftest2) step selftest-2 env DEVCOMM_SETUP_TIMEOUT_MS=120000 $bin launch -n 2 -- $bin selftest ;;
    coll) step selftest-coll $bin launch -n "$n" -- $bin selftest --only a2a ;;
    coll-mixed)
      mixed="0-1=nvl-as-net"; [ "$n" -ge 4 ] && mixed="0-1=nvl-as-net,0-3=nvl-as-net,2-3=nvl-as-net"
      step selftest-coll-mixed env DEVCOMM_TOPOLOGY_OVERRIDE="$mixed" \
        $bin launch -n "$n" -- $bin selftest --only a2a ;;
    examples)
      step example-transpose $bin launch -n "$n" -- dist/transpose_all_to_all
      step example-fp8 $bin launch -n "$n" -- dist/fp8_all_to_all ;;
    latency) step latency $bin launch -n 2 -- $bin bench --op latency --device-kind "$kind" --json "$out/latency.json" ;;
    launch) step launch $bin launch -n "$n" -- $bin bench --op launch --device-kind "$kind" --json "$out/launch.json" ;;
    put) step put $bin launch -n 2 -- $bin bench --op put --device-kind "$kind" --json "$out/put.json" --plot "$out/put.svg" ;;
    sendrecv)
      step sendrecv $bin launch -n 2 -- $bin bench --op sendrecv --device-kind "$kind" --json "$out/sendrecv.json" --plot "$out/sendrecv.svg"
      step sendrecv-both $bin launch -n 2 -- $bin bench --op sendrecv --both-directions --device-kind "$kind" --json "$out/sendrecv-both.json" --plot "$out/sendrecv-both.svg" ;;
    p2p) step selftest-p2p $bin launch -n "$n" -- $bin selftest --only sendrecv ;;
    traced)  # results with tracing on (every kernel compiled with its events) are those without
      step selftest-traced env DEVCOMM_TRACE=1 $bin launch -n "$n" -- $bin selftest \
        --only sendrecv,a2a,reduce_sizes,reduce_graph,trace --calls 1000 --coll-calls 200 --replays 20 ;;
    tune)
      step tune $bin launch -n 2 -- $bin tune --out "$out/tune.json" ${TUNE_ARGS:-}
      step tuned env DEVCOMM_TUNE_FILE="$out/tune.json" $bin launch -n 2 -- $bin bench --op sendrecv --device-kind "$kind" --json "$out/tuned.json"
      step tuned-both env DEVCOMM_TUNE_FILE="$out/tune.json" $bin launch -n 2 -- $bin bench --op sendrecv --both-directions --device-kind "$kind" --json "$out/tuned-both.json" ;;
    large)
      # Large messages (docs/PROTOCOL.md, "Copy engine"): one way and both ways from 64 MiB on
      # the defaults, and both ways with DEVCOMM_P2P_CE=0 (the staged protocol at every size)
      # for reference, REPS times in turn. TAG prefixes the files of a run.
      t=${TAG:+$TAG-}
      for r in $(seq 1 "${REPS:-2}"); do
        step ${t}one-$r $bin launch -n 2 -- $bin bench --op sendrecv --min-bytes 67108864 --device-kind "$kind" --json "$out/${t}one-$r.json"
        step ${t}both-$r $bin launch -n 2 -- $bin bench --op sendrecv --both-directions --min-bytes 67108864 --device-kind "$kind" --json "$out/${t}both-$r.json"
        step ${t}both-staged-$r env DEVCOMM_P2P_CE=0 $bin launch -n 2 -- $bin bench --op sendrecv --both-directions --min-bytes 67108864 --device-kind "$kind" --json "$out/${t}both-staged-$r.json"
      done ;;
    zc) step selftest-zc $bin launch -n "$n" -- $bin selftest --only zc ;;
    zc-bench)
      step zc-sendrecv $bin launch -n 2 -- $bin bench --op sendrecv --zero-copy --device-kind "$kind" --json "$out/zc-sendrecv.json" --plot "$out/zc-sendrecv.svg"
      step zc-sendrecv-both $bin launch -n 2 -- $bin bench --op sendrecv --zero-copy --both-directions --device-kind "$kind" --json "$out/zc-sendrecv-both.json" --plot "$out/zc-sendrecv-both.svg" ;;
    zc-routes)
      # The zero-copy checks with every message above the low-latency size by copy engine, then
      # by SM blocks up to the copy-engine size.
      step selftest-zc-all-ce env DEVCOMM_ZC_CE_MIN=0 $bin launch -n "$n" -- $bin selftest --only zc
      step selftest-zc-blocks env DEVCOMM_ZC_STAGED=0 $bin launch -n "$n" -- $bin selftest --only zc ;;
    a2a) step a2a $bin launch -n "$n" -- $bin bench --op all_to_all --device-kind "$kind" --json "$out/a2a.json" --plot "$out/a2a.svg" ;;
    a2a-zc) step a2a-zc $bin launch -n "$n" -- $bin bench --op all_to_all --zero-copy --min-bytes 1048576 --device-kind "$kind" --json "$out/a2a-zc.json" --plot "$out/a2a-zc.svg" ;;
    a2av) step a2av $bin launch -n "$n" -- $bin bench --op all_to_all_v --device-kind "$kind" --json "$out/a2av.json" --plot "$out/a2av.svg" ;;
    moe)
      # MoE dispatch + combine on every GPU (docs/MOE.md): the self-test group on the direct
      # path and on the all-to-all-v path, then the benchmark on each (the direct path is the
      # default between NVLink peers; DEVCOMM_MOE_DIRECT=0 takes the other).
      step selftest-moe $bin launch -n "$n" -- $bin selftest --only moe
      step selftest-moe-a2av env DEVCOMM_MOE_DIRECT=0 $bin launch -n "$n" -- $bin selftest --only moe
      step moe $bin launch -n "$n" -- $bin bench --op moe --iters 30 --warmup 5 --device-kind "$kind" --json "$out/moe.json"
      step moe-a2av env DEVCOMM_MOE_DIRECT=0 $bin launch -n "$n" -- $bin bench --op moe --iters 30 --warmup 5 --device-kind "$kind" --json "$out/moe-a2av.json" ;;
    all_reduce|reduce_scatter|all_gather)
      # devcomm against NCCL on the same buffers and on NCCL's symmetric window buffers, every
      # GPU, bf16 sum unless REDUCE_ARGS says otherwise.
      step "$w" $bin launch -n "$n" -- $bin bench --op "$w" --device-kind "$kind" ${REDUCE_ARGS:-} --json "$out/$w.json" --plot "$out/$w.svg" ;;
    reduce-tune)
      # The reductions' tuning table (docs/TUNING.md, "Reductions") on every GPU, ordinary and
      # pool buffers, one collective a step (--append makes one table), then each collective
      # benchmarked with it loaded. RTUNE_ARGS adds to each tune step (e.g. "--iters 10");
      # RTUNE_LIMIT bounds each (default 900 s).
      saved_limit=$step_limit; step_limit=${RTUNE_LIMIT:-900}
      rm -f "$out/reduce-tune.json"
      for op in all_reduce reduce_scatter all_gather; do
        step "reduce-tune-$op" $bin launch -n "$n" -- $bin tune --op "$op" --buffers ordinary,pool --append --out "$out/reduce-tune.json" ${RTUNE_ARGS:-}
      done
      step_limit=$saved_limit
      for op in all_reduce reduce_scatter all_gather; do
        step "$op-tuned" env DEVCOMM_REDUCE_TUNE_FILE="$out/reduce-tune.json" $bin launch -n "$n" -- $bin bench --op "$op" --device-kind "$kind" ${REDUCE_ARGS:-} --json "$out/$op-tuned.json"
        step "$op-tuned-pool" env DEVCOMM_REDUCE_TUNE_FILE="$out/reduce-tune.json" $bin launch -n "$n" -- $bin bench --op "$op" --zero-copy --device-kind "$kind" ${REDUCE_ARGS:-} --json "$out/$op-tuned-pool.json"
      done ;;
    reduce-smoke)
      # SMOKE_RANKS ranks sharing one GPU under MPS (scripts/shared-gpu.sh): devcomm alone,
      # checked against the host reference, up to SMOKE_MAX bytes; the timings are marked
      # meaningless.
      for op in all_reduce reduce_scatter all_gather; do
        step "reduce-smoke-$op" scripts/shared-gpu.sh "${SMOKE_RANKS:-4}" $bin bench --op "$op" --reference none --max-bytes "${SMOKE_MAX:-16777216}" --device-kind "$kind" ${REDUCE_ARGS:-} --json "$out/reduce-smoke-$op.json"
      done ;;
    graph) step sendrecv-graph $bin launch -n 2 -- $bin bench --op sendrecv --graph --device-kind "$kind" --json "$out/sendrecv-graph.json" ;;
  esac
done
echo; echo "=== summary"; printf '%s\n' "${summary[@]}"
grep -h -E "SELFTEST|^rank [0-9]+ .*:" "$out"/selftest*.log 2>/dev/null | tail -20
