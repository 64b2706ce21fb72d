#!/usr/bin/env bash
# What a small batch's graph nodes cost in series: Qwen3-0.6B's layer kernels at 128 tokens, the 112 GEMMs with cold and L2-resident weights, and with the next weight prefetched into L2 (benchmarks.kernel_edges, ~1 min).
# From the repository root:  GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh kernel-edges
# Results: $OUT/kernel_edges.json; prints its table last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
timeout 200 python3 -m benchmarks.kernel_edges --tokens ${TOKENS:-128} --json $OUT/kernel_edges.json
