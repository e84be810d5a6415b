#!/usr/bin/env bash
# One short call on the GPU machine while working on the CUDA backend (2-4 minutes):
#   run(command="bash bench/cuda_quick_run.sh", carry=[".deps"])
# builds, runs the op tests (quick mode), then `lumen bench --backend cuda` on the
# Qwen2.5-1.5B-shaped models (bf16 folder and Q4_K_M-like GGUF): prefill of 512
# tokens and decode at 1, 8, 64 and 256 sequences. The full, recorded benchmark with
# the transformers peer is bench/cuda_bench_run.sh.
# Environment: LUMEN_QUICK_PAR (default 1,8,64,256), LUMEN_QUICK_GEN (64),
# LUMEN_QUICK_TESTS=0 skips the op tests (=full: all their cases), LUMEN_QUICK_ARGS adds
# arguments to every lumen bench, LUMEN_QUICK_MODELS=hf benches only the bf16
# folder, LUMEN_QUICK_VARIANTS="A=1 B=2" benches the bf16 folder again once per
# variable setting (e.g. LUMEN_CUDA_TC_MAX_N=0), for side-by-side comparisons.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/bench/cuda_env.sh"
lumen_cuda_setup lumen_cli bench_make_model test_backend_ops test_topk_cuda || exit 2
if [ "${LUMEN_QUICK_TESTS:-1}" != 0 ]; then
  quick=1
  [ "${LUMEN_QUICK_TESTS:-1}" = full ] && quick=
  (cd "$ROOT" && env ${quick:+LUMEN_TEST_OPS_QUICK=1} timeout 300 "$BUILD/tests/test_backend_ops") > "$OUT/ops.log" 2>&1
  echo "op tests: status $?"
  grep -E "FAIL|DIFFER|comparisons|graphs|SKIPPED|rror" "$OUT/ops.log" | head -20
  (cd "$ROOT" && timeout 120 "$BUILD/tests/test_topk_cuda") > "$OUT/topk.log" 2>&1
  echo "test_topk_cuda: status $?"
  tail -3 "$OUT/topk.log"
fi
lumen_bench_models
bench_one() { # model, label
  echo "=== $2"
  LUMEN_CUDA_GRAPHS_LOG=1 timeout 200 "$BUILD/lumen" bench "$1" --backend cuda -p 512 -n "${LUMEN_QUICK_GEN:-64}" -r 3 \
    --parallel "${LUMEN_QUICK_PAR:-1,8,64,256}" --parallel-prompt 128 ${LUMEN_QUICK_ARGS:-} 2>&1 | tee -a "$OUT/bench.log" | grep -v "^\s*$" | tail -12
}
models="$HF"
[ "${LUMEN_QUICK_MODELS:-all}" = hf ] || models="$HF $GGUF"
for model in $models; do bench_one "$model" "$(basename "$model")"; done
for v in ${LUMEN_QUICK_VARIANTS:-}; do
  (export "${v?}"; bench_one "$HF" "$(basename "$HF") with $v")
done
