#!/usr/bin/env bash
# Functional tests of multi-rank code on a machine with fewer GPUs than ranks (a lent
# single-GPU machine, say): every rank opens GPU `LOCAL_RANK % count` and ranks on one GPU
# reach each other like NVLink peers (DEVCOMM_SHARE_GPU=1, docs/TESTING.md). Correctness only:
# timings taken so say nothing of NVLink, and benchmarks refuse to run.
#
# Kernels of different processes on one GPU run at the same time only under an MPS server;
# without one they take turns in time slices, and every handshake between ranks waits for
# a slice. With MPS=1 (the default where nvidia-cuda-mps-control exists) this script starts a
# server of its own (pipe and log folders under /tmp), runs the command, and stops it again.
#
# MPS_GPU=N (a machine with several GPUs): the ranks share GPU N under an MPS server of their
# own (pipe and log folders per GPU), so that runs on different GPUs can go on side by side;
# the server is started with CUDA_VISIBLE_DEVICES=N and the ranks without it, as MPS wants.
#
# LAUNCHER=none: CMD starts the ranks itself (torchrun, say) and runs once, under the same
# settings; otherwise `devcomm launch -n RANKS` starts RANKS copies of CMD.
#
#   usage: scripts/shared-gpu.sh RANKS CMD...      e.g. scripts/shared-gpu.sh 4 dist/devcomm selftest
# Runs from the repository root with dist/ carried there (scripts/stage.sh).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DEVCOMM_SHARE_GPU=1
export DEVCOMM_CACHE_DIR=${DEVCOMM_CACHE_DIR:-/tmp/devcomm-cache}
ranks=${1:?usage: shared-gpu.sh RANKS CMD...}; shift
mps_control=$(command -v nvidia-cuda-mps-control || true)
use_mps=${MPS:-$([ -n "$mps_control" ] && echo 1 || echo 0)}
started=0
if [ "$use_mps" = 1 ]; then
  if [ -z "$mps_control" ]; then
    echo "shared-gpu: MPS=1 but nvidia-cuda-mps-control is not on PATH" >&2
    exit 2
  fi
  mps_dir=/tmp/devcomm-mps${MPS_GPU:+-gpu$MPS_GPU}
  export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-$mps_dir/pipe}
  export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-$mps_dir/log}
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  # Each client (rank) gets its own share of the SMs. devcomm's protocols assume that every
  # block of a kernel and of the peer's kernel is resident at once, as on GPUs of their own;
  # without a share, blocks of one rank (and the next kernel's blocks, launched early by
  # programmatic dependent launch) can fill the SMs while the peer's blocks they wait for
  # never start. Ranks see the share as their SM count and size their grids to it.
  export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-$((100 / ranks))}
  # A share is a limit, not a reservation: with more than two ranks, launches that fill their
  # whole share (devcomm fits its window to the SMs it is given) sometimes waited on peers'
  # blocks that never started (docs/TESTING.md). Eight blocks per direction leave room.
  if [ "$ranks" -gt 2 ]; then
    export DEVCOMM_P2P_MAX_BLOCKS=${DEVCOMM_P2P_MAX_BLOCKS:-8}
    export DEVCOMM_REDUCE_MAX_BLOCKS=${DEVCOMM_REDUCE_MAX_BLOCKS:-8}
  fi
  if ! echo get_server_list | "$mps_control" >/dev/null 2>&1; then
    if [ -n "${MPS_GPU:-}" ]; then
      CUDA_VISIBLE_DEVICES=$MPS_GPU "$mps_control" -d
    else
      "$mps_control" -d
    fi || { echo "shared-gpu: cannot start the MPS server" >&2; exit 2; }
    started=1
  fi
  [ -n "${MPS_GPU:-}" ] && unset CUDA_VISIBLE_DEVICES
fi
stop_mps() {
  if [ "$started" = 1 ]; then
    echo quit | "$mps_control" >/dev/null 2>&1
    started=0
  fi
}
trap stop_mps EXIT
# The GPUs the ranks can open: CUDA_VISIBLE_DEVICES's list where it is set (nvidia-smi lists
# every GPU of the machine whatever it says).
gpus=$(nvidia-smi -L | wc -l)
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
echo "shared-gpu: $ranks ranks on $gpus GPU(s), MPS=$use_mps${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:+, $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE% of the SMs each}${DEVCOMM_P2P_MAX_BLOCKS:+, DEVCOMM_P2P_MAX_BLOCKS=$DEVCOMM_P2P_MAX_BLOCKS}"
if [ "${LAUNCHER:-devcomm}" = none ]; then
  "$@"
else
  dist/devcomm launch -n "$ranks" -- "$@"
fi
rc=$?
if [ "$use_mps" = 1 ] && [ "$rc" != 0 ]; then
  tail -n 20 "$CUDA_MPS_LOG_DIRECTORY"/*.log 2>/dev/null
fi
exit $rc
