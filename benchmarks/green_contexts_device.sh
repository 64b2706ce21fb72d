#!/usr/bin/env bash
# CUDA green contexts for the express lane (issue 17): are GEMMs and graphs confined to a green stream's SMs, and what does a small GEMM chain gain beside bulk held to fewer SMs?
# Carry nothing (torch only). From the repository root (~20 s):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh green-contexts
# SMS: the green contexts' SM counts (default 128,120,112,64,16,8). Results: $OUT/green_contexts.json and the log
# in $OUT/green_contexts_device.log; the table last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
t0=$(date +%s)
log=$OUT/green_contexts_device.log
timeout 120 python3 -m benchmarks.green_contexts --out $OUT ${SMS:+--sms $SMS} > $log 2>&1
rc=$?
echo "green_contexts rc=$rc ($(( $(date +%s) - t0 )) s)"
grep -A30 '^probe ' $log | tail -30
exit $rc
