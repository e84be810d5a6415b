#!/usr/bin/env bash
# One call on the GPU machine: a decode step's kernels as they run inside the replayed
# graph, not in isolation as Nsight Compute measures them. Says, for one step, each
# kernel's time and what it adds to the step.
#
#   run(command="bash bench/cuda_timeline_run.sh", carry=[".deps"])
#
# Nsight Systems where the machine has one, else bench/cupti_trace.c preloaded.
# Environment: LUMEN_TIMELINE_MODELS ("hf gguf" default), LUMEN_TIMELINE_PAR (sequences,
# default 1), LUMEN_CUDA_BUILD. Writes $OUT/timeline-<model>-x<N>.csv (the trace) and
# prints bench/cuda_timeline_table.py's summary.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/bench/cuda_env.sh"
lumen_cuda_setup lumen_cli bench_make_model || exit 2
lumen_bench_models
NSYS="$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys 2> /dev/null | head -1)"
if [ -z "$NSYS" ]; then
  CUDA_DIR="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
  CUPTI_LIB="$(dirname "$(find "$CUDA_DIR" /usr/lib/x86_64-linux-gnu -name 'libcupti.so*' 2> /dev/null | head -1)")"
  gcc -shared -fPIC -O2 -I"$CUDA_DIR/include" -I"$CUDA_DIR/extras/CUPTI/include" "$ROOT/bench/cupti_trace.c" \
    -L"$CUPTI_LIB" -lcupti -Wl,-rpath,"$CUPTI_LIB" -o "$BUILD/libcupti_trace.so" ||
    { echo "no nsys, no CUPTI"; exit 2; }
fi
echo "tracer: ${NSYS:-$BUILD/libcupti_trace.so}"
for m in ${LUMEN_TIMELINE_MODELS:-hf gguf}; do
  model="$HF"
  [ "$m" = gguf ] && model="$GGUF"
  for n in ${LUMEN_TIMELINE_PAR:-1}; do
    name="timeline-$m-x$n" csv="$OUT/timeline-$m-x$n.csv"
    bench=("$BUILD/lumen" bench "$model" --backend cuda -p 0 -n 48 -r 1 --parallel "$n" --parallel-prompt 128)
    if [ -n "$NSYS" ]; then
      timeout 240 "$NSYS" profile --cuda-graph-trace=node --trace=cuda -o "$OUT/$name" -f true "${bench[@]}" \
        > "$OUT/$name.log" 2>&1 || echo "nsys status $?"
      "$NSYS" stats --report cuda_gpu_trace --format csv --output "$OUT/$name" "$OUT/$name.nsys-rep" \
        >> "$OUT/$name.log" 2>&1 || echo "nsys stats status $?"
      mv "$OUT/${name}_cuda_gpu_trace.csv" "$csv"
      rm -f "$OUT/$name.nsys-rep" "$OUT/$name.sqlite"
    else
      LUMEN_TRACE_OUT="$csv" LD_PRELOAD="$BUILD/libcupti_trace.so" timeout 240 "${bench[@]}" > "$OUT/$name.log" 2>&1 ||
        echo "traced run status $?"
      grep "^cupti_trace:" "$OUT/$name.log"
    fi
    python3 "$ROOT/bench/cuda_timeline_table.py" "$csv"
  done
done
