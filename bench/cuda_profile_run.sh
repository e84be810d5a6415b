#!/usr/bin/env bash
# One call on the GPU machine: where the time of a decode step goes.
#
#   run(command="bash bench/cuda_profile_run.sh", carry=[".deps"])
#
# Builds with -DLUMEN_CUDA=ON, writes the Qwen2.5-1.5B-shaped models (as
# bench/cuda_bench_run.sh does), times `lumen bench --parallel N` decode, then runs the
# same under Nsight Compute (ncu, one metric: each kernel's duration, caches and clocks
# left alone; only the passes of the measured size, LUMEN_CUDA_PROFILE_N) and prints,
# for the last forward pass of the run, the kernels grouped by name: launches, total
# and mean microseconds. The sum of kernel time against the
# step's wall time says how much of a step is GPU work and how much is launch and
# synchronization overhead.
# Environment: LUMEN_PROFILE_PAR (sequences, default "1 64"; "pp" profiles the prefill of
# one 512-token prompt instead), LUMEN_PROFILE_PROMPT
# (prompt tokens of each sequence, default 128), LUMEN_PROFILE_MODELS=hf (the bf16
# folder only), LUMEN_CUDA_BUILD.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PAR="${LUMEN_PROFILE_PAR:-1 64}"
PROMPT="${LUMEN_PROFILE_PROMPT:-128}"
. "$ROOT/bench/cuda_env.sh"
lumen_cuda_setup lumen_cli bench_make_model bench_cuda_matvec || exit 2
lumen_bench_models
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)"
echo "ncu: ${NCU:-none}"
models="$HF"
[ "${LUMEN_PROFILE_MODELS:-all}" = hf ] || models="$HF $GGUF"
for model in $models; do
  for n in $PAR; do
    name="$(basename "$model" | cut -c1-40)-x$n"
    run=(-p 0 -n 2 -r 1 --parallel "$n" --parallel-prompt "$PROMPT") tokens=$n
    [ "$n" = pp ] && run=(-p 512 -n 0 -r 1) tokens=512
    echo "=== $name"
    [ "$n" = pp ] || timeout 120 "$BUILD/lumen" bench "$model" --backend cuda -p 0 -n 32 -r 3 --parallel "$n" \
      --parallel-prompt "$PROMPT" 2>&1 | grep -E "^ +[0-9]" | head -5
    [ -n "$NCU" ] || continue
    LUMEN_CUDA_PROFILE_N=$tokens timeout 240 "$NCU" --profile-from-start off --clock-control none \
      --cache-control none --metrics gpu__time_duration.sum --csv "$BUILD/lumen" bench "$model" --backend cuda "${run[@]}" > "$OUT/ncu-$name.csv" 2> "$OUT/ncu-$name.err" ||
      echo "ncu status $?"
    python3 "$ROOT/bench/cuda_profile_table.py" "$OUT/ncu-$name.csv"
  done
done
