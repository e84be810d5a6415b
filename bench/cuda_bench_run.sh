#!/usr/bin/env bash
# One call on the GPU machine, under 9 minutes: the end-to-end benchmark of issue 7.
#
#   run(command="bash bench/cuda_bench_run.sh", carry=[".deps"])
#
#  1. builds with -DLUMEN_CUDA=ON (lumen, bench_make_model, bench_cuda_matvec,
#     test_backend_ops);
#  2. measures the ceilings (device-to-device copy, host download of logits) and
#     checks matmul_many against separate matmuls bit for bit;
#  3. writes a Qwen2.5-Coder-1.5B-shaped model with random weights twice: a GGUF with
#     a Q4_K_M-like mix and a Hugging Face folder in bf16 holding the same values
#     (bench/bench_make_model.c; about 1 GB + 3.1 GB, in /dev/shm or /tmp, never $OUT);
#  4. `lumen bench --backend cuda` on both: prefill of a 512-token prompt, decode at
#     1, 8, 64 and 256 parallel sequences (128-token prompts, 128 generated, the
#     logits of every sequence copied to the host each step); then bf16 again with
#     --logits last at 64 and 256 (what the copy of the logits costs), and both
#     with --logits greedy at 1 and 8 (each row's best logit only: greedy decoding);
#  5. the op tests in quick mode (test_backend_ops: the kernels still match the CPU);
#  6. Hugging Face transformers on the bf16 folder (bench/hf_peer.py: static cache,
#     torch.compile as transformers applies it by itself, batch sizes 1, 64, 8, 256
#     in that order while time remains);
#  7. prints the table (bench/cuda_bench_table.py): every figure with its fraction of
#     the limit (decode: bytes per step x steps/s over the measured copy rate;
#     prefill: FLOPs over 790 TFLOP/s bf16).
#
# Each step is timed and bounded; a step that fails or runs out of time is reported
# and the rest still run; the table shows what was measured. $OUT receives at most 10
# files: build.log, bench.log (every step's output), lumen_q4km.json,
# lumen_bf16.json, lumen_bf16_last.json, lumen_greedy_q4km.json, lumen_greedy_bf16.json,
# hf_peer.json, summary.txt.
# Environment: LUMEN_BENCH_BUDGET (seconds, default 525), LUMEN_BENCH_REPS (3),
# LUMEN_BENCH_MODELS (model folder), LUMEN_CUDA_BUILD (build folder), LUMEN_JOBS.
# LUMEN_BENCH_DRYRUN=1 runs the same steps on the CPU with a tiny shape and short
# runs (no GPU, no CUDA build; torch on the CPU): a check of the script itself.
# Exit status: 0 when every Lumen measurement ran and the op tests passed, 1
# otherwise, 2 when the build fails.
set -euo pipefail

T0=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/cuda-run-out}"
BUILD="${LUMEN_CUDA_BUILD:-$ROOT/build-cuda-device}"
BUDGET="${LUMEN_BENCH_BUDGET:-525}"
REPS="${LUMEN_BENCH_REPS:-3}"
JOBS="${LUMEN_JOBS:-$(nproc)}"
PAR="1,8,64,256" SMALL_PAR="1,8" BIG_PAR="64,256" HF_BATCHES="1,64,8,256" LAST_PAR="64,256"
PROMPT=128 GEN=128 PP=512
BACKEND=cuda CUDA_FLAG=ON HF_DEV=cuda SHAPE=() PY="${LUMEN_BENCH_PYTHON:-python3}"
if [ "${LUMEN_BENCH_DRYRUN:-0}" = 1 ]; then
  PAR="1,4" SMALL_PAR="1" BIG_PAR="4" HF_BATCHES="1,4" LAST_PAR="4" PROMPT=16 GEN=8 PP=64 BACKEND=cpu CUDA_FLAG=OFF HF_DEV=cpu REPS=1
  SHAPE=(--layers 2 --vocab 4096 --embd 256 --ff 512 --heads 4 --kv-heads 2 --head-dim 64)
fi
mkdir -p "$OUT" "$BUILD"
LOG="$OUT/bench.log"
: > "$LOG"

elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }
step() { echo; echo "=== [+$(elapsed)s] $*" | tee -a "$LOG"; }
RC=0

# peak GPU memory of a step: nvidia-smi samples in the background
MEMF="$(mktemp)"
MEMPID=""
mem_start() {
  : > "$MEMF"
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$MEMF" 2> /dev/null &
    MEMPID=$!
  fi
}
mem_stop() {
  if [ -n "$MEMPID" ]; then
    kill "$MEMPID" 2> /dev/null || true
    wait "$MEMPID" 2> /dev/null || true
    MEMPID=""
    echo "  peak GPU memory in use: $(sort -n "$MEMF" | tail -1) MiB ($1)" | tee -a "$LOG"
  fi
}
trap 'mem_stop end > /dev/null 2>&1 || true; rm -f "$MEMF"' EXIT

# ---- 1. build ------------------------------------------------------------------
step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG" || true
echo "cores: $(nproc), budget ${BUDGET}s" | tee -a "$LOG"

