#!/usr/bin/env bash
# The encoders' norms in one kernel each (rose.layers.encoder_norms) and pooling in one kernel (rose.layers.pooling), each against torch's ops: STEP=norms (default) runs the kernels' and the BERT-family GPU tests with both on, then benchmarks.rose_gpu's rose-graphs rows of AB_MODELS (minilm-l6,mpnet-base,distilbert-base) at bs1-128 and docs-100 with ROSE_ENCODER_NORMS 0 and 1 alternating ROUNDS (2) times; STEP=pooling the same with ROSE_FUSED_POOLING (minilm-l6,qwen3-0.6b; the Qwen3 GPU tests).
# Carry .whl; ~5-6 min a step (TESTS_TIMEOUT 220 s for the tests). Writes $OUT/<step>_tests.log and
# $OUT/rose_gpu_<step>.tar (each run's JSON and log); prints each run's rows.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh encoder-norms [fused-pooling]
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step=${STEP:-norms}
case $step in
  norms) tests="tests/rose/test_rose_fused.py tests/rose/test_rose_gpu.py tests/rose/test_rose_encoder_gpu.py
           tests/rose/test_rose_cross_encoders_gpu.py tests/rose/test_rose_retrieval_gpu.py"
         var=ROSE_ENCODER_NORMS tag=encoder_norms models=minilm-l6,mpnet-base,distilbert-base ;;
  pooling) tests="tests/rose/test_rose_fused.py tests/rose/test_rose_gpu.py tests/rose/test_rose_decoders_gpu.py"
           var=ROSE_FUSED_POOLING tag=fused_pooling models=minilm-l6,qwen3-0.6b ;;
  *) echo "STEP is norms or pooling, not $step" >&2; exit 2 ;;
esac
t0=$(date +%s)
ROSE_ENCODER_NORMS=1 ROSE_FUSED_POOLING=1 timeout ${TESTS_TIMEOUT:-220} python3 -m pytest -q -m gpu $tests \
  -p no:cacheprovider > $OUT/${tag}_tests.log 2>&1
rc=$?
echo "GPU tests rc=$rc in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/${tag}_tests.log
[ $rc -eq 0 ] || exit $rc
AB_TIMEOUT=${AB_TIMEOUT:-200} AB_MODELS=${AB_MODELS:-$models} engine_ab $tag $var "0 1" bs1-128,docs-100
