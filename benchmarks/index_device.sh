#!/usr/bin/env bash
# `ivy index` (issue 18) through `ivy up` on the Qwen3-0.6B config (random bf16) against the engine in-process on the same 200 k documents, then a SIGKILL mid-run and a --resume with the exactly-once check.
# Carry .whl. From the repository root (~4 min; after `lanes` in the same call it takes what is left, at most
# INDEX_SLOT=240 s):   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh lanes index
# The document count (200 k) is cut to fit the slot after the in-process rate is measured (printed as a NOTE).
# INDEX_FLAGS: more benchmarks.stack.index flags. SMOKE=1: the bundled MiniLM on this machine's CPU, a few hundred
# documents, no wheels needed. Results: $OUT/index_<model>.json, the logs in $OUT/index_device.log; the table last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
[ -n "${SMOKE:-}" ] || require_carried .whl
export IVY_WORKERS=${IVY_WORKERS:-4} TULIP_GRAPH_MANIFEST=off
t0=$(date +%s)
log=$OUT/index_device.log work=/tmp/index_bench
rm -rf $work
if [ -n "${SMOKE:-}" ]; then
  args=(--documents 200 --sort-window 20 --batch-size 8 --concurrency 2 --doc-max-tokens 24
        --port 18380 --tulip-port 18351 --metrics-port 18451)  # ports of their own: this machine may run other stacks
else
  dir=/tmp/m/qwen3-0.6b
  zoo_folder qwen3-0.6b $dir || exit 1
  args=(--model-dir $dir --model qwen3-0.6b)
fi
slot=$(( ${BUDGET:-570} - $(date +%s) + t0 - 15 )); [ $slot -gt ${INDEX_SLOT:-240} ] && slot=${INDEX_SLOT:-240}
[ $slot -ge 60 ] || { echo "index: only $slot s left of the call's budget; not started" >&2; exit 1; }
echo "model ready ($(( $(date +%s) - t0 )) s); index slot $slot s"
set -o pipefail
# shellcheck disable=SC2086  # INDEX_FLAGS are words
timeout $(( slot + 45 )) python3 -m benchmarks.stack.index "${args[@]}" --out $OUT --work $work --budget-s $slot \
  ${INDEX_FLAGS:-} 2>&1 | tee -a $log
rc=$?
cat $work/up.log $work/ivy_index.log >> $log 2> /dev/null
exit $rc
