#!/usr/bin/env bash
# ROSE with its best attention per bucket: the causal profiles (STEP=profile), then rose-graphs vs rose-best.
# Issues 4 and 7, with .whl_fi (FlashInfer wheels) carried:
#     bash benchmarks/device.sh profile   # STEP=profile, ~4 min: JIT build, causal A/B, GPU breakdown
#     bash benchmarks/device.sh best      # STEP=best, ~4 min: rose-graphs vs rose-best, same run
# Two calls because one may last 10 minutes; FlashInfer and its kernel cache live under /root, which
# survives between calls while the machine stays warm (the carried tree does not).
# STEP=profile: installs FlashInfer, builds its kernels (first-use seconds reported), A/B of the Qwen3
#   shapes causal (Qwen3-Embedding, as rose_gpu's folders are) -> profiles/<model>-causal/, and
#   benchmarks.rose_breakdown (GPU time per kernel class vs host->host at 128/512/4096 tokens) in what is
#   left of BUDGET seconds (device.sh sets it from the call's elapsed time; 560 alone).
# STEP=best: benchmarks.rose_gpu with --variants rose-graphs,rose-best --profiles <the A/B's profiles>
#   -> rose_gpu_best.json (merge its rose-best records into rose_gpu.json on the laptop).
set -uo pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
mkdir -p benchmarks/results
export ROSE_KERNEL_CACHE_DIR=/root/rose-kernels
PROFILES=/root/profiles
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
use_flashinfer
python3 -c "import torch, flashinfer; print('flashinfer', flashinfer.__version__, '| torch', torch.__version__, \
'|', torch.cuda.get_device_name())" 2>&1 | tail -1

case "${STEP:-profile}" in
profile)
  mkdir -p "$PROFILES"
  cp -r benchmarks/results/profiles/. "$PROFILES/"  # the bidirectional ones measured before
  echo "== causal A/B with the JIT build ($(elapsed) s)"
  timeout 330 python3 -m benchmarks.attention_ab --build-kernels --causal --models qwen3-0.6b,qwen3-4b \
    --out "$OUT" --tag _causal --profile-dir "$PROFILES" > "$OUT/attention_causal.log" 2>&1
  grep "^==\|^  build\|profile ->\|rror" "$OUT/attention_causal.log" | cut -c1-160
  cp -r "$PROFILES"/*-causal "$OUT/" 2>/dev/null
  echo "== breakdown ($(elapsed) s)"
  timeout $(( ${BUDGET:-560} - $(elapsed) )) python3 -m benchmarks.rose_breakdown --out "$OUT" \
    > "$OUT/breakdown.log" 2>&1
  tail -8 "$OUT/breakdown.log"
  [ -f "$OUT/attention_backends_causal.json" ] \
    && python3 -m benchmarks.attention_ab --print-table "$OUT/attention_backends_causal.json" | tail -16
  ;;
best)
  [ -d "$PROFILES/qwen3-0.6b-causal" ] || echo "warning: no causal profiles (STEP=profile first): bidirectional ones"
  [ -d "$PROFILES/qwen3-0.6b" ] || cp -r benchmarks/results/profiles/. "$PROFILES/"
  timeout 560 python3 -m benchmarks.rose_gpu --models qwen3-0.6b,qwen3-4b,minilm-l6 \
    --variants rose-graphs,rose-best --profiles "$PROFILES" --out "$OUT" --tag _best 2>&1 \
    | grep -v Writing > "$OUT/rose_gpu_best.log"
  tail -30 "$OUT/rose_gpu_best.log"
  ;;
esac
echo "== done in $(elapsed) s: $(cd "$OUT" && find . -type f | tr '\n' ' ')"
