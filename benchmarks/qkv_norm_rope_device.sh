#!/usr/bin/env bash
# The QKV projection with the QK norm and RoPE in its epilogue (rose.layers.qkv_norm_rope, ROSE_QKV_NORM_ROPE): its GPU
# test, the whole-model parity (the Triton attention's) with it routed from one token (ROSE_QKV_NORM_ROPE_MIN=1),
# then the 0.6B's long suites in-process with it off and on, alternating ROUNDS times (2), and the 4096-token
# forward's GPU time per kernel class both ways (one round). Carry .whl; ~4 min. Writes $OUT/qkv_tests.log,
# qkv_parity.log, rose_gpu_qkv.tar (each engine run), breakdown_qkv.tar; the tables last.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh qkv-norm-rope
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/rose/test_rose_qkv_norm_rope_gpu.py \
  > $OUT/qkv_tests.log 2>&1
rc=$?
echo "qkv GPU tests rc=$rc ($(( $(date +%s) - t0 )) s)"; tail -3 $OUT/qkv_tests.log
if [ "${PARITY:-1}" = 1 ]; then  # PARITY=0: not the parity (a rerun whose kernel is unchanged)
  ROSE_QKV_NORM_ROPE=1 ROSE_QKV_NORM_ROPE_MIN=1 timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/rose/test_rose_backend_parity_gpu.py -k triton > $OUT/qkv_parity.log 2>&1
  parity_rc=$?; [ $rc -eq 0 ] && rc=$parity_rc
  echo "parity with the kernel from one token rc=$parity_rc ($(( $(date +%s) - t0 )) s)"; tail -3 $OUT/qkv_parity.log
fi
AB_TIMEOUT=100 engine_ab qkv ROSE_QKV_NORM_ROPE "0 1" bs1-4096,score-50x512,docs-100
echo "engine A/B done ($(( $(date +%s) - t0 )) s)"
VAR=ROSE_QKV_NORM_ROPE VALUES="0 1" ROUNDS=1 DEVICE_ENV_READY=1 bash benchmarks/breakdown_ab_device.sh \
  | grep -E "^round|^model|^qwen3"
mv $OUT/breakdown_ab.tar $OUT/breakdown_qkv.tar 2>/dev/null
echo "breakdown done ($(( $(date +%s) - t0 )) s)"
exit $rc  # the kernel's GPU tests' and the parity's status (the A/B runs either way)
