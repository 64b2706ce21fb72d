#!/usr/bin/env bash
# A fresh replica's prewarm cost per graph layout on the Qwen3-0.6B config: torch.cuda.graph's context vs rose.graphs' raw capture, with and without the eager warm-up step (benchmarks.capture_cost), plus the capture GPU test.
# Needs no carried wheels. ~1 min.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh capture-cost
# Writes $OUT/capture_cost.json; prints a table last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
timeout 60 python3 -m pytest -q -m gpu tests/rose/test_rose_capture_gpu.py -p no:cacheprovider 2>&1 | tail -2
timeout 240 python3 -m benchmarks.capture_cost --out $OUT --models-dir /tmp/m 2>> $OUT/capture_cost.log
