#!/usr/bin/env bash
# The host's own latencies: how long a sleeping process, event loop or thread takes to wake after 20 µs - 3 ms (benchmarks.wake_latency, with /dev/cpu_dma_latency held at 0 too), and a replica's start with a fresh and a kept Triton cache (benchmarks.cold_start, Qwen3-0.6B config) (~2 min).
# Carry .whl. From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh host-latency
# Results: $OUT/wake_latency.json, $OUT/cold_start_{fresh,kept}.json; prints the wake table last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
status=0
dir=/tmp/m/qwen3-0.6b
zoo_folder qwen3-0.6b $dir || exit 1
export TRITON_CACHE_DIR=/tmp/cold_start_triton
rm -rf $TRITON_CACHE_DIR
for run in fresh kept; do
  timeout 150 python3 -m benchmarks.cold_start --model-dir $dir --json $OUT/cold_start_$run.json 2>&1 | tail -1 || status=1
done
unset TRITON_CACHE_DIR
timeout 200 python3 -m benchmarks.wake_latency --iters ${ITERS:-200} --dma-latency --json $OUT/wake_latency.json || status=1
exit $status
