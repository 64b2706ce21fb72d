#!/usr/bin/env bash
# Priority lanes (issue 17) on the Qwen3-0.6B config (random bf16): 1 interactive client beside 4 bulk clients, idle / FCFS (TULIP_LANES=false) / express (TULIP_BULK_LAYERS_AHEAD=0) / layers (the defaults: bulk stepped layer by layer), one run.
# Carry .whl. From the repository root (~3 min: three stacks):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh lanes
# benchmarks.stack.lanes starts its two stacks with `ivy up` itself (IVY_WORKERS=4, no graph manifest), ports
# 8080 / 50051 / 50151. DURATION: seconds per configuration (10). LANES_FLAGS: more benchmarks.stack.lanes flags.
# SMOKE=1: the bundled MiniLM on this machine's CPU, tiny sizes, no wheels needed (checks the script, not speed).
# Results: $OUT/lanes.json + lanes.png, the run's and the stacks' logs in $OUT/lanes_device.log; the table last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
[ -n "${SMOKE:-}" ] || require_carried .whl
export IVY_WORKERS=${IVY_WORKERS:-4} TULIP_GRAPH_MANIFEST=off
t0=$(date +%s)
log=$OUT/lanes_device.log logs=/tmp/lanes_logs
rm -rf $logs
if [ -n "${SMOKE:-}" ]; then
  args=(--duration-s 1 --warmup-requests 1 --bulk-clients 2 --bulk-docs 4 --distinct-inputs 2 --doc-max-tokens 32
        --port 18380 --tulip-port 18351 --metrics-port 18451)  # ports of their own: this machine may run other stacks
else
  dir=/tmp/m/qwen3-0.6b
  zoo_folder qwen3-0.6b $dir || exit 1
  echo "model ready ($(( $(date +%s) - t0 )) s)"
  args=(--model-dir $dir --duration-s ${DURATION:-10} --client-cpus ${CLIENT_CPUS:-8-15})
fi
limit=$(( ${BUDGET:-570} - 10 )); [ $limit -gt 330 ] && limit=330  # leave the rest of the call to what follows
set -o pipefail
# shellcheck disable=SC2086  # LANES_FLAGS are words
timeout $limit python3 -m benchmarks.stack.lanes "${args[@]}" --out $OUT --logs $logs ${LANES_FLAGS:-} 2>&1 | tee -a $log
rc=$?
cat $logs/*.log >> $log 2> /dev/null
exit $rc
