#!/usr/bin/env bash
# The decoder's QK step inside the Triton attention kernel against its own kernel before it (benchmarks.fused_rope_ab, Qwen3-0.6B), after the GPU tests that run it (parity with transformers, fused vs apart, graphs, layer chains); ~4 min.
# From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh fused-rope
# Results: $OUT/fused_rope_gpu_tests.log, $OUT/fused_rope_ab.json and .log; the table last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/rose/test_rose_gpu.py tests/rose/test_rose_decoders_gpu.py \
  tests/rose/test_rose_layer_steps.py "tests/rose/test_rose_backend_parity_gpu.py" -k "not flashinfer and not fa4" \
  > $OUT/fused_rope_gpu_tests.log 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - t0 )) s"; tail -2 $OUT/fused_rope_gpu_tests.log
timeout $(( ${BUDGET:-570} - $(date +%s) + t0 - 15 )) python3 -m benchmarks.fused_rope_ab --json $OUT/fused_rope_ab.json \
  > $OUT/fused_rope_ab.log 2>&1
rc=$?
echo "fused_rope_ab rc=$rc in $(( $(date +%s) - t0 )) s"
tail -9 $OUT/fused_rope_ab.log
exit $rc
