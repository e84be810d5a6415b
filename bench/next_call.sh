#!/usr/bin/env bash
# A row's two parts on one warp in one token's CPL products (mv_vparts: the bf16 Q/K/V
# and O products at half the warps, with the two warps' sums, so a token's bits stay
# those of 2-8 tokens' products), against the two warps (LUMEN_X_MV_VP=0), bf16 at 1
# and 2 sequences, one tree, side by side; op tests (batch invariance) on the default.
#   run(command="bash bench/next_call.sh", carry=[".deps"])
set -uo pipefail
v='LUMEN_X_MV_VP=0'
OPS=1 REPS=${REPS:-3} RUNS="work HF 1;work HF 1 $v;work HF 2;work HF 2 $v" bash bench/cuda_side_by_side.sh
