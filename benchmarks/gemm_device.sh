#!/usr/bin/env bash
# The Qwen3-0.6B projections' GEMMs at 128 and 512 tokens: cuBLAS layouts beside the split-K kernel (its GPU test first).
# Carry .whl (~3-4 min: ~30 cold compiles for the test, then ~100 split-K configurations compiled and timed).
# Runs tests/rose/test_rose_splitk_gemm_gpu.py into $OUT/splitk_gemm_tests.log, then `benchmarks.gemm_small_m
# --splitk` into $OUT/gemm_small_m.json and $OUT/gemm_small_m.log; the table last. TOKENS: the sizes (128,512).
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh gemm
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu tests/rose/test_rose_splitk_gemm_gpu.py -p no:cacheprovider > $OUT/splitk_gemm_tests.log 2>&1
echo "split-K GPU tests rc=$? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/splitk_gemm_tests.log
timeout $(( ${BUDGET:-570} - $(date +%s) + t0 - 20 )) python3 -m benchmarks.gemm_small_m --tokens ${TOKENS:-128,512} --splitk \
  --json $OUT/gemm_small_m.json > $OUT/gemm_small_m.log 2>&1
rc=$?
echo "gemm_small_m rc=$rc in $(( $(date +%s) - t0 )) s"
tail -12 $OUT/gemm_small_m.log
exit $rc
