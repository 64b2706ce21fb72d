#!/usr/bin/env bash
# CUDA green contexts for the express lane (issue 17): are GEMMs and graphs confined to a green stream's SMs, then a query beside bulk on fewer SMs.
# Carry .whl. From the repository root (~2-3 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh green-contexts
# benchmarks.green_contexts (the mechanics: GEMMs and graphs on green streams of SMS counts), then
# benchmarks.express_inprocess on the Qwen3-0.6B config (random bf16) with RESERVED_SMS held back for the express
# lane (default 12,20,28: bulk on 120, 112, 104 SMs while queries are about) beside the usual variants. Results: $OUT/green_contexts.json, $OUT/express_inprocess.json,
# the logs in $OUT/green_contexts_device.log; the two tables last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
t0=$(date +%s)
log=$OUT/green_contexts_device.log
timeout 120 python3 -m benchmarks.green_contexts --out $OUT ${SMS:+--sms $SMS} > $log 2>&1
rc1=$?
echo "green_contexts rc=$rc1 ($(( $(date +%s) - t0 )) s)"
dir=/tmp/m/qwen3-0.6b
zoo_folder qwen3-0.6b $dir || exit 1
limit=$(( ${BUDGET:-570} - $(date +%s) + t0 - 10 )); [ $limit -gt 240 ] && limit=240
timeout $limit python3 -m benchmarks.express_inprocess --model-dir $dir --out $OUT --seconds ${SECONDS_EACH:-4} \
  --reserved-sms ${RESERVED_SMS:-12,20,28} >> $log 2>&1
rc2=$?
echo "express_inprocess rc=$rc2 ($(( $(date +%s) - t0 )) s)"
grep -B1 -A30 '^probe ' $log | tail -30
grep -A10 '^variant ' $log | tail -10
[ $rc1 -eq 0 ] && exit $rc2 || exit $rc1
