#!/usr/bin/env bash
# One call on the GPU machine: where a kernel's warps stall, line by line (Nsight
# Compute's warp-state sampling), 2-3 minutes. By default the persistent decode kernel:
#
#   run(command="bash bench/cuda_decode_step_ncu.sh", carry=[".deps"])
#
# Builds with -lineinfo (its own build folder), profiles one launch during batch-1
# decode on a Qwen2.5-1.5B-shaped model with the WarpStateStats, SourceCounters and
# SpeedOfLight sections, and prints the stall reasons over the kernel and the source
# lines that hold the most samples. The report and the page dumps go to $OUT.
# Environment (any other kernel of the op-by-op step):
#   LUMEN_NCU_KERNEL  Nsight Compute's kernel filter (default regex:decode_step, run
#                     with LUMEN_CUDA_DECODE_STEP=1); e.g. regex:mv_kernel with the
#                     GGUF: the down projections, the only f32 products left there
#   LUMEN_NCU_MODEL   hf (the bf16 folder, default) or gguf (the Q4_K_M-like file)
#   LUMEN_NCU_SKIP    launches of that kernel skipped first (default 4: past warm-up)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/bench/cuda_env.sh"
LUMEN_CUDA_BUILD="${LUMEN_CUDA_BUILD:-$ROOT/build-cuda-lineinfo}" LUMEN_CUDA_FLAGS=-lineinfo \
  lumen_cuda_setup lumen_cli bench_make_model || exit 2
lumen_bench_models
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)"
[ -n "$NCU" ] || { echo "no ncu"; exit 2; }
KERNEL="${LUMEN_NCU_KERNEL:-regex:decode_step}"
MODEL="$HF"
[ "${LUMEN_NCU_MODEL:-hf}" = gguf ] && MODEL="$GGUF"
STEP=0
[ "$KERNEL" = regex:decode_step ] && STEP=1
LUMEN_CUDA_DECODE_STEP=$STEP timeout 300 "$NCU" --kernel-name "$KERNEL" --launch-skip "${LUMEN_NCU_SKIP:-4}" \
  --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight --import-source yes \
  -f -o "$OUT/ds" "$BUILD/lumen" bench "$MODEL" --backend cuda -p 0 -n 8 -r 1 --parallel 1 --parallel-prompt 128 \
  > "$OUT/ncu.log" 2>&1
echo "ncu status $?"
tail -3 "$OUT/ncu.log"
"$NCU" -i "$OUT/ds.ncu-rep" --page details > "$OUT/details.txt" 2>&1
grep -E "Duration|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|Issued Warp|Stall|stall" "$OUT/details.txt" |
  head -30
"$NCU" -i "$OUT/ds.ncu-rep" --page raw --csv > "$OUT/raw.csv" 2>&1
python3 - "$OUT/raw.csv" << 'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3: sys.exit(0)
head, vals = rows[0], rows[2]
st = [(float(v.replace(',', '')), h) for h, v in zip(head, vals)
      if h.startswith('smsp__pcsamp_warps_issue_stalled_') and not h.endswith('_not_issued')
      and v.replace(',', '').replace('.', '').isdigit()]
tot = sum(v for v, _ in st) or 1
print('stall samples by reason (all warps):')
for v, h in sorted(st, reverse=True)[:14]:
    print('  %-60s %6.1f%%' % (h.replace('smsp__pcsamp_warps_issue_stalled_', ''), 100 * v / tot))
EOF
for src in cuda sass; do
  "$NCU" -i "$OUT/ds.ncu-rep" --page source --csv --print-source "$src" > "$OUT/source-$src.csv" 2>&1 ||
    echo "source page ($src) status $?"
done
python3 - "$OUT/source-cuda.csv" << 'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors='replace')))
hi = next((i for i, r in enumerate(rows) if any('Warp Stall Sampling' in c for c in r)), None)
if hi is None:
    print('no sampling columns in', sys.argv[1]); print(''.join(open(sys.argv[1]).readlines()[:5])); sys.exit(0)
head = rows[hi]
cs = next(i for i, c in enumerate(head) if c.startswith('Warp Stall Sampling (All'))
src = next((i for i, c in enumerate(head) if c in ('Source', '# Source')), 1)
ln = next((i for i, c in enumerate(head) if c in ('#', 'Line', '# Line')), 0)
data = []
for r in rows[hi + 1:]:
    try: data.append((float(r[cs].replace(',', '') or 0), r[ln], r[src].strip()[:100]))
    except (ValueError, IndexError): pass
tot = sum(d[0] for d in data) or 1
print("columns:", head[:8]); print("source lines by stall samples (%d samples):" % tot)
for v, l, s in sorted(data, reverse=True)[:45]:
    print('%5.1f%% %5s  %s' % (100 * v / tot, l, s))
EOF
