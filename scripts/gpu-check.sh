#!/usr/bin/env bash
# Functional GPU checks on a machine with one GPU (a lent single-GPU machine, say): each step
# runs ranks that share the GPU under scripts/shared-gpu.sh (correctness only: nothing here
# crosses NVLink or is timed against NCCL). Runs from the repository root with dist/ carried
# there (scripts/stage.sh). Logs go to $OUT (or ./gpu-out); a summary table is printed last.
#
#   usage: scripts/gpu-check.sh STEP...
#   steps: selftest2 selftest3 selftest4   the full self-test on 2, 3 or 4 ranks
#          groups@N                        the full self-test on N ranks, a step per group (each
#                                          with its own STEP_LIMIT: what runs it to its end)
#          GROUP@N                         one self-test group (--only GROUP) on N ranks
#          examples@N                      the Rust examples on N ranks
#          python@N                        the Python GPU tests on N ranks (wheel in dist/)
#          torchrun@N                      devcomm.init() on N ranks started by torchrun: standalone
#                                          (two communicators), after init_process_group and on a
#                                          new group, and with a c10d rendezvous endpoint
#                                          (python/tests/gpu/torchrun_init.py; wheel in dist/)
#          reduce-smoke@N                  the reduction benchmark as a smoke test on N ranks
#          pybench@N                       python -m devcomm.bench all_reduce under torchrun on N
#                                          ranks (wheel in dist/; PYBENCH_OPS for more ops):
#                                          devcomm against NCCL and PyTorch's symmetric memory,
#                                          JSON and PNG into $OUT. With N GPUs or more, one rank
#                                          per GPU, the whole sweep to 1 GiB; with fewer, ranks
#                                          share a GPU: devcomm alone up to 16 MiB (a smoke test)
#          kill@N                          a rank dies in a loop of all-to-alls, then of all-reduces
#                                          (devcomm kill-test --op)
#          net@N                           the `net` group with every link forced to the network
#                                          (UCX from dist/ucx over loopback TCP, with its CUDA
#                                          copy transport from dist/ucx-cuda)
#          net-mixed@N                     the `net` group with the lower and upper half of the
#                                          ranks joined by network links, NVLink within (N >= 4)
#          net-coll@N                      the `collectives` group and `collective_mismatch` with
#                                          every link forced to the network
#          net-coll-mixed@N                the same with the links of net-mixed@N
#          net-moe@N, net-moe-mixed@N      the `moe` group over the links of net-coll@N and
#                                          net-coll-mixed@N
#          net-red@N                       `reduce_mismatch`, `comm_barrier` and
#                                          `sendrecv_ring_gather`, then the `reduce` group (two
#                                          steps), with every link forced to the network
#          net-red-mixed@N                 the same with the links of net-mixed@N
#          net-kill@N                      kill@N with every link forced to the network
#          net-gpu-mem                     the probe of GPU memory registered with UCX and put over
#                                          TCP through UCX's CUDA copy transport (2 ranks, GPU 0)
#          net-bench@N                     bench --op sendrecv over the network route, one way and
#                                          both ways, up to 16 MiB, and --op all_to_all up to
#                                          4 MiB per peer, --op all_reduce up to 16 MiB (smoke
#                                          tests: loopback TCP)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DEVCOMM_TIMEOUT_MS=${DEVCOMM_TIMEOUT_MS:-10000} DEVCOMM_SETUP_TIMEOUT_MS=${DEVCOMM_SETUP_TIMEOUT_MS:-60000}
# Kernels precompiled on the build machine (scripts/stage.sh) start the cache warm.
export DEVCOMM_CACHE_DIR=${DEVCOMM_CACHE_DIR:-$PWD/dist/kernel-cache}
step_limit=${STEP_LIMIT:-300}
out=${OUT:-./gpu-out}; mkdir -p "$out"
summary=()
step() { # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout -k 5 "$step_limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 60 "$out/$name.log"
  summary+=("$(printf '%-24s rc=%-4s %4ss' "$name" "$rc" $((SECONDS - t0)))")
}
nvidia-smi -L > "$out/gpu.txt" 2>&1
# The network route's steps: UCX from dist/ucx (scripts/stage.sh) over loopback TCP, with its
# CUDA modules (dist/ucx-cuda) and the CUDA copy transport, so that windows' GPU memory can be
# registered for users' kernels (the `net_window` check).
net_env=(DEVCOMM_UCX_LIB="$PWD/dist/ucx/lib" UCX_MODULE_DIR="$PWD/dist/ucx-cuda/lib/ucx"
  UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n)
