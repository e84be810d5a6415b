#!/usr/bin/env bash
# The decode attention's batch-1 block alone on its SM after 8-bit products
# (LUMEN_CUDA_ATTN_ALONE=0 turns it off) against main at the session's start (383def8),
# side by side in one call, op tests included, with the attention's profiles.
# Here first: bash bench/cuda_device_run.sh --prepare-deps && bash bench/cuda_side_by_side.sh --prepare 383def8
#   then run(command="bash bench/next_call.sh", carry=[".deps", ".alt"])
set -uo pipefail
OPS=1 REPS=3 RUNS='383def8 GGUF 1;work GGUF 1;work GGUF 1 LUMEN_CUDA_ATTN_ALONE=0;383def8 HF 1;work HF 1;work HF 1 LUMEN_CUDA_NORM_ALONE=0' \
  bash bench/cuda_side_by_side.sh
export ROOT=$PWD BUILD=$PWD/build-cuda-work OUT=${OUT:-$PWD/cuda-run-out}
. bench/cuda_env.sh; lumen_cuda_env; lumen_bench_models > /dev/null 2>&1
for t in 383def8 work; do
  echo "$t $(basename "$GGUF"): $(LUMEN_CUDA_ATTN_PROFILE=1 build-cuda-$t/lumen bench "$GGUF" --backend cuda -p 64 \
    --parallel 1 --parallel-prompt 128 -n 128 -r 1 2>&1 | grep 'attention profile' | sed 's/.*mean us: //')"
done
