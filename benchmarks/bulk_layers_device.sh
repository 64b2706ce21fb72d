#!/usr/bin/env bash
# A 32-token query beside 8192-token bulk batches, in-process (benchmarks/express_inprocess.py --layers): alone, behind bulk on the main lane, beside it on the express lane, and between bulk's decoder layers (rose.layer_steps: chains of per-layer CUDA graphs, rose.layer_graphs; and the same stepping eager), for each AHEAD:LAYERS_PER_GRAPH in CONFIGS (default "2:1 1:1 2:2"); the layer stepping's GPU tests (ROSE's and Tulip's) first (~5 min; CONFIGS=" " runs the tests alone).
# Carry .whl (Tulip's test). From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh bulk-layers
# Results: $OUT/bulk_layers_ahead<A>_per<G>/express_inprocess.json, $OUT/bulk_layers_gpu_test.log; prints the tables last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
timeout 240 python3 -m pytest -q -m gpu tests/rose/test_rose_layer_steps.py tests/tulip/test_tulip_bulk_layers.py -p no:cacheprovider > $OUT/bulk_layers_gpu_test.log 2>&1
echo "gpu test rc=$?"; tail -1 $OUT/bulk_layers_gpu_test.log
dir=/tmp/m/qwen3-0.6b
zoo_folder qwen3-0.6b $dir || exit 1
for config in ${CONFIGS:-2:1 1:1 2:2}; do
  ahead=${config%%:*} per=${config##*:}
  echo "== bulk 16 x 512 tokens, query 32 tokens; bulk stepped by layers, $ahead steps ahead, $per layers a graph"
  python3 -m benchmarks.express_inprocess --model-dir $dir --out $OUT/bulk_layers_ahead${ahead}_per$per \
    --seconds ${SECONDS_EACH:-4} --layers --layers-ahead $ahead --layers-per-graph $per 2>&1 | tail -8
done
