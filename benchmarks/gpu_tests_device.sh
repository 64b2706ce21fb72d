#!/usr/bin/env bash
# ROSE's GPU tests (FlashInfer's backends too when .whl_fi is carried) and the parity report against transformers.
# Carry .whl (and .whl_fi); ~4-5 min (TESTS_TIMEOUT, default 420 s). Writes $OUT/gpu_tests.log and $OUT/rose_gpu_parity.md (as in
# benchmarks/results/rose_gpu_tests.log and rose_gpu_parity.md). `device.sh gpu-tests profile` adds the
# causal attention A/B and the GPU-time breakdown in the same call. TESTS: which tests (default tests/rose, e.g.
# TESTS=tests/rose/test_rose_express_gpu.py for one file; the parity report then covers what ran).
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh gpu-tests
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
use_flashinfer
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout ${TESTS_TIMEOUT:-420} python3 -m pytest -q -m gpu ${TESTS:-tests/rose} -p no:cacheprovider -rs > $OUT/gpu_tests.log 2>&1
rc=$?
echo "gpu tests rc=$rc in $(( $(date +%s) - t0 )) s"; tail -4 $OUT/gpu_tests.log
python3 tests/rose/gpu_report.py --out $OUT/rose_gpu_parity.md --commit "${GIT_COMMIT:-?}" > /dev/null 2>&1
tail -2 $OUT/rose_gpu_parity.md
exit $rc
