#!/usr/bin/env bash
# Main's form of the thirty-sixth session's two changes (the element-wise merge back,
# the one-row norm alone on its SM), measured there only as the branches own-only and
# x-alone, against the session's first commit (2872f51), side by side in one call, op
# tests included, with the attention's profiles.
# Here first: bash bench/cuda_device_run.sh --prepare-deps && bash bench/cuda_side_by_side.sh --prepare 2872f51
#   then run(command="bash bench/next_call.sh", carry=[".deps", ".alt"])
set -uo pipefail
OPS=1 REPS=3 RUNS='2872f51 GGUF 1;work GGUF 1;2872f51 HF 1;work HF 1' bash bench/cuda_side_by_side.sh
export ROOT=$PWD BUILD=$PWD/build-cuda-work OUT=${OUT:-$PWD/cuda-run-out}
. bench/cuda_env.sh; lumen_cuda_env; lumen_bench_models > /dev/null 2>&1
for t in 2872f51 work; do for m in "$GGUF" "$HF"; do
  echo "$t $(basename "$m"): $(LUMEN_CUDA_ATTN_PROFILE=1 build-cuda-$t/lumen bench "$m" --backend cuda -p 64 \
    --parallel 1 --parallel-prompt 128 -n 128 -r 1 2>&1 | grep 'attention profile' | sed 's/.*mean us: //')"
done; done
REPS=1 RUNS='2872f51 HF 64;work HF 64' bash bench/cuda_side_by_side.sh
