#!/usr/bin/env bash
# GTE v1.5 and NomicBERT (issue 16) in benchmarks.rose_gpu, ROSE rows only (no HF class offline), bs1-128 and docs-100.
# Carry .whl (~1-2 min). benchmarks/model_zoo_remote.py builds gte-base-en-v1.5 and nomic-embed-text-v1.5 at
# their published widths from the test suite's builders (random bf16); rose-eager and rose-graphs into
# $OUT/rose_gpu_remote.json and $OUT/rose_gpu_remote.log. BENCH_ARGS passes through (e.g. --quick).
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh remote-families
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout $(( ${BUDGET:-570} - 20 )) python3 -m benchmarks.rose_gpu --out $OUT --tag _remote \
  --models gte-base-en-v1.5,nomic-embed-text-v1.5 --variants rose-eager,rose-graphs ${BENCH_ARGS:-} 2>&1 \
  | grep -v Writing > $OUT/rose_gpu_remote.log
rc=${PIPESTATUS[0]}
echo "rose_gpu remote families rc=$rc in $(( $(date +%s) - t0 )) s"
tail -20 $OUT/rose_gpu_remote.log
exit $rc
