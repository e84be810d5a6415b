#!/usr/bin/env bash
# One token's decode attention in the 4-warp staged form (LUMEN_X_ATTN_W4S=1: 168
# registers, 3 stages a warp, so its block fits beside the bf16 Q/K/V product's) against
# the 8-warp form, one tree, side by side (bf16; Q4_K_M with GGUF=1); op tests with the
# knob on; the attention's profiles; bf16 at the whole carveout for shared memory again
# (LUMEN_CUDA_CARVEOUT=100), now that the padded norm lets the attention in early.
#   run(command="bash bench/next_call.sh", carry=[".deps"])
set -uo pipefail
runs='work HF 1;work HF 1 LUMEN_X_ATTN_W4S=1;work HF 1 LUMEN_CUDA_CARVEOUT=100'
[ "${GGUF:-0}" = 1 ] && runs="$runs;work GGUF 1;work GGUF 1 LUMEN_X_ATTN_W4S=1"
OPS=0 REPS=${REPS:-3} RUNS="$runs" bash bench/cuda_side_by_side.sh
export ROOT=$PWD BUILD=$PWD/build-cuda-work OUT=${OUT:-$PWD/cuda-run-out}
. bench/cuda_env.sh; lumen_cuda_env; lumen_bench_models > /dev/null 2>&1
for k in 0 1; do
  prof=$(LUMEN_X_ATTN_W4S=$k LUMEN_CUDA_ATTN_PROFILE=1 build-cuda-work/lumen bench "$HF" --backend cuda -p 64 \
    --parallel 1 --parallel-prompt 128 -n 128 -r 1 2>&1 | grep 'attention profile' | sed 's/.*mean us: //')
  echo "W4S=$k $(basename "$HF"): $prof"
done
LUMEN_X_ATTN_W4S=1 timeout 100 build-cuda-work/tests/test_backend_ops > "$OUT/ops-w4s.log" 2>&1
echo "op tests with LUMEN_X_ATTN_W4S=1: status $?"; grep -E 'FAIL|DIFFER|comparisons' "$OUT/ops-w4s.log" | head -5