step "build (LUMEN_CUDA=$CUDA_FLAG, Release, -j$JOBS)"
# shellcheck source=bench/cuda_env.sh
. "$ROOT/bench/cuda_env.sh"
if ! lumen_cuda_env; then exit 2; fi
CUDA_ARGS=(-DLUMEN_CUDA="$CUDA_FLAG")
[ "$CUDA_FLAG" = OFF ] || CUDA_ARGS+=(-DCMAKE_CUDA_COMPILER="$NVCC")
if ! cmake -S "$ROOT" -B "$BUILD" "${CUDA_ARGS[@]}" -DCMAKE_BUILD_TYPE=Release \
     > "$OUT/build.log" 2>&1 ||
   ! timeout 300 cmake --build "$BUILD" -j"$JOBS" --target lumen_cli bench_make_model bench_cuda_matvec test_backend_ops \
     >> "$OUT/build.log" 2>&1; then
  grep -E -A4 "error|Error" "$OUT/build.log" | head -60
  tail -15 "$OUT/build.log"
  echo "build failed after $(elapsed)s"
  exit 2
fi
echo "built in $(elapsed)s ($(grep -c warning "$OUT/build.log" || true) compiler warnings)" | tee -a "$LOG"
LUMEN="$BUILD/lumen"

# ---- 2. ceilings ---------------------------------------------------------------
step "ceilings (device copy, host download) and the matmul_many check"
COPY_GBS=0
if timeout 60 "$BUILD/bench_cuda_matvec" --copy-only > "$OUT/ceil.tmp" 2>&1; then
  COPY_GBS="$(sed -n 's/^device copy: \([0-9.]*\) GB.*/\1/p' "$OUT/ceil.tmp" | head -1)"
  COPY_GBS="${COPY_GBS:-0}"
fi
grep -E "copy|download|matmul_many|SKIPPED|rror" "$OUT/ceil.tmp" | tee -a "$LOG" || true
if grep -q "DIFFERS" "$OUT/ceil.tmp"; then RC=1; fi
rm -f "$OUT/ceil.tmp"

# ---- 3. models -----------------------------------------------------------------
MODELS="${LUMEN_BENCH_MODELS:-}"
if [ -z "$MODELS" ]; then
  shm_free_kb="$(df -Pk /dev/shm 2> /dev/null | awk 'NR == 2 {print $4}')"
  if [ "${shm_free_kb:-0}" -gt $(( 10 * 1024 * 1024 )) ]; then MODELS=/dev/shm/lumen-bench; else MODELS=/tmp/lumen-bench; fi
fi
GGUF="$MODELS/qwen2.5-1.5b-shaped-q4_k_m.gguf"
HF="$MODELS/qwen2.5-1.5b-shaped-bf16"
step "models in $MODELS (random weights, Qwen2.5-1.5B shapes)"
mkdir -p "$MODELS"
if [ -f "$MODELS/.done" ] && [ -f "$GGUF" ] && [ -f "$HF/model.safetensors" ]; then
  echo "already there (a warm machine)" | tee -a "$LOG"
else
  rm -f "$MODELS/.done"
  t=$(date +%s)
  if timeout 200 "$BUILD/bench_make_model" --gguf "$GGUF" --hf "$HF" --threads "$(nproc)" "${SHAPE[@]}" >> "$LOG" 2>&1; then
    touch "$MODELS/.done"
  else
    echo "bench_make_model failed (status $?)" | tee -a "$LOG"
  fi
  tail -4 "$LOG"
  echo "models: $(( $(date +%s) - t ))s" | tee -a "$LOG"
fi
ls -la "$GGUF" "$HF" 2>&1 | tee -a "$LOG" | head -8 || true

# ---- 4. Lumen ------------------------------------------------------------------
# appends one JSON line to $OUT/NAME.json per call (the table merges them), so a
# batch size that runs out of time leaves the earlier ones measured
lumen_bench() { # name model timeout extra-args...
  local name="$1" model="$2" tmo="$3"
  shift 3
  local t st=0
  t=$(date +%s)
  if [ ! -e "$model" ]; then
    echo "skipped: no $model" | tee -a "$LOG"
    RC=1
    return 0
  fi
  [ "$tmo" -gt 5 ] || { echo "skipped: no time left" | tee -a "$LOG"; RC=1; return 0; }
  mem_start
  timeout "$tmo" "$LUMEN" bench "$model" --backend "$BACKEND" -r "$REPS" -p "$PP" -n "$GEN" --parallel-prompt "$PROMPT" "$@" \
    --json > "$OUT/one.tmp" 2>> "$LOG" || st=$?
  mem_stop "$name $*"
  echo "$name $*: status $st in $(( $(date +%s) - t ))s" | tee -a "$LOG"
  [ "$st" -eq 0 ] || RC=1
  cat "$OUT/one.tmp" >> "$OUT/$name.json" 2> /dev/null || true
  cat "$OUT/one.tmp" >> "$LOG" 2> /dev/null || true
  rm -f "$OUT/one.tmp"
  echo >> "$LOG"
}
cap() { local a="$1" b="$2"; [ "$a" -lt "$b" ] && echo "$a" || echo "$b"; }

