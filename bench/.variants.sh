export LUMEN_CUDA_BUILD=/tmp/lumen-build-cuda
bash bench/cuda_smollm2_run.sh > $OUT/full.txt 2>&1; grep -E 'status|all:' $OUT/full.txt | head -8
for v in "LUMEN_CUDA_MV_MAX_N=1000000000 LUMEN_CUDA_ATTN_DEC=1" "LUMEN_CUDA_MV_MAX_N=64"; do
  echo "== $v"; env $v LUMEN_TEST_BACKEND=cuda timeout 100 /tmp/lumen-build-cuda/tests/golden_engine smollm2-135m > $OUT/v.log 2>&1; echo "status $?"
  grep -E 'differs from alone|prompts differ' $OUT/v.log | sed 's/ differs from alone//' | tr '\n' '|' | cut -c1-900; echo
done
LUMEN_BENCH_BUDGET=330 bash bench/cuda_bench_run.sh 2>&1 | tail -40
