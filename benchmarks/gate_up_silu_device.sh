#!/usr/bin/env bash
# Qwen3's gate-up projection with SiLU·mul in its epilogue (rose.layers.gate_up_act) against F.linear + silu_mul at
# 512-25 600 tokens (its GPU test first). Carry nothing (torch and Triton only); ~2-3 min: ~14 compiles for the test,
# ~14 for the sweep. Writes $OUT/gate_up_act_tests.log, $OUT/gate_up_silu.json and .log; the table last. TOKENS and
# MODELS pass through (512,4096,17920,25600 and qwen3-0.6b,qwen3-4b). ENGINE=1 adds the engine's A/B (below; carry
# .whl then, ~4 min more).
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh gate-up-silu
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 180 python3 -m pytest -q -m gpu tests/rose/test_rose_gate_up_act_gpu.py -p no:cacheprovider \
  > $OUT/gate_up_act_tests.log 2>&1
echo "gate-up GPU tests rc=$? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/gate_up_act_tests.log
timeout $(( ${BUDGET:-570} - $(date +%s) + t0 - 20 )) python3 -m benchmarks.gate_up_silu_ab --out $OUT \
  ${TOKENS:+--tokens $TOKENS} ${MODELS:+--models $MODELS} > $OUT/gate_up_silu.log 2>&1
rc=$?
echo "gate_up_silu_ab rc=$rc in $(( $(date +%s) - t0 )) s"
tail -10 $OUT/gate_up_silu.log
# ENGINE=1: the 0.6B's large suites in-process with the layers' MLP unfused and routed through the best configuration
# at 17 920 tokens (ROSE_GATE_UP_SILU), alternating ROUNDS times (2; each run a process of its own, ~50 s)
if [ "${ENGINE:-0}" = 1 ] && [ $rc -eq 0 ]; then
  best=$(python3 -c "import json
rows = json.load(open('$OUT/gate_up_silu.json'))['records']
print([r for r in rows if r['model'] == 'qwen3-0.6b' and r['tokens'] == 17920][0]['fused_config'] or 'off')")
  echo "engine A/B: ROSE_GATE_UP_SILU=$best against off"
  engine_ab gate_up ROSE_GATE_UP_SILU "off $best" bs1-4096,score-50x512,docs-100
fi
exit $rc
