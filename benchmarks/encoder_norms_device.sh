#!/usr/bin/env bash
# The encoders' norms in one kernel each (rose.layers.encoder_norms: the residual add + LayerNorm, the embeddings' sums + LayerNorm) against torch's ops (ROSE_ENCODER_NORMS 1 and 0): the kernels' and the BERT-family GPU tests first (TESTS=0: none), then benchmarks.rose_gpu's rose-graphs rows of AB_MODELS (minilm-l6,mpnet-base,distilbert-base) at bs1-128 and docs-100, 0 and 1 alternating ROUNDS (2) times.
# Carry .whl; ~4 min (TESTS_TIMEOUT 240 s for the tests). Writes $OUT/encoder_kernels_tests.log and
# $OUT/rose_gpu_encoder_norms.tar (each run's JSON and log); prints each run's rows.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh encoder-norms
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  t0=$(date +%s)
  ROSE_ENCODER_NORMS=1 timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -m gpu tests/rose/test_rose_fused.py \
    tests/rose/test_rose_gpu.py tests/rose/test_rose_encoder_gpu.py tests/rose/test_rose_cross_encoders_gpu.py \
    tests/rose/test_rose_retrieval_gpu.py -p no:cacheprovider > $OUT/encoder_kernels_tests.log 2>&1
  rc=$?
  echo "GPU tests rc=$rc in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/encoder_kernels_tests.log
  [ $rc -eq 0 ] || exit $rc
fi
AB_TIMEOUT=${AB_TIMEOUT:-200} AB_MODELS=${AB_MODELS:-minilm-l6,mpnet-base,distilbert-base} \
  engine_ab encoder_norms ROSE_ENCODER_NORMS "0 1" bs1-128,docs-100
