#!/usr/bin/env bash
# The bf16 Q/K/V and O products at one token in blocks of 16 warps, one an SM
# (LUMEN_X_MV_WIDE=1, cuda_matmul.cu, mv_wide_blocks), so the decode attention finds
# SMs empty and does its part before the wait under the Q/K/V product: bf16 batch 1,
# one tree, side by side; the attention's profiles (its wait grows if it arrives
# early); op tests with the knob on.
#   run(command="bash bench/next_call.sh", carry=[".deps"])
set -uo pipefail
v='LUMEN_X_MV_WIDE=1'
OPS=0 REPS=${REPS:-3} RUNS="work HF 1;work HF 1 $v" bash bench/cuda_side_by_side.sh
export ROOT=$PWD BUILD=$PWD/build-cuda-work OUT=${OUT:-$PWD/cuda-run-out}
. bench/cuda_env.sh; lumen_cuda_env; lumen_bench_models > /dev/null 2>&1
for e in 'LUMEN_X_NONE=0' "$v"; do
  prof=$(env $e LUMEN_CUDA_ATTN_PROFILE=1 build-cuda-work/lumen bench "$HF" --backend cuda -p 64 --parallel 1 \
    --parallel-prompt 128 -n 128 -r 1 2>&1 | grep 'attention profile' | sed 's/.*mean us: //')
  echo "$e: $prof"
done
env $v timeout 100 build-cuda-work/tests/test_backend_ops > "$OUT/ops-wide.log" 2>&1
echo "op tests with $v: status $?"; grep -E 'FAIL|DIFFER|differ|comparisons' "$OUT/ops-wide.log" | head -5
