#!/usr/bin/env bash
# Side by side on the GPU machine: the working tree and other commits, built in
# parallel and benchmarked alternately in one call, so a comparison shares one
# machine, one clock and one set of models.
#
#   bash bench/cuda_side_by_side.sh --prepare main mvq-mixed   (here: each commit's
#        tree into .alt/<name>, ignored by git, carried to the GPU machine)
#   run(command="OPS=1 RUNS='main GGUF 1;work GGUF 1;mvq-mixed GGUF 1' bash bench/cuda_side_by_side.sh",
#       carry=[".deps", ".alt"])
#
# On the GPU machine it builds "work" (the working tree) and every .alt/<name>, runs
# test_backend_ops on the working tree when OPS=1, on every tree (side by side) when
# OPS=all (OPS_T seconds at most, default 150),
# then each line of RUNS ("tree model sequences [VAR=value ...] [--option=value ...]",
# ';'-separated, options going to lumen bench; model
# GGUF or HF, the Qwen2.5-1.5B-shaped files of cuda_env.sh) REPS times (default 2),
# alternating, printing the decode tokens/s of `lumen bench MODEL --backend cuda -p 64
# --parallel N --parallel-prompt 128 -n 128 -r 3` (median of 3). Logs go to $OUT.
set -uo pipefail
ROOT0="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ "${1:-}" = "--prepare" ]; then
  shift
  rm -rf "$ROOT0/.alt"
  for rev in "$@"; do
    name="$(echo "$rev" | tr '/' '_')"
    mkdir -p "$ROOT0/.alt/$name"
    # without the golden files (~5 MB a tree, read only by tests this script does not
    # run), so five trees and .deps fit a device call's 64 MiB of carry with room
    git -C "$ROOT0" archive "$rev" | tar -x -C "$ROOT0/.alt/$name" --exclude='tests/golden' || exit 2
  done
  du -sh "$ROOT0/.alt"
  exit 0
fi

OUT="${OUT:-$ROOT0/cuda-run-out}"
mkdir -p "$OUT"
. "$ROOT0/bench/cuda_env.sh"
NAMES="work"
[ -d "$ROOT0/.alt" ] && NAMES="work $(ls "$ROOT0/.alt")"
tree_of() { if [ "$1" = work ]; then echo "$ROOT0"; else echo "$ROOT0/.alt/$1"; fi; }
# one tree's build (cuda_env.sh's functions read ROOT, BUILD and OUT: bash's locals
# reach the functions called)
build_tree() {
  local ROOT="$1" BUILD="$2" OUT="$3"
  mkdir -p "$BUILD" && lumen_cuda_env && lumen_cuda_build lumen_cli bench_make_model test_backend_ops
}
t0=$(date +%s)
for n in $NAMES; do
  R="$(tree_of "$n")"
  [ -e "$R/.deps" ] || ln -s "$ROOT0/.deps" "$R/.deps"
  mkdir -p "$OUT/$n"
  build_tree "$R" "$ROOT0/build-cuda-$n" "$OUT/$n" > "$OUT/$n/build.txt" 2>&1 &
done
wait
echo "builds done in $(($(date +%s) - t0))s"
for n in $NAMES; do echo "$n: $(tail -1 "$OUT/$n/build.txt")"; done
if [ "${OPS:-0}" != 0 ]; then
  trees=work
  [ "$OPS" = all ] && trees="$NAMES"
  for n in $trees; do
    (timeout "${OPS_T:-150}" "$ROOT0/build-cuda-$n/tests/test_backend_ops" > "$OUT/$n/ops.log" 2>&1
      echo "op tests ($n): status $?") &
  done
  wait
  for n in $trees; do grep -E 'FAIL|differs|DIFFER|comparisons' "$OUT/$n/ops.log" | sed "s/^/$n: /" | head -5; done
fi
ROOT="$ROOT0" BUILD="$ROOT0/build-cuda-work"
lumen_cuda_env > /dev/null || exit 2
lumen_bench_models
IFS=";" read -r -a LINES <<< "${RUNS:-work GGUF 1;work HF 1}"
for _ in $(seq "${REPS:-2}"); do
  for line in "${LINES[@]}"; do
    read -r tree model par envs <<< "$line"
    file="$GGUF"
    [ "$model" = HF ] && file="$HF"
    # words of envs starting with -- go to lumen bench (--logits=greedy: --logits greedy)
    vars="" args=""
    for w in ${envs:-}; do
      case "$w" in --*) args="$args ${w%%=*} ${w#*=}" ;; *) vars="$vars $w" ;; esac
    done
    # shellcheck disable=SC2086 # VAR=value and option words
    r=$(env $vars timeout 100 "$ROOT0/build-cuda-$tree/lumen" bench "$file" --backend cuda \
      -p 64 --parallel "$par" --parallel-prompt 128 -n 128 -r 3 $args 2>&1 | grep -E "^ +$par " | awk '{print $3}')
    printf '%-16s %-4s x%-4s %-40s %s\n' "$tree" "$model" "$par" "${envs:-}" "${r:-failed}"
  done
done
