#!/usr/bin/env bash
# cuDNN's ragged attention (attention "cudnn") beside torch's varlen: its GPU tests, K/V heads repeated vs native GQA, the attention A/B (causal Qwen3 shapes, MiniLM) -> profiles, then rose-graphs vs rose-best with them (~8 min).
# No extra package (cuDNN ships with torch); carry .whl for the tests' imports:
#     GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh cudnn-attention
# Output in $OUT: attention_backends_cudnn{,_causal}.json, rose_gpu_cudnn.json, and cudnn_attention_run.tar (the
# logs: gpu_tests, gqa_probe, the A/B's and rose_gpu's; profiles/). MODELS (rose_gpu's): qwen3-0.6b,minilm-l6.
set -uo pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
PROFILES=$OUT/profiles
mkdir -p "$PROFILES"
python3 -c "import torch; print('torch', torch.__version__, '| cudnn', torch.backends.cudnn.version(), '|', torch.cuda.get_device_name())"

echo "== GPU tests ($(elapsed) s)"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/rose/test_rose_attention_backends.py \
  tests/rose/test_rose_backend_parity_gpu.py -k "cudnn or varlen" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.log"

echo "== native GQA probe ($(elapsed) s)"
timeout 60 python3 - > "$OUT/gqa_probe.log" 2>&1 <<'PY'
# aten._cudnn_attention_forward with K/V at their own 8 heads (native GQA) vs repeated to 16: error vs float32, us/call in a graph
import torch
from benchmarks.attention_ab import Case, reference, replay_times
from rose.attention import AttentionShape
op = torch.ops.aten._cudnn_attention_forward.default
shape = AttentionShape(16, 8, 128, causal=True)
for n in (128, 512, 4096):
    case = Case([n], shape, torch.device("cuda"))
    cu, m = case.meta.cu_seqlens, case.meta.max_seqlen
    for label, kv in (("repeated", [x.repeat_interleave(2, dim=1) for x in (case.k, case.v)]), ("native", [case.k, case.v])):
        try:
            run = lambda: op(case.q, *kv, None, cu, cu, m, m, False, 0.0, True, False, scale=shape.scale)[0]
            err = float((run().float() - case.ref).abs().max())
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(8):
                    run()
            us = sorted(replay_times(g, 20))[10] * 1e3 / 8
            print(f"{n:5d} tokens {label:9s} err {err:.4f} {us:8.2f} us/call (kernel only: the repeat is outside)")
        except Exception as exc:  # noqa: BLE001
            print(f"{n:5d} tokens {label:9s} FAILED {type(exc).__name__}: {str(exc)[:200]}")
PY
cat "$OUT/gqa_probe.log" | tail -8

echo "== attention A/B ($(elapsed) s)"
timeout 150 python3 -m benchmarks.attention_ab --causal --models qwen3-0.6b,qwen3-4b --backends varlen,cudnn \
  --out "$OUT" --tag _cudnn_causal --profile-dir "$PROFILES" > "$OUT/attention_cudnn_causal.log" 2>&1
echo "causal rc=$?"
timeout 60 python3 -m benchmarks.attention_ab --models minilm-l6 --backends varlen,cudnn \
  --out "$OUT" --tag _cudnn --profile-dir "$PROFILES" > "$OUT/attention_cudnn.log" 2>&1
echo "bidirectional rc=$?"
for f in "$OUT"/attention_backends_cudnn_causal.json "$OUT"/attention_backends_cudnn.json; do
  [ -f "$f" ] && python3 -m benchmarks.attention_ab --print-table "$f" | tail -30
done
find "$PROFILES" -name rose_profile.json | while read -r p; do echo "$p: $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['attention'])" "$p")"; done

echo "== engine: rose-graphs vs rose-best ($(elapsed) s)"
timeout $(( ${BUDGET:-570} - $(elapsed) - 10 )) python3 -m benchmarks.rose_gpu --models ${MODELS:-qwen3-0.6b,minilm-l6} \
  --variants rose-graphs,rose-best --profiles "$PROFILES" --out "$OUT" --tag _cudnn 2>&1 | grep -v Writing > "$OUT/rose_gpu_cudnn.log"
echo "rose_gpu rc=$?"
grep -A40 "^model " "$OUT/rose_gpu_cudnn.log" | tail -24
(cd "$OUT" && tar cf cudnn_attention_run.tar profiles *.log && rm -rf profiles *.log)
echo "== done in $(elapsed) s: $(ls "$OUT" | tr '\n' ' ')"
