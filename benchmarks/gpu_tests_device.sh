#!/usr/bin/env bash
# One device call (carry .whl and .whl_fi): ROSE's GPU tests with FlashInfer present (graph keys changed
# since the last GPU run), then best_device.sh STEP=profile (JIT build, causal A/B, breakdown).
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/session3_device_a.sh
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
[ -d /root/fi/flashinfer ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /root/fi .whl_fi/*.whl
export PYTHONPATH=/root/fi:/tmp/site:$PWD ROSE_KERNEL_CACHE_DIR=/root/rose-kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 200 python3 -m pytest -q -m gpu tests/rose -p no:cacheprovider -rs > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - t0 )) s"; tail -4 $OUT/gpu_tests.log
python3 tests/rose/gpu_report.py --out $OUT/rose_gpu_parity.md --commit "${GIT_COMMIT:-?}" > /dev/null 2>&1
tail -2 $OUT/rose_gpu_parity.md
BUDGET=$(( 570 - ($(date +%s) - t0) )) STEP=profile bash benchmarks/best_device.sh
