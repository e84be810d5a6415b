#!/usr/bin/env bash
# The thirty-ninth session's two kept changes together (mv_vparts: one token's bf16
# Q/K/V and O products with a row's two parts on one warp; mv_wide_blocks: those
# products in blocks of 16 warps), against the tree before them (c650421), side by
# side on one machine: bf16 at 1, 2 and 4 sequences, Q4_K_M at 1 (unchanged: no 16-bit
# products); the full op tests on the working tree. On an H200 this is also the
# record's rerun (the last H200 figures are the twenty-seventh session's).
#   bash bench/cuda_device_run.sh --prepare-deps && bash bench/cuda_side_by_side.sh --prepare c650421
#   run(command="bash bench/next_call.sh", carry=[".deps", ".alt"])
set -uo pipefail
b=c650421
OPS=1 OPS_T=200 REPS=${REPS:-3} RUNS="$b HF 1;work HF 1;$b HF 2;work HF 2;$b HF 4;work HF 4;$b GGUF 1;work GGUF 1" \
  bash bench/cuda_side_by_side.sh
