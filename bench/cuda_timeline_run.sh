#!/usr/bin/env bash
# One call on the GPU machine: a decode step's kernels as they run inside the replayed
# graph (Nsight Systems, graph nodes traced), not in isolation as Nsight Compute
# measures them. Says, for one step, each kernel's time and the gap before it.
#
#   run(command="bash bench/cuda_timeline_run.sh", carry=[".deps"])
#
# Environment: LUMEN_TIMELINE_MODELS ("hf gguf" default), LUMEN_TIMELINE_PAR (sequences,
# default 1), LUMEN_CUDA_BUILD. Writes $OUT/timeline-<model>-x<N>.csv (the trace) and
# prints bench/cuda_timeline_table.py's summary.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/cuda-run-out}"
BUILD="${LUMEN_CUDA_BUILD:-$ROOT/build-cuda-device}"
mkdir -p "$OUT" "$BUILD"
. "$ROOT/bench/cuda_env.sh"
lumen_cuda_env || exit 2
lumen_cuda_build lumen_cli bench_make_model || exit 2
lumen_bench_models
NSYS="$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda*/bin/nsys 2> /dev/null | head -1)"
[ -n "$NSYS" ] || { echo "no nsys on this machine"; exit 2; }
echo "nsys: $NSYS"
for m in ${LUMEN_TIMELINE_MODELS:-hf gguf}; do
  model="$HF"
  [ "$m" = gguf ] && model="$GGUF"
  for n in ${LUMEN_TIMELINE_PAR:-1}; do
    name="timeline-$m-x$n"
    rm -f "$OUT/$name.nsys-rep" "$OUT/$name.sqlite"
    timeout 240 "$NSYS" profile --cuda-graph-trace=node --trace=cuda -o "$OUT/$name" -f true \
      "$BUILD/lumen" bench "$model" --backend cuda -p 0 -n 48 -r 1 --parallel "$n" --parallel-prompt 128 \
      > "$OUT/$name.log" 2>&1 || echo "nsys status $?"
    "$NSYS" stats --report cuda_gpu_trace --format csv --output "$OUT/$name" "$OUT/$name.nsys-rep" \
      >> "$OUT/$name.log" 2>&1 || echo "nsys stats status $?"
    rm -f "$OUT/$name.nsys-rep" "$OUT/$name.sqlite"
    python3 "$ROOT/bench/cuda_timeline_table.py" "$OUT/${name}_cuda_gpu_trace.csv"
  done
done
