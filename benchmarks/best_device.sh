#!/usr/bin/env bash
# Issues 4 and 7 on the lent H200, from the repository root with .whl_fi (FlashInfer wheels) carried:
#     STEP=profile bash benchmarks/best_device.sh   # ~4 min: JIT build, causal A/B, GPU breakdown
#     STEP=best    bash benchmarks/best_device.sh   # ~4 min: rose-graphs vs rose-best, same run
# Two calls because one may last 10 minutes; FlashInfer and its kernel cache live under /root, which
# survives between calls while the machine stays warm (the carried tree does not).
# STEP=profile: installs FlashInfer, builds its kernels (first-use seconds reported), A/B of the Qwen3
#   shapes causal (Qwen3-Embedding, as rose_gpu's folders are) -> profiles/<model>-causal/, and
#   benchmarks.rose_breakdown (GPU time per kernel class vs host->host at 128/512/4096 tokens).
# STEP=best: benchmarks.rose_gpu with --variants rose-graphs,rose-best --profiles <the A/B's profiles>
#   -> rose_gpu_best.json (merge its rose-best records into rose_gpu.json on the laptop).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/best-device-out}
mkdir -p "$OUT" benchmarks/results
export PYTHONUNBUFFERED=1
export ROSE_KERNEL_CACHE_DIR=/root/rose-kernels
PROFILES=/root/profiles
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

if [ ! -d /root/fi/flashinfer ] && ls .whl_fi/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /root/fi .whl_fi/*.whl
fi
[ -d /root/fi ] && export PYTHONPATH=/root/fi:${PYTHONPATH:-}
export PYTHONPATH=$PWD:${PYTHONPATH:-}
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
