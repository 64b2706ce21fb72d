#!/usr/bin/env bash
# Folded norms (ROSE_FOLD_NORMS): the GPU tests they touch (fused kernels, graphs, decoder parity against transformers, the kernel manifest), then folded vs unfolded side by side on Qwen3-0.6B and 4B (benchmarks.folded_norms_ab, ~6 min).
# From the repository root:  GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh folded-norms   (carry .whl)
# Results: $OUT/folded_norms_tests.log, $OUT/folded_norms_ab.json; prints the A/B table last. MODELS picks the models.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/rose/test_rose_fused.py tests/rose/test_rose_gpu.py \
  tests/rose/test_rose_decoders_gpu.py tests/rose/test_rose_capture_gpu.py tests/rose/test_rose_kernel_ahead_gpu.py \
  > $OUT/folded_norms_tests.log 2>&1
rc=$?
echo "gpu tests rc=$rc in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/folded_norms_tests.log
timeout 330 python3 -m benchmarks.folded_norms_ab --models ${MODELS:-qwen3-0.6b,qwen3-4b} --json $OUT/folded_norms_ab.json
ab=$?
exit $(( rc != 0 ? rc : ab ))
