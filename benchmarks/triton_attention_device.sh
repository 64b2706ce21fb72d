#!/usr/bin/env bash
# ROSE's Triton ragged attention (attention "triton", auto's default on CUDA) beside torch's varlen: its GPU tests, the attention A/B (causal Qwen3 shapes, MiniLM) -> profiles, rose-graphs (the default) vs rose-best with a varlen-only profile, then (FAMILIES=1, the default) MPNet-base banded (--attention varlen) vs auto (triton), and the windowed models (ModernBERT-base, EmbeddingGemma-300m) varlen's window vs auto (~9 min; AB=0 leaves the kernel A/B out, ~6 min; SPLIT=1 first times the kernel's unmasked key blocks beside every block masked, ~2 min).
# No extra package (Triton ships with torch); carry .whl for the tests' imports:
#     GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh triton-attention
# Output in $OUT: attention_backends_triton{,_causal}.json (AB=1), triton_attention_split.json (SPLIT=1),
# rose_gpu_triton.json, rose_gpu_{mpnet,windowed}_{varlen,auto}.json (FAMILIES=1), and triton_attention_run.tar
# (the logs: gpu_tests, the A/B's and rose_gpu's; profiles/). MODELS (rose_gpu's): qwen3-0.6b,minilm-l6.
# Each step's timeout comes out of BUDGET (570 s) with at least 30-60 s each: the whole can pass BUDGET by ~2 min.
set -uo pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
PROFILES=$OUT/profiles
mkdir -p "$PROFILES"
python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '|', torch.cuda.get_device_name())"

echo "== GPU tests ($(elapsed) s)"
timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/rose/test_rose_attention_backends.py \
  tests/rose/test_rose_backend_parity_gpu.py tests/rose/test_rose_encoder_gpu.py tests/rose/test_rose_decoders_gpu.py \
  -k "triton or varlen or auto or cuda_graph_replay" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.log"

if [ "${SPLIT:-0}" = 1 ]; then  # the kernel's unmasked key blocks beside every block masked, a few block sizes
  echo "== masked vs unmasked key blocks ($(elapsed) s)"
  timeout 240 python3 -m benchmarks.triton_attention_sweep --split --out "$OUT/triton_attention_split.json" \
    > "$OUT/triton_attention_split.log" 2>&1
  echo "split rc=$?"; tail -9 "$OUT/triton_attention_split.log"
fi
if [ "${AB:-1}" = 1 ]; then
echo "== attention A/B ($(elapsed) s)"
timeout 150 python3 -m benchmarks.attention_ab --causal --models qwen3-0.6b,qwen3-4b --backends varlen,triton \
  --out "$OUT" --tag _triton_causal --profile-dir "$PROFILES" > "$OUT/attention_triton_causal.log" 2>&1
echo "causal rc=$?"
timeout 60 python3 -m benchmarks.attention_ab --models minilm-l6 --backends varlen,triton \
  --out "$OUT" --tag _triton --profile-dir "$PROFILES" > "$OUT/attention_triton.log" 2>&1
echo "bidirectional rc=$?"
for f in "$OUT"/attention_backends_triton_causal.json "$OUT"/attention_backends_triton.json; do
  [ -f "$f" ] && python3 -m benchmarks.attention_ab --print-table "$f" | tail -30
done
find "$PROFILES" -name rose_profile.json | while read -r p; do echo "$p: $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['attention'])" "$p")"; done
fi
mkdir -p "$PROFILES/qwen3-0.6b-causal" "$PROFILES/minilm-l6"  # the folders the varlen-only profiles go to (the A/B's, or these)

echo "== engine: rose-graphs (auto's default) vs rose-best with varlen at every bucket ($(elapsed) s)"
python3 - "$PROFILES" <<'PY'
import sys
from pathlib import Path
from benchmarks.attention_ab import PROFILE_BUCKETS
from rose.attention import ServingProfile
for folder in Path(sys.argv[1]).iterdir():  # the measured profiles' folders, a varlen-only profile in each twin
    out = Path(sys.argv[1] + "_varlen") / folder.name
    out.mkdir(parents=True, exist_ok=True)
    ServingProfile({b: "varlen" for b in PROFILE_BUCKETS}, {"source": "varlen at every bucket"}).save(out / "rose_profile.json")
PY
left=$(( ${BUDGET:-570} - $(elapsed) - ${FAMILIES_S:-240} )); [ $left -ge 60 ] || left=60  # FAMILIES_S: kept for the families
timeout $left python3 -m benchmarks.rose_gpu --models ${MODELS:-qwen3-0.6b,minilm-l6} \
  --variants rose-graphs,rose-best --profiles "${PROFILES}_varlen" --out "$OUT" --tag _triton 2>&1 | grep -v Writing > "$OUT/rose_gpu_triton.log"
echo "rose_gpu rc=$?"
grep -A40 "^model " "$OUT/rose_gpu_triton.log" | tail -24

# varlen_vs_auto TAG MODELS [rose_gpu flags]: rose-graphs with --attention varlen, then auto (triton), in one call
varlen_vs_auto() {
  local tag=$1 models=$2; shift 2
  for attention in varlen auto; do
    left=$(( ${BUDGET:-570} - $(elapsed) - 5 )); [ $left -gt 30 ] || left=30
    timeout $left python3 -m benchmarks.rose_gpu --models $models --variants rose-graphs --attention $attention "$@" \
      --out "$OUT" --tag _${tag}_$attention 2>&1 | grep -v Writing > "$OUT/rose_gpu_${tag}_$attention.log"
    echo "rose_gpu $tag $attention rc=$?"; grep -A8 "^model " "$OUT/rose_gpu_${tag}_$attention.log"
  done
}
if [ "${FAMILIES:-1}" = 1 ]; then  # the models with a bias or windows: varlen (MPNet: its banded path) vs auto (triton)
  echo "== MPNet-base: the banded path (varlen) vs its bias in the Triton kernel (auto) ($(elapsed) s)"
  varlen_vs_auto mpnet mpnet-base
  echo "== windowed models: varlen's window vs the Triton kernel's (auto) ($(elapsed) s)"
  varlen_vs_auto windowed modernbert-base,embeddinggemma-300m --quick
fi
(cd "$OUT" && tar cf triton_attention_run.tar profiles profiles_varlen *.log && rm -rf profiles profiles_varlen *.log)
echo "== done in $(elapsed) s: $(ls "$OUT" | tr '\n' ' ')"
