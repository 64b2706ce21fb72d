#!/usr/bin/env bash
# The host's own latencies: how long a sleeping process, event loop or thread takes to wake after 20 µs - 3 ms (benchmarks.wake_latency, with /dev/cpu_dma_latency held at 0 too) (~1 min).
# From the repository root:  GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh host-latency
# Results: $OUT/wake_latency.json; prints the table last. (At b70f17d this script also ran benchmarks.cold_start,
# now in cold_start_device.sh.)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
timeout 200 python3 -m benchmarks.wake_latency --iters ${ITERS:-200} --dma-latency --json $OUT/wake_latency.json
