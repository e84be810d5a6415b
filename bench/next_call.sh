#!/usr/bin/env bash
# main (the own row in its stage, the merge by rows) against the commit before it
# (56668f2) and main with the element-wise merge (own-only), side by side in one call,
# op tests included.
# Here first: bash bench/cuda_device_run.sh --prepare-deps && bash bench/cuda_side_by_side.sh --prepare 56668f2 own-only
#   then run(command="bash bench/next_call.sh", carry=[".deps", ".alt"])
set -uo pipefail
OPS=1 REPS=3 RUNS='56668f2 GGUF 1;own-only GGUF 1;work GGUF 1;56668f2 HF 1;own-only HF 1;work HF 1' \
  bash bench/cuda_side_by_side.sh
export ROOT=$PWD BUILD=$PWD/build-cuda-work OUT=${OUT:-$PWD/cuda-run-out}
. bench/cuda_env.sh; lumen_cuda_env; lumen_bench_models > /dev/null 2>&1
for t in 56668f2 own-only work; do for m in "$GGUF" "$HF"; do
  echo "$t $(basename "$m"): $(LUMEN_CUDA_ATTN_PROFILE=1 build-cuda-$t/lumen bench "$m" --backend cuda -p 64 --parallel 1 \
    --parallel-prompt 128 -n 128 -r 1 2>&1 | grep 'attention profile' | sed 's/.*mean us: //')"
done; done
REPS=1 RUNS='56668f2 HF 64;work HF 64' bash bench/cuda_side_by_side.sh
