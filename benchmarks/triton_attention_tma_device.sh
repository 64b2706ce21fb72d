#!/usr/bin/env bash
# ROSE's Triton attention with K and V through tensor descriptors: the attention GPU tests with them forced on
# (ROSE_TRITON_ATTENTION_TMA=1), the kernel A/B (`triton_attention_sweep --tma --wide`: block_config's blocks in both
# forms beside a few others, thirteen more shapes through descriptors, five of them two query heads a program), the
# encoders' shapes bidirectional (ENCODER_HEADS, "12,12,64 12,12,32"), then the 0.6B's long suites in-process with
# the pointer form's blocks (0) and block_config's measured choice (auto, the default), alternating ROUNDS times
# (2); PACK_AB=1: two query heads a program (ROSE_TRITON_ATTENTION_PACK=1) against one (0) instead; SWEEP=0: no
# sweeps. Carry .whl; ~5-6 min. Writes $OUT/gpu_tests_tma.log, triton_attention_tma{,_d64,_d32}.json and .log,
# rose_gpu_tma.tar (rose_gpu_pack.tar with PACK_AB=1: each round's JSON and log): 8 files; the tables last.
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
if [ "${SWEEP:-1}" = 1 ]; then  # SWEEP=0: the tests and the engine A/B alone
  timeout 260 python3 -m benchmarks.triton_attention_sweep --tma --wide --out $OUT/triton_attention_tma.json \
    > $OUT/triton_attention_tma.log 2>&1
  echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; tail -16 $OUT/triton_attention_tma.log
  for heads in ${ENCODER_HEADS-12,12,64 12,12,32}; do  # the encoders' shapes (BGE/E5-base, MiniLM), bidirectional
    name=triton_attention_tma_d${heads##*,}
    timeout 120 python3 -m benchmarks.triton_attention_sweep --tma --causal no --heads "$heads" --out $OUT/$name.json \
      > $OUT/$name.log 2>&1
    echo "sweep $heads rc=$? ($(( $(date +%s) - t0 )) s)"; tail -8 $OUT/$name.log
  done
fi
if [ "${PACK_AB:-0}" = 1 ]; then  # two query heads a program (1) against one (0, the default), through descriptors
  AB_TIMEOUT=100 engine_ab pack ROSE_TRITON_ATTENTION_PACK "0 1" bs1-512,bs1-4096,score-50x512,docs-100
else
  AB_TIMEOUT=100 engine_ab tma ROSE_TRITON_ATTENTION_TMA "0 auto" bs1-512,bs1-4096,score-50x512,docs-100
fi
