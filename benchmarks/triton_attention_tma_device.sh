#!/usr/bin/env bash
# ROSE's Triton attention with K and V through tensor descriptors (ROSE_TRITON_ATTENTION_TMA=1) beside its pointer
# loads: the attention GPU tests with it on, the kernel A/B (`triton_attention_sweep --tma`), then the 0.6B's long
# suites in-process off / on, alternating ROUNDS times (2). Carry .whl; ~5-6 min. Writes $OUT/gpu_tests_tma.log,
# triton_attention_tma.json and .log, rose_gpu_tma_{0,1}_{round}.json and .log; the tables last.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh triton-attention-tma
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
ROSE_TRITON_ATTENTION_TMA=1 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/rose/test_rose_attention_backends.py tests/rose/test_rose_backend_parity_gpu.py \
  -k "triton or auto or cuda_graph_replay" > $OUT/gpu_tests_tma.log 2>&1
echo "GPU tests with TMA rc=$? ($(( $(date +%s) - t0 )) s)"; tail -3 $OUT/gpu_tests_tma.log
timeout 200 python3 -m benchmarks.triton_attention_sweep --tma --out $OUT/triton_attention_tma.json \
  > $OUT/triton_attention_tma.log 2>&1
echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; tail -16 $OUT/triton_attention_tma.log
AB_TIMEOUT=100 engine_ab tma ROSE_TRITON_ATTENTION_TMA "0 1" bs1-512,bs1-4096,score-50x512,docs-100
