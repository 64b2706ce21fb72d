#!/usr/bin/env bash
# ROSE's Triton attention through tensor descriptors and its variants: the attention GPU tests with descriptors forced
# on (ROSE_TRITON_ATTENTION_TMA=1; AB's variant on too), the kernel sweep (`triton_attention_sweep --tma --wide
# --order`: block_config's blocks in both forms beside others, query heads packed a program, longest blocks first) for
# the 0.6B's shape and the 4B's (causal), the encoders' shapes if ENCODER_HEADS names them, then the 0.6B's long suites
# in-process with AB's variable at its default against the change, alternating ROUNDS times (2): AB=tma (pointers
# against block_config's choice), pack (ROSE_TRITON_ATTENTION_PACK 0 / 1), order (ROSE_TRITON_ATTENTION_LONGEST_FIRST
# 0 / auto) or none. SWEEP=0: no sweeps; WIDE=0: the sweeps without --wide (half the time). Carry .whl; ~5-6 min.
# Writes $OUT/gpu_tests_tma.log, triton_attention_tma{,_4b}.json and .log, rose_gpu_<AB>.tar (each round's JSON
# and log); the tables last.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh triton-attention-tma
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
case "${AB:-tma}" in tma|pack|order|none) ;; *) echo "AB must be tma, pack, order or none, not ${AB}" >&2; exit 2 ;; esac
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
on=(); [ "${AB:-tma}" = pack ] && on=(ROSE_TRITON_ATTENTION_PACK=1)
[ "${AB:-tma}" = order ] && on=(ROSE_TRITON_ATTENTION_LONGEST_FIRST=1)
env ROSE_TRITON_ATTENTION_TMA=1 ${on[@]+"${on[@]}"} timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/rose/test_rose_attention_backends.py tests/rose/test_rose_backend_parity_gpu.py \
  -k "triton or auto or cuda_graph_replay" > $OUT/gpu_tests_tma.log 2>&1
echo "GPU tests with TMA ${on[*]+${on[*]}} rc=$? ($(( $(date +%s) - t0 )) s)"; tail -3 $OUT/gpu_tests_tma.log
wide=--wide; [ "${WIDE:-1}" = 0 ] && wide=
if [ "${SWEEP:-1}" = 1 ]; then  # SWEEP=0: the tests and the engine A/B alone
  timeout 260 python3 -m benchmarks.triton_attention_sweep --tma $wide --order --out $OUT/triton_attention_tma.json \
    > $OUT/triton_attention_tma.log 2>&1
  echo "sweep rc=$? ($(( $(date +%s) - t0 )) s)"; tail -16 $OUT/triton_attention_tma.log
  timeout 150 python3 -m benchmarks.triton_attention_sweep --tma $wide --order --causal yes --heads 32,8,128 \
    --out $OUT/triton_attention_tma_4b.json > $OUT/triton_attention_tma_4b.log 2>&1  # the 4B's shape
  echo "sweep 32,8,128 rc=$? ($(( $(date +%s) - t0 )) s)"; tail -8 $OUT/triton_attention_tma_4b.log
  for heads in ${ENCODER_HEADS:-}; do  # the encoders' shapes bidirectional (f05a4ea: "12,12,64 12,12,32")
    name=triton_attention_tma_d${heads##*,}
    timeout 120 python3 -m benchmarks.triton_attention_sweep --tma --causal no --heads "$heads" --out $OUT/$name.json \
      > $OUT/$name.log 2>&1
    echo "sweep $heads rc=$? ($(( $(date +%s) - t0 )) s)"; tail -8 $OUT/$name.log
  done
fi
case "${AB:-tma}" in  # the 0.6B's long suites: the older form (0) against the change
  tma) AB_TIMEOUT=100 engine_ab tma ROSE_TRITON_ATTENTION_TMA "0 auto" bs1-512,bs1-4096,score-50x512,docs-100 ;;
  pack) AB_TIMEOUT=100 engine_ab pack ROSE_TRITON_ATTENTION_PACK "0 1" bs1-512,bs1-4096,score-50x512,docs-100 ;;
  order) AB_TIMEOUT=100 engine_ab order ROSE_TRITON_ATTENTION_LONGEST_FIRST "0 auto" \
    bs1-512,bs1-4096,score-50x512,docs-100 ;;
  none) ;;
esac
