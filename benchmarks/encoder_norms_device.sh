#!/usr/bin/env bash
# The encoders' kernels against torch's ops, one A/B a STEP: norms (rose.layers.encoder_norms: ROSE_ENCODER_NORMS 0/1 on MiniLM, MPNet and DistilBERT at bs1-128 and docs-100), pooling (rose.layers.pooling: ROSE_FUSED_POOLING 0/1 on MiniLM and Qwen3-0.6B at bs1-128 and docs-100), up-gelu (rose.layers.up_gelu: ROSE_UP_GELU off/on on MiniLM, MPNet and DistilBERT at docs-100); each benchmarks.rose_gpu's rose-graphs rows alternating ROUNDS (2) times. First (TESTS=1, the default) the kernels' and the families' GPU tests with all three on (the up + GELU kernel from one token).
# Carry .whl; tests ~2-3 min (TESTS_TIMEOUT 240 s), an A/B ~2-3 min. Writes $OUT/encoder_kernels_tests.log and
# $OUT/rose_gpu_<step>.tar (each run's JSON and log); prints each run's rows.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh encoder-norms     # tests, then norms
#   GIT_COMMIT=$(git rev-parse --short HEAD) TESTS=0 bash benchmarks/device.sh encoder-pooling encoder-up-gelu
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  t0=$(date +%s)
  ROSE_ENCODER_NORMS=1 ROSE_FUSED_POOLING=1 ROSE_UP_GELU=on ROSE_UP_GELU_MIN=1 timeout ${TESTS_TIMEOUT:-240} \
    python3 -m pytest -q -m gpu tests/rose/test_rose_fused.py tests/rose/test_rose_up_gelu_gpu.py tests/rose/test_rose_gpu.py \
    tests/rose/test_rose_encoder_gpu.py tests/rose/test_rose_cross_encoders_gpu.py tests/rose/test_rose_retrieval_gpu.py \
    -p no:cacheprovider > $OUT/encoder_kernels_tests.log 2>&1
  rc=$?
  echo "GPU tests rc=$rc in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/encoder_kernels_tests.log
  [ $rc -eq 0 ] || exit $rc
fi
encoders=minilm-l6,mpnet-base,distilbert-base
case ${STEP:-norms} in
  norms) AB_TIMEOUT=${AB_TIMEOUT:-200} AB_MODELS=${AB_MODELS:-$encoders} engine_ab encoder_norms ROSE_ENCODER_NORMS "0 1" bs1-128,docs-100 ;;
  pooling) AB_TIMEOUT=${AB_TIMEOUT:-200} AB_MODELS=${AB_MODELS:-minilm-l6,qwen3-0.6b} engine_ab fused_pooling ROSE_FUSED_POOLING "0 1" bs1-128,docs-100 ;;
  up-gelu) AB_TIMEOUT=${AB_TIMEOUT:-200} AB_MODELS=${AB_MODELS:-$encoders} engine_ab up_gelu ROSE_UP_GELU "off on" docs-100 ;;
  *) echo "STEP is norms, pooling or up-gelu, not ${STEP}" >&2; exit 2 ;;
esac
