#!/usr/bin/env bash
# The cross-encoders (Qwen3-Reranker among them), SPLADE and BGE-M3 of issue 16 in benchmarks.rose_gpu beside HF (bs1-128, docs-100), one run.
# Carry .whl. Builds ms-marco-MiniLM-L-6-v2, bge-reranker-v2-m3, Qwen3-Reranker-0.6B, splade-cocondenser-ensembledistil and BGE-M3 at
# their published shapes with random bf16 weights (benchmarks.model_zoo_heads; the two XLM-R large folders are
# ~1.1 GB each), then hf-eager (benchmarks.hf_heads), rose-eager, rose-graphs and rose-graphs-overlap into
# $OUT/rose_gpu$TAG.json and $OUT/rose_gpu$TAG.log (TAG _heads). MODELS, VARIANTS and TAG pick other zoo models
# (device.sh remote-families: GTE v1.5 and NomicBERT, ROSE rows only). BENCH_ARGS passes through (e.g. --quick).
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh heads
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tag=${TAG:-_heads}
t0=$(date +%s)
timeout $(( ${BUDGET:-570} - 20 )) python3 -m benchmarks.rose_gpu --out $OUT --tag $tag \
  --models ${MODELS:-ms-marco-minilm-l6,splade-cocondenser,bge-m3,bge-reranker-v2-m3,qwen3-reranker-0.6b} \
  --variants ${VARIANTS:-hf-eager,rose-eager,rose-graphs,rose-graphs-overlap} ${BENCH_ARGS:-} 2>&1 | grep -v Writing \
  > $OUT/rose_gpu$tag.log
rc=${PIPESTATUS[0]}
echo "rose_gpu $tag rc=$rc in $(( $(date +%s) - t0 )) s"
tail -40 $OUT/rose_gpu$tag.log
exit $rc
