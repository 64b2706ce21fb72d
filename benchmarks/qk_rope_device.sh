#!/usr/bin/env bash
# The QK-norm+RoPE kernel measured three ways: alone per block size, through the GPU tests, end to end.
#   1. benchmarks.qk_rope_ab: the kernel alone, the one-program-per-(token, head) kernel vs the token-block
#      one at each block size -> $OUT/qk_rope_ab.json;
#   2. ROSE's GPU tests (the fused kernels' parity, the models' parity with transformers);
#   3. benchmarks.rose_breakdown for Qwen3-0.6B (the 'norm' class at 128/512/4096 tokens), and
#      benchmarks.rose_gpu rose-graphs / rose-best (causal FlashInfer profiles) for Qwen3-0.6B and 4B.
# Carry .whl and .whl_fi; one call (~9 min).
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh qk-rope
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
use_flashinfer
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
timeout 120 python3 -m benchmarks.qk_rope_ab --json $OUT/qk_rope_ab.json 2>&1 | tail -10
echo "== tests ($(el) s)"
timeout 150 python3 -m pytest -q -m gpu tests/rose -p no:cacheprovider -rs > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/gpu_tests.log
python3 tests/rose/gpu_report.py --out $OUT/rose_gpu_parity.md --commit "${GIT_COMMIT:-?}" > /dev/null 2>&1
tail -1 $OUT/rose_gpu_parity.md
echo "== breakdown ($(el) s)"
timeout 100 python3 -m benchmarks.rose_breakdown --models qwen3-0.6b --out $OUT > $OUT/breakdown.log 2>&1
tail -4 $OUT/breakdown.log
echo "== rose_gpu ($(el) s)"
timeout $(( 560 - $(el) )) python3 -m benchmarks.rose_gpu --models qwen3-0.6b,qwen3-4b \
  --variants rose-graphs,rose-best --profiles benchmarks/results/profiles --out $OUT --tag _best 2>&1 \
  | grep -v Writing > $OUT/rose_gpu_best.log
tail -22 $OUT/rose_gpu_best.log
echo "== done in $(el) s"
