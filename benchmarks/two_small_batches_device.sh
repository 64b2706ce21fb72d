#!/usr/bin/env bash
# Two small batches at once on the GPU, in-process: a lone batch of N tokens kept in flight on ROSE's main lane, another stepped beside it on the express lane, against each alone (benchmarks/express_inprocess.py with one-sequence "bulk"), N = 128 and 256 (~1 min).
# No carry needed. From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh two-small-batches
# Results: $OUT/two_small_batches_<N>/express_inprocess.json; prints one table per N.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
dir=/tmp/m/qwen3-0.6b
zoo_folder qwen3-0.6b $dir || exit 1
for n in 128 256; do
  echo "== a lone $n-token batch on the main lane (two in flight) and a lone $n-token query, alone / behind / beside"
  python3 -m benchmarks.express_inprocess --model-dir $dir --out $OUT/two_small_batches_$n --seconds ${SECONDS_EACH:-4} \
    --bulk-docs 1 --doc-tokens $n --query-tokens $n 2>&1 | tail -5
done
