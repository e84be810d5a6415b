#!/usr/bin/env bash
# One warp a row in the short products of few rows (LUMEN_X_MV_WPR1=1: the bf16 Q/K/V
# and O products at half the warps, so an SM keeps registers for the decode attention's
# 8-warp block beside them), with and without the whole carveout for shared memory
# (LUMEN_CUDA_CARVEOUT=100: the attention's ~144 KB then fits beside the product's
# blocks too), bf16 batch 1, one tree, side by side; the attention's profiles (its
# wait grows if it arrives early); op tests with the knob on.
#   run(command="bash bench/next_call.sh", carry=[".deps"])
set -uo pipefail
v1='LUMEN_X_MV_WPR1=1' v2='LUMEN_X_MV_WPR1=1 LUMEN_CUDA_CARVEOUT=100'
OPS=0 REPS=${REPS:-3} RUNS="work HF 1;work HF 1 $v1;work HF 1 $v2" bash bench/cuda_side_by_side.sh
export ROOT=$PWD BUILD=$PWD/build-cuda-work OUT=${OUT:-$PWD/cuda-run-out}
. bench/cuda_env.sh; lumen_cuda_env; lumen_bench_models > /dev/null 2>&1
for v in 'LUMEN_X_NONE=0' "$v1" "$v2"; do
  prof=$(env $v LUMEN_CUDA_ATTN_PROFILE=1 build-cuda-work/lumen bench "$HF" --backend cuda -p 64 --parallel 1 \
    --parallel-prompt 128 -n 128 -r 1 2>&1 | grep 'attention profile' | sed 's/.*mean us: //')
  echo "$v: $prof"
done
LUMEN_X_MV_WPR1=1 timeout 100 build-cuda-work/tests/test_backend_ops > "$OUT/ops-wpr1.log" 2>&1
echo "op tests with LUMEN_X_MV_WPR1=1: status $?"; grep -E 'FAIL|DIFFER|comparisons' "$OUT/ops-wpr1.log" | head -5