for spec in "lumen_q4km:$GGUF:Q4_K_M-like GGUF:270" "lumen_bf16:$HF:bf16 folder:230"; do
  IFS=: read -r name model what reserve <<< "$spec"
  step "lumen bench --backend cuda: $what"
  rm -f "$OUT/$name.json"
  lumen_bench "$name" "$model" "$(cap 90 $(( $(left) - reserve )))" --parallel "$SMALL_PAR"
  lumen_bench "$name" "$model" "$(cap 120 $(( $(left) - reserve + 30 )))" --parallel "$BIG_PAR" -p 0
done

# ---- 4b. what the copy of the logits costs ----------------------------------
step "lumen bench, bf16, --logits last (64 and 256 sequences)"
if [ "$(left)" -gt 200 ]; then
  rm -f "$OUT/lumen_bf16_last.json"
  lumen_bench lumen_bf16_last "$HF" "$(cap 60 $(( $(left) - 190 )))" --parallel "$LAST_PAR" --logits last -p 0
else
  echo "skipped: $(left)s left" | tee -a "$LOG"
fi

# ---- 4c. greedy decoding: each row's best logit only -----------------------------
step "lumen bench, --logits greedy (1 and 8 sequences, both models)"
rm -f "$OUT/lumen_greedy_q4km.json" "$OUT/lumen_greedy_bf16.json"
for spec in "$GGUF:q4km" "$HF:bf16"; do
  IFS=: read -r model tag <<< "$spec"
  if [ "$(left)" -gt 200 ]; then
    lumen_bench "lumen_greedy_$tag" "$model" "$(cap 45 $(( $(left) - 180 )))" --parallel "$SMALL_PAR" --logits greedy -p 0
  else
    echo "skipped: $(left)s left" | tee -a "$LOG"
  fi
done

# ---- 5. op tests: the numbers mean something only if the kernels are right -------
step "op tests (test_backend_ops, quick: CUDA vs CPU)"
st=0
(cd "$ROOT" && LUMEN_TEST_OPS_QUICK=1 timeout 90 "$BUILD/tests/test_backend_ops") > "$OUT/ops.tmp" 2>&1 || st=$?
grep -E "FAIL|comparisons|SKIPPED" "$OUT/ops.tmp" | head -12 | tee -a "$LOG" || true
echo "op tests: status $st (0: pass, 1: failures, 77: skipped, 124: timed out)" | tee -a "$LOG"
[ "$st" -eq 0 ] || [ "$st" -eq 77 ] || RC=1
rm -f "$OUT/ops.tmp"

# ---- 6. Hugging Face transformers ----------------------------------------------
step "Hugging Face transformers (static cache) on the bf16 folder"
HF_LEFT=$(( $(left) - 45 ))
if [ ! -f "$HF/model.safetensors" ]; then
  echo "skipped: no $HF" | tee -a "$LOG"
elif [ "$HF_LEFT" -lt 30 ]; then
  echo "skipped: ${HF_LEFT}s left" | tee -a "$LOG"
else
  mem_start
  t=$(date +%s)
  st=0
  # the peer runs on its own libraries (not those of .deps), offline (nothing is reachable)
  env -u LD_LIBRARY_PATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout "$HF_LEFT" "$PY" "$ROOT/bench/hf_peer.py" "$HF" --device "$HF_DEV" \
    --batches "$HF_BATCHES" \
    --prompt "$PROMPT" --gen "$GEN" --pp "$PP" --reps "$REPS" --budget-s $(( HF_LEFT - 15 )) \
    --json "$OUT/hf_peer.json" > /dev/null 2>> "$LOG" || st=$?
  mem_stop hf_peer
  note=""
  [ "$st" -ne 124 ] || note=" (cut at the time limit; what it measured is kept)"
  echo "transformers peer: status $st in $(( $(date +%s) - t ))s$note" | tee -a "$LOG"
  rm -f "$OUT/hf_peer.json.tmp"
  grep "^hf_peer:" "$LOG" | tail -6 || true
fi

# ---- 7. the table --------------------------------------------------------------
step "summary (total $(elapsed)s)"
grep -E "^device copy|^host download|^matmul_many check" "$LOG" | head -3 || true
grep -E "comparisons|^op tests:" "$LOG" | tail -2 || true
python3 "$ROOT/bench/cuda_bench_table.py" --config "$HF/config.json" --lumen-q4 "$OUT/lumen_q4km.json" \
  --lumen-bf16 "$OUT/lumen_bf16.json" --lumen-bf16-last "$OUT/lumen_bf16_last.json" \
  --lumen-q4-greedy "$OUT/lumen_greedy_q4km.json" --lumen-bf16-greedy "$OUT/lumen_greedy_bf16.json" --hf "$OUT/hf_peer.json" \
  --copy-gbs "$COPY_GBS" --prompt "$PROMPT" --gen "$GEN" --pp "$PP" --batches "$PAR" 2>&1 | tee "$OUT/summary.txt" || true
grep -h "lumen bench:" "$LOG" | head -5 || true
echo "done in $(elapsed)s; status $RC; logs and JSON in $OUT"
exit "$RC"