net_all() { # every link of N ranks forced to the network: 0-*=net,1-*=net,...
  local n=$1 r spec=""
  for ((r = 0; r < n; r++)); do spec+="${spec:+,}$r-*=net"; done
  echo "$spec"
}
net_mixed() { # the lower and upper half of N ranks joined by network links, NVLink within
  local n=$1 a b spec=""
  for ((a = 0; a < n / 2; a++)); do
    for ((b = n / 2; b < n; b++)); do spec+="${spec:+,}$a-$b=net"; done
  done
  echo "$spec"
}
# The reduce group's checks by name (`--only reduce` would also match `reduce_mismatch`).
reduce_group=reduce_sizes,reduce_large,reduce_args,reduce_rmsnorm,reduce_accumulate,reduce_pool
reduce_group+=,reduce_graph,reduce_back_to_back
net_selftest() { # step name, forced links, --only: the self-test on $n ranks over those links
  step "$1" env "${net_env[@]}" DEVCOMM_TOPOLOGY_OVERRIDE="$2" \
    scripts/shared-gpu.sh "$n" dist/devcomm selftest --only "$3"
}
for w in "$@"; do
  case $w in
    selftest[0-9]) n=${w#selftest}; step "selftest-$n-ranks" scripts/shared-gpu.sh "$n" dist/devcomm selftest ;;
    examples@*) n=${w#examples@}
      step "example-transpose-$n" scripts/shared-gpu.sh "$n" dist/transpose_all_to_all
      step "example-fp8-$n" scripts/shared-gpu.sh "$n" dist/fp8_all_to_all
      [ -x dist/all_reduce_rmsnorm ] && step "example-rmsnorm-$n" scripts/shared-gpu.sh "$n" dist/all_reduce_rmsnorm ;;
    python@*) n=${w#python@}
      python3 -m pip install -q --no-index --no-deps --target /tmp/devcomm-py dist/*.whl > "$out/pip.log" 2>&1
      step "python-$n-ranks" env PYTHONPATH=/tmp/devcomm-py PYTHONUNBUFFERED=1 \
        scripts/shared-gpu.sh "$n" python3 -m pytest -q -p no:cacheprovider -rf python/tests/gpu
      for py in python/bench_overhead.py examples/python/moe_layer.py examples/python/tp_mlp.py; do
        step "python-$(basename "$py" .py)-$n" env PYTHONPATH=/tmp/devcomm-py PYTHONUNBUFFERED=1 \
          scripts/shared-gpu.sh "$n" python3 -P "$py"
      done ;;
    torchrun@*) n=${w#torchrun@}
      python3 -m pip install -q --no-index --no-deps --target /tmp/devcomm-py dist/*.whl > "$out/pip.log" 2>&1
      run=(python3 -m torch.distributed.run --nproc-per-node "$n")
      script=python/tests/gpu/torchrun_init.py
      step "torchrun-standalone-$n" env PYTHONPATH=/tmp/devcomm-py PYTHONUNBUFFERED=1 LAUNCHER=none \
        scripts/shared-gpu.sh "$n" "${run[@]}" --standalone "$script" plain
      step "torchrun-process-group-$n" env PYTHONPATH=/tmp/devcomm-py PYTHONUNBUFFERED=1 LAUNCHER=none \
        scripts/shared-gpu.sh "$n" "${run[@]}" --standalone "$script" pg
      port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
      step "torchrun-rdzv-endpoint-$n" env PYTHONPATH=/tmp/devcomm-py PYTHONUNBUFFERED=1 LAUNCHER=none \
        scripts/shared-gpu.sh "$n" "${run[@]}" --nnodes 1 --rdzv-backend c10d \
        --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "devcomm-$port" "$script" plain ;;
    reduce-smoke@*) n=${w#reduce-smoke@}
      for op in all_reduce reduce_scatter all_gather; do
        step "bench-$op-smoke-$n" scripts/shared-gpu.sh "$n" dist/devcomm bench --op "$op" \
          --reference none --max-bytes $((16 << 20)) --json "$out/$op-smoke.json"
      done ;;
    pybench@*) n=${w#pybench@}
      python3 -m pip install -q --no-index --no-deps --target /tmp/devcomm-py dist/*.whl > "$out/pip.log" 2>&1
      run=(python3 -m torch.distributed.run --standalone --nproc-per-node "$n" -m devcomm.bench)
      if [ "$(nvidia-smi -L | wc -l)" -ge "$n" ]; then
        launch=(env) extra=()   # a GPU per rank, no MPS share: the figures that count
      else
        launch=(env LAUNCHER=none scripts/shared-gpu.sh "$n") extra=(--max-bytes 16M)
      fi
      # The full sweep of both dtypes takes minutes: its own limit.
      saved_limit=$step_limit step_limit=${PYBENCH_LIMIT:-900}
      for op in ${PYBENCH_OPS:-all_reduce}; do
        step "pybench-$op-$n" env PYTHONPATH=/tmp/devcomm-py PYTHONUNBUFFERED=1 "${launch[@]}" "${run[@]}" \
          "$op" ${extra[@]+"${extra[@]}"} --json "$out/pybench-$op-$n.json" --plot "$out/pybench-$op-$n.png"
      done
      step_limit=$saved_limit ;;
    kill@*) n=${w#kill@}
      for op in all_to_all all_reduce; do
        step "kill-test-$op-$n-ranks" scripts/shared-gpu.sh "$n" dist/devcomm kill-test --op "$op"
      done ;;
    overhead@*) n=${w#overhead@}
      python3 -m pip install -q --no-index --no-deps --target /tmp/devcomm-py dist/*.whl > "$out/pip.log" 2>&1
      # -P: the installed package, not the source folder beside the script.
      step "python-overhead-$n" env PYTHONPATH=/tmp/devcomm-py PYTHONUNBUFFERED=1 \
        scripts/shared-gpu.sh "$n" python3 -P python/bench_overhead.py ;;
    net@*) n=${w#net@}; net_selftest "net-$n-ranks" "$(net_all "$n")" net ;;
    net-mixed@*) n=${w#net-mixed@}; net_selftest "net-mixed-$n-ranks" "$(net_mixed "$n")" net ;;
    net-coll@*) n=${w#net-coll@}
      net_selftest "net-coll-$n-ranks" "$(net_all "$n")" collectives,collective_mismatch ;;
    net-coll-mixed@*) n=${w#net-coll-mixed@}
      net_selftest "net-coll-mixed-$n-ranks" "$(net_mixed "$n")" collectives,collective_mismatch ;;
    net-moe@*) n=${w#net-moe@}; net_selftest "net-moe-$n-ranks" "$(net_all "$n")" moe ;;
    net-moe-mixed@*) n=${w#net-moe-mixed@}
      net_selftest "net-moe-mixed-$n-ranks" "$(net_mixed "$n")" moe ;;
    net-red@* | net-red-mixed@*)
      # Two steps, each with its own limit: the mismatch and barrier checks first (quick), then
      # the reduce group, whose back-to-back check alone can take most of a step's limit.
      n=${w#*@}; links=$(net_all "$n"); name=net-red
      case $w in net-red-mixed@*) links=$(net_mixed "$n"); name=net-red-mixed ;; esac
      net_selftest "$name-mismatch-$n-ranks" "$links" reduce_mismatch,comm_barrier,sendrecv_ring_gather
      net_selftest "$name-$n-ranks" "$links" "$reduce_group" ;;
    net-gpu-mem)
      step "net-gpu-memory-probe" env DEVCOMM_UCX_LIB="$PWD/dist/ucx/lib" \
        UCX_MODULE_DIR="$PWD/dist/ucx-cuda/lib/ucx" UCX_WARN_UNUSED_ENV_VARS=n DEVCOMM_REQUIRE_UCX=1 \
        DEVCOMM_TEST_UCX_TLS=tcp,cuda_copy \
        dist/net_ucx_test --ignored --exact net_gpu_memory_put_two_ranks --nocapture ;;
    net-kill@*) n=${w#net-kill@}
      for op in all_to_all all_reduce; do
        step "net-kill-test-$op-$n-ranks" env "${net_env[@]}" DEVCOMM_TOPOLOGY_OVERRIDE="$(net_all "$n")" \
          scripts/shared-gpu.sh "$n" dist/devcomm kill-test --op "$op"
      done ;;
    net-bench@*) n=${w#net-bench@}
      for dir in one both; do
        step "net-bench-sendrecv-$dir-$n" env "${net_env[@]}" DEVCOMM_TOPOLOGY_OVERRIDE="$(net_all "$n")" \
          scripts/shared-gpu.sh "$n" dist/devcomm bench --op sendrecv --reference none \
          --max-bytes $((16 << 20)) $([ "$dir" = both ] && echo --both-directions) \
          --json "$out/net-sendrecv-$dir.json"
      done
      step "net-bench-all_to_all-$n" env "${net_env[@]}" DEVCOMM_TOPOLOGY_OVERRIDE="$(net_all "$n")" \
        scripts/shared-gpu.sh "$n" dist/devcomm bench --op all_to_all --reference none \
        --max-bytes $((4 << 20)) --json "$out/net-all_to_all.json"
      step "net-bench-all_reduce-$n" env "${net_env[@]}" DEVCOMM_TOPOLOGY_OVERRIDE="$(net_all "$n")" \
        scripts/shared-gpu.sh "$n" dist/devcomm bench --op all_reduce --reference none \
        --max-bytes $((16 << 20)) --json "$out/net-all_reduce.json" ;;
    groups@*) n=${w#groups@}
      # The full self-test group by group, each a step with its own time limit: on one GPU
      # the whole self-test in one step outlasts any limit (selftestN).
      for g in $(dist/devcomm selftest --help | sed -n 's/^  \([a-z_0-9]*\):$/\1/p'); do
        step "selftest-$g-$n-ranks" scripts/shared-gpu.sh "$n" dist/devcomm selftest --only "$g"
      done ;;
    *@*) g=${w%@*}; n=${w#*@}; step "selftest-$g-$n-ranks" scripts/shared-gpu.sh "$n" dist/devcomm selftest --only "$g" ;;
    *) echo "unknown step $w" >&2 ;;
  esac
done
printf '\n%s\n' "${summary[@]}"
