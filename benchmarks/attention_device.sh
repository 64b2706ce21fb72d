#!/usr/bin/env bash
# Attention backends A/B per token bucket (bidirectional, JIT build timed), their GPU tests, then causal.
# Issue 7, with .whl_fi carried (about 5 minutes, at most ~6.6):
# 1. installs the FlashInfer wheels from .whl_fi (FA4 is not carried: its backend is recorded unavailable);
# 2. the A/B for the qwen3-0.6b, qwen3-4b and minilm-l6 attention shapes, bidirectional, after compiling the
#    JIT kernels into a fresh cache (--build-kernels: the cold first-use seconds, fa2 ~25 s, fa3 ~85 s);
#    writes benchmarks/results/attention_backends.json and benchmarks/results/profiles/<model>/rose_profile.json;
# 3. the GPU tests of the backends, fa3 included (its kernels are cached by then);
# 4. if time is left: the A/B of the Qwen3 shapes causal (Qwen3-Embedding) -> attention_backends_causal.json
#    and profiles/<model>-causal/rose_profile.json;
# copies results and the log to $OUT (8 files at most) and prints the bidirectional table last.
#     bash benchmarks/device.sh attention
set -uo pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
LOG="$OUT/attention_device.log"
mkdir -p benchmarks/results
export ROSE_KERNEL_CACHE_DIR=${ROSE_KERNEL_CACHE_DIR:-/tmp/rose-kernels}  # a fresh cache: the build is timed
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
use_flashinfer
python3 -c "import torch, flashinfer; print('flashinfer', flashinfer.__version__, '| torch', torch.__version__, \
'| CUDA', torch.version.cuda, '|', torch.cuda.get_device_name())" 2>&1 | tail -1 | tee "$LOG"

echo "== A/B, bidirectional, JIT build first ($(elapsed) s)" | tee -a "$LOG"
timeout 290 python3 -m benchmarks.attention_ab --build-kernels --models qwen3-0.6b,qwen3-4b,minilm-l6 \
  --out benchmarks/results 2>&1 | tee -a "$LOG" | grep "^==\|^  build\|profile ->\|Error\|error" | cut -c1-160

echo "== GPU tests ($(elapsed) s)" | tee -a "$LOG"
ROSE_TEST_SLOW_JIT=1 timeout 75 python3 -m pytest -q -m gpu tests/rose/test_rose_attention_backends.py 2>&1 \
  | tee -a "$LOG" | tail -12

if [ "$(elapsed)" -lt 290 ]; then
  echo "== A/B, causal, Qwen3 shapes ($(elapsed) s)" | tee -a "$LOG"
  timeout $(( 395 - $(elapsed) )) python3 -m benchmarks.attention_ab --causal --models qwen3-0.6b,qwen3-4b \
    --out benchmarks/results --tag _causal 2>&1 | tee -a "$LOG" | grep "^==\|profile ->" | cut -c1-160
  [ -f benchmarks/results/attention_backends_causal.json ] && cp benchmarks/results/attention_backends_causal.json "$OUT/" \
    && python3 -m benchmarks.attention_ab --print-table benchmarks/results/attention_backends_causal.json | tail -20
else
  echo "== skipped the causal A/B: $(elapsed) s used" | tee -a "$LOG"
fi

cp benchmarks/results/attention_backends.json "$OUT/" 2>/dev/null
cp -r benchmarks/results/profiles "$OUT/" 2>/dev/null
echo "== done in $(elapsed) s; results in $OUT: $(cd "$OUT" && find . -type f | tr '\n' ' ')"
[ -f benchmarks/results/attention_backends.json ] \
  && python3 -m benchmarks.attention_ab --print-table benchmarks/results/attention_backends.json
