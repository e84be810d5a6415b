#!/usr/bin/env bash
# One token's decode attention in the 4-warp staged form (LUMEN_X_ATTN_W4S=1: 168
# registers, 3 stages a warp, so its block fits beside the bf16 Q/K/V product's) against
# the 8-warp form, one tree, side by side; op tests with the knob on; the profiles.
#   run(command="bash bench/next_call.sh", carry=[".deps"])
set -uo pipefail
OPS=1 REPS=3 RUNS='work HF 1;work HF 1 LUMEN_X_ATTN_W4S=1;work GGUF 1;work GGUF 1 LUMEN_X_ATTN_W4S=1' \
  bash bench/cuda_side_by_side.sh
export ROOT=$PWD BUILD=$PWD/build-cuda-work OUT=${OUT:-$PWD/cuda-run-out}
. bench/cuda_env.sh; lumen_cuda_env; lumen_bench_models > /dev/null 2>&1
LUMEN_X_ATTN_W4S=1 timeout 150 build-cuda-work/tests/test_backend_ops > "$OUT/ops-w4s.log" 2>&1
echo "op tests with LUMEN_X_ATTN_W4S=1: status $?"; grep -E 'FAIL|DIFFER|comparisons' "$OUT/ops-w4s.log" | head -5
for k in 0 1; do for m in "$HF" "$GGUF"; do
  echo "W4S=$k $(basename "$m"): $(LUMEN_X_ATTN_W4S=$k LUMEN_CUDA_ATTN_PROFILE=1 build-cuda-work/lumen bench "$m" \
    --backend cuda -p 64 --parallel 1 --parallel-prompt 128 -n 128 -r 1 2>&1 | grep 'attention profile' | sed 's/.*mean us: //')"
done; done
