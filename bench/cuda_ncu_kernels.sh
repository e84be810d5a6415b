#!/usr/bin/env bash
# One call on the GPU machine: Nsight Compute's view of chosen kernels of a batch-1
# decode step (throughput, occupancy, where the warps stall), to say what bounds them.
#
#   run(command="NCU_KERNELS='mv_kernel|mvq_kernel' bash bench/cuda_ncu_kernels.sh", carry=[".deps"])
#
# Environment: NCU_KERNELS (a regex over kernel names, default mv_kernel|mvq_kernel),
# NCU_MODELS ("gguf" default, or "hf" / "hf gguf"), NCU_COUNT (launches profiled, default
# 12: a layer's), NCU_SKIP (matching launches skipped first, default 56: the first two
# layers'). ncu replays each kernel alone at its base clock, so its durations leave out the overlap of
# programmatic dependent launch; the stall reasons are what it is for. Writes
# $OUT/ncu-<model>.txt and prints each kernel's key lines.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/bench/cuda_env.sh"
lumen_cuda_setup lumen_cli bench_make_model || exit 2
lumen_bench_models
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)"
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 2; }
for m in ${NCU_MODELS:-gguf}; do
  model="$GGUF"
  [ "$m" = hf ] && model="$HF"
  LUMEN_CUDA_PROFILE_N=1 timeout 400 "$NCU" --profile-from-start off \
    --kernel-name "regex:${NCU_KERNELS:-mv_kernel|mvq_kernel}" \
    --launch-skip "${NCU_SKIP:-56}" --launch-count "${NCU_COUNT:-12}" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis \
    "$BUILD/lumen" bench "$model" --backend cuda -p 0 -n 2 -r 1 --parallel 1 > "$OUT/ncu-$m.txt" 2>&1 ||
    echo "ncu status $?"
  keys="^  [a-z_]+.*\\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued"
  keys="$keys|Issue Slots Busy|L1/TEX Hit|L2 Hit|Waves Per SM|cycles being stalled"
  grep -E "$keys" "$OUT/ncu-$m.txt" | cut -c1-240
done
