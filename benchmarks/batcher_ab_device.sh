#!/usr/bin/env bash
# Tulip's batch pacing and idle capture, A/B through the stack (Qwen3-0.6B), after ROSE's GPU tests.
# One device call (carry .whl; ~8 min): the Qwen3-0.6B config (random bf16 weights), each variant a fresh
# `ivy up` with no graph manifest, the same seeded requests, the server's counters per step. Prints one table last.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh batcher-ab
# VARIANTS: "label pack_ahead_ms idle_capture_ms" triples (default: packing at once, the default of packing
# 1 ms ahead, the default + idle capture after 5 ms). DURATION: seconds per level (3).
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
export IVY_WORKERS=${IVY_WORKERS:-4} TULIP_GRAPH_MANIFEST=off
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
timeout 150 python3 -m pytest -q -m gpu tests/rose -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($(el) s)"; tail -2 $OUT/gpu_tests.log
dir=/tmp/m/qwen3-0.6b
python3 -m benchmarks.model_zoo qwen3-0.6b $dir --dtype bfloat16 2>&1 | grep -v Writing | tail -1
python3 -m benchmarks.stack.reference --model-dir $dir --out /tmp/ref.json --device cuda --dtype float32 2>&1 | tail -1
for variant in ${VARIANTS:-"pack0 0 0" "pack1 1 0" "pack1_idle5 1 5"}; do
  set -- $variant
  TULIP_PACK_AHEAD_MS=$2 TULIP_IDLE_CAPTURE_MS=$3 python3 -m ivy up --model $dir --port 8080 --tulip-port 50051 \
    > /tmp/up_$1.log 2>&1 &
  up=$!
  for i in $(seq 1 120); do curl -sf http://127.0.0.1:8080/ready > /dev/null && break; sleep 1; done
  echo "== $1 (pack_ahead_ms $2, idle_capture_ms $3) ready after $i s ($(el) s)"
  timeout 200 python3 -m benchmarks.stack --url http://127.0.0.1:8080 --model qwen3-0.6b --tokenizer $dir \
    --suite embed-latency,concurrency --embed-tokens 128,512 --duration-s ${DURATION:-3} --out $OUT --label $1 \
    --client-cpus 8-15 --reference /tmp/ref.json --server-metrics http://127.0.0.1:50151/metrics \
    2>> $OUT/batcher_ab.log
  kill -TERM $up; wait $up
  rm -f $OUT/stack_qwen3-0.6b_$1_*.png  # at most 8 files come back: the JSONs carry the numbers
done
cat /tmp/up_*.log >> $OUT/batcher_ab.log
python3 - <<'PY'
import glob, json, os
from benchmarks.stack.server_counters import describe
print(f"{'variant':12s} {'suite':14s} {'param':>5s} {'p50':>7s} {'p95':>7s} {'p99':>7s} {'req/s':>8s}  server")
for path in sorted(glob.glob(os.environ["OUT"] + "/stack_qwen3-0.6b_*.json")):
    label = path.rsplit("stack_qwen3-0.6b_", 1)[1][:-5]
    for r in json.load(open(path))["records"]:
        print(f"{label:12s} {r['suite']:14s} {r['param']:>5} {r['p50_ms']:7.2f} {r['p95_ms']:7.2f} {r['p99_ms']:7.2f} "
              f"{r['rps']:8.1f}  {describe(r.get('server') or {})}")
PY
echo "done in $(el) s"
