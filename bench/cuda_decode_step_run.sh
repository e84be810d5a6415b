#!/usr/bin/env bash
# One call on the GPU machine for the persistent decode kernel (decode_step,
# src/backend/cuda/cuda_decode_step.cu), 1-2 minutes:
#
#   run(command="bash bench/cuda_decode_step_run.sh", carry=[".deps"])
#
# Builds, runs the op tests in quick mode (their decode tests check the kernel against
# the op-by-op pass and the CPU), then on the Qwen2.5-1.5B-shaped bf16 folder:
#   - block 0's time in each stage of a step (LUMEN_CUDA_DECODE_PROFILE=1), once per
#     setting in LUMEN_DS_VARIANTS (default: the kernel's defaults only; e.g.
#     "X=0 LUMEN_CUDA_DECODE_L2_AHEAD=0" adds a run with that variable set);
#   - batch-1 decode with the kernel and op by op, side by side (3 repetitions), on the
#     bf16 folder and the Q4_K_M-like GGUF (op by op both times where the kernel does not
#     serve the model's formats);
#   - with LUMEN_DS_STREAM=1 first, bench/bench_cuda_stream.cu (the weight stream alone:
#     chunk sizes, slots, consumers' reads, L2 requests ahead).
# Logs go to $OUT (ops.log, profile-*.log, stream.log).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/bench/cuda_env.sh"
lumen_cuda_setup lumen_cli bench_make_model test_backend_ops || exit 2
if [ "${LUMEN_DS_STREAM:-0}" = 1 ]; then
  "$NVCC" -O2 -arch=sm_90a -I"$ROOT/src" -o "$BUILD/bench_cuda_stream" "$ROOT/bench/bench_cuda_stream.cu" &&
    "$BUILD/bench_cuda_stream" > "$OUT/stream.log" 2>&1
  echo "bench_cuda_stream: status $?"
  cat "$OUT/stream.log"
fi
(cd "$ROOT" && LUMEN_TEST_OPS_QUICK=1 timeout 200 "$BUILD/tests/test_backend_ops") > "$OUT/ops.log" 2>&1
echo "op tests: status $?"
grep -E "^  decode|FAIL|comparisons" "$OUT/ops.log"
lumen_bench_models
step_args=(--backend cuda -p 64 --parallel 1 --parallel-prompt 128)
for v in ${LUMEN_DS_VARIANTS:-X=0}; do
  echo "=== profile, $v"
  env "$v" LUMEN_CUDA_DECODE_STEP=1 LUMEN_CUDA_DECODE_PROFILE=1 timeout 60 "$BUILD/lumen" bench "$HF" \
    "${step_args[@]}" -n 32 -r 1 > "$OUT/profile-${v%%=*}-${v#*=}.log" 2>&1
  grep -E "decode_step profile: (wait|head|waits|layer [0-9]+'s)" "$OUT/profile-${v%%=*}-${v#*=}.log" |
    sed 's/decode_step profile: //'
done
for model in "$HF" "$GGUF"; do
  for on in 1 0; do
    echo "=== $(basename "$model"), LUMEN_CUDA_DECODE_STEP=$on"
    LUMEN_CUDA_DECODE_STEP=$on timeout 100 "$BUILD/lumen" bench "$model" "${step_args[@]}" -n 128 -r 3 2>&1 |
      grep -E "^ +1 "
  done
done
