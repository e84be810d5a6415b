#!/usr/bin/env bash
# The real SmolLM2-135M-Instruct (Q4_1, 98 MB) on the GPU machine: golden logits
# against llama.cpp on the CUDA backend, and the engine benchmarks (issue 5) there.
#
# The model is larger than what one call may carry (64 MiB), so it travels in two
# halves over two calls made back to back on the same warm machine (prepared here
# with `split -b 49181216 MODEL .m1/a .m2/b`-style halves: see docs/BENCHMARKS.md):
#   run(command="mkdir -p /tmp/lumen-m && cp .m1/a /tmp/lumen-m/a", carry=[".m1"])
#   run(command="bash bench/cuda_smollm2_run.sh", carry=[".deps", ".m2"])
# This script joins the halves, checks the SHA-256 the pull recorded, installs the
# file where `lumen pull` would, builds with CUDA, then runs
#  1. golden_models smollm2-135m-exact and smollm2-135m-f32 with
#     LUMEN_TEST_BACKEND=cuda: the CUDA backend's logits against llama.cpp's;
#  2. golden_generate smollm2-135m on CUDA: greedy continuations through the API;
#     golden_engine on CUDA: 32 prompts generated together against each alone, on
#     the file (default, exact and precise modes) and on its bf16 conversion (`lumen
#     convert`: there the GEMMs and the matrix-vector kernels read the same weights,
#     where the file's GEMMs read bf16 copies of weights a sequence alone decodes
#     exactly);
#  3. bench_engine --backend cuda: (a) 512 conversations sharing a prefix, max_tokens
#     1, against one at a time; (b) time to first token of turn 10 of a chat.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/cuda-run-out}"
BUILD="${LUMEN_CUDA_BUILD:-/tmp/lumen-build-cuda}"
mkdir -p "$OUT" "$BUILD"
DIR="$HOME/.cache/lumen/models/smollm2-135m"
FILE="$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$DIR"
if [ ! -f "$FILE" ]; then
  [ -f /tmp/lumen-m/a ] && [ -f "$ROOT/.m2/b" ] || { echo "missing a half of the model (see the header)"; exit 2; }
  cat /tmp/lumen-m/a "$ROOT/.m2/b" > "$FILE.tmp"
  if [ "$(sha256sum "$FILE.tmp" | cut -c1-64)" != "$(cat "$ROOT/.m2/sha")" ]; then
    echo "SHA-256 mismatch: the halves do not make the pulled file"; rm -f "$FILE.tmp"; exit 2
  fi
  mv "$FILE.tmp" "$FILE" && cp "$ROOT/.m2/.verified" "$DIR/.verified"
fi
echo "model: $(ls -la "$FILE")"
. "$ROOT/bench/cuda_env.sh"
lumen_cuda_env || exit 2
lumen_cuda_build lumen_cli golden_models golden_generate golden_engine bench_engine || exit 2
cd "$ROOT"
# The published Q4_1 file is judged as the exact math (llama.cpp on the same weights
# dequantized to F32, F32 KV cache): the CUDA backend decodes weights exactly and keeps
# activations in float, where llama.cpp's own Q4_1 run rounds them to 8 bits.
echo "=== golden logits on CUDA: smollm2-135m-exact (default paths: bf16 activations above 4 tokens)"
LUMEN_TEST_BACKEND=cuda timeout 300 "$BUILD/tests/golden_models" smollm2-135m-exact 2>&1 | tee "$OUT/golden.log" | tail -9
echo "=== the same, every product on the exact f32 path (LUMEN_CUDA_MV_MAX_N=1e9)"
LUMEN_CUDA_MV_MAX_N=1000000000 LUMEN_TEST_BACKEND=cuda timeout 300 "$BUILD/tests/golden_models" smollm2-135m-exact 2>&1 | tee "$OUT/golden_exact.log" | tail -9
echo "=== golden logits on CUDA: smollm2-135m-f32 (the F32 GGUF, made here)"
LUMEN_TEST_BACKEND=cuda timeout 300 "$BUILD/tests/golden_models" smollm2-135m-f32 2>&1 | tail -9
echo "=== greedy generation through the API on CUDA"
LUMEN_TEST_BACKEND=cuda timeout 200 "$BUILD/tests/golden_generate" smollm2-135m 2>&1 | tail -8
echo "=== batch invariance of the engine on CUDA (32 prompts together vs alone), default paths"
LUMEN_TEST_BACKEND=cuda timeout 200 "$BUILD/tests/golden_engine" smollm2-135m > "$OUT/engine_inv.log" 2>&1
echo "status $? ($(grep -c "differs from alone" "$OUT/engine_inv.log") prompt-rounds of 64 differ from alone)"
grep -E "differs|prompts differ|together|peak|generate:" "$OUT/engine_inv.log" | head -16
echo "=== the same with every product exact f32 and every attention scalar (LUMEN_CUDA_MV_MAX_N=1e9)"
LUMEN_CUDA_MV_MAX_N=1000000000 LUMEN_TEST_BACKEND=cuda timeout 200 "$BUILD/tests/golden_engine" smollm2-135m > "$OUT/engine_inv_exact.log" 2>&1
echo "status $? ($(grep -c "differs from alone" "$OUT/engine_inv_exact.log") prompt-rounds of 64 differ from alone)"
echo "=== the same in the precise mode (LUMEN_CUDA_PRECISE=1: GEMM activations as bf16 hi + lo)"
LUMEN_CUDA_PRECISE=1 LUMEN_TEST_BACKEND=cuda timeout 200 "$BUILD/tests/golden_engine" smollm2-135m > "$OUT/engine_inv_precise.log" 2>&1
echo "status $? ($(grep -c "differs from alone" "$OUT/engine_inv_precise.log") prompt-rounds of 64 differ from alone)"
grep -E "prompts differ" "$OUT/engine_inv_precise.log"
echo "=== the same, default paths, on the file's bf16 conversion (lumen convert)"
rm -rf "$BUILD/smollm2-bf16"
if "$BUILD/lumen" convert "$FILE" "$BUILD/smollm2-bf16" > "$OUT/convert.log" 2>&1; then
  LUMEN_TEST_BACKEND=cuda timeout 200 "$BUILD/tests/golden_engine" "$BUILD/smollm2-bf16" > "$OUT/engine_inv_bf16.log" 2>&1
  echo "status $? ($(grep -c "differs from alone" "$OUT/engine_inv_bf16.log") prompt-rounds of 64 differ from alone)"
  grep -E "prompts differ" "$OUT/engine_inv_bf16.log"
else
  echo "lumen convert failed: $(tail -1 "$OUT/convert.log")"
fi
echo "=== engine benchmarks on CUDA"
timeout 300 "$BUILD/bench_engine" --backend cuda --model smollm2-135m --baseline-n 64 2>&1 | tee "$OUT/engine.log" | tail -30
