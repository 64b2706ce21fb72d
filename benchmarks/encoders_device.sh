#!/usr/bin/env bash
# The encoder families of issue 16: their GPU tests (ModernBERT, MPNet, DistilBERT, GTE v1.5, NomicBERT), then rose_gpu beside HF.
# Carry .whl. The tests (bf16 parity per backend, graph capture/replay, prewarm at base widths) write
# $OUT/encoder_gpu_tests.log; benchmarks.rose_gpu runs ModernBERT-base, all-mpnet-base-v2 and distilbert-base on
# bs1-128 and docs-100 (hf-eager, rose-eager, rose-graphs, rose-graphs-overlap) into $OUT/rose_gpu_encoders.json
# and $OUT/rose_gpu_encoders.log. BENCH_ARGS passes through (e.g. --quick).
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh encoders
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu tests/rose/test_rose_encoder_gpu.py -p no:cacheprovider -rs \
  > $OUT/encoder_gpu_tests.log 2>&1
rc=$?
echo "encoder gpu tests rc=$rc in $(( $(date +%s) - t0 )) s"; tail -4 $OUT/encoder_gpu_tests.log
left=$(( ${BUDGET:-570} - ($(date +%s) - t0) - 20 ))
timeout $(( left > 60 ? left : 60 )) python3 -m benchmarks.rose_gpu --out $OUT --tag _encoders \
  --models modernbert-base,mpnet-base,distilbert-base --variants hf-eager,rose-eager,rose-graphs,rose-graphs-overlap \
  ${BENCH_ARGS:-} 2>&1 | grep -v Writing > $OUT/rose_gpu_encoders.log
tail -30 $OUT/rose_gpu_encoders.log
exit $rc
