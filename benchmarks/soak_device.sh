#!/usr/bin/env bash
# Soak (issue 15) on the Qwen3-0.6B config (random bf16): ivy up, saturation found, then open-loop Poisson load at 70 % of it; RSS, pinned bytes, p99 flat?
# Carry .whl. From the repository root (one whole call, ~9.5 min; run it alone):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh soak
# One command runs at most 600 s, so in one call the load phase is sized by $BUDGET: what is left of the call
# after the model (written here), the stack's start (~60 s), the saturation ramp (~45 s) and the wrap-up
# (~45 s), at most 480 s (about 6 minutes in a fresh call). DURATION overrides it.
# The issue's 10 minutes take two calls on one warm machine (it stays up ~30 s after a call, and a process in
# a session of its own outlives the call that started it):
#   STEP=start  GIT_COMMIT=... bash benchmarks/device.sh soak     # starts it (setsid), waits out this call
#   STEP=finish GIT_COMMIT=... bash benchmarks/device.sh soak     # the next call, at once: waits, collects
# STEP=start runs this script again with DURATION=${DURATION:-600} and OUT=/root/soak/out (DEVICE_ENV_READY
# kept: its wheels stay in /tmp/site), returns after WAIT_S (BUDGET - 15) or when it ends; STEP=finish waits
# for it within its BUDGET and copies the results and logs into $OUT. IVY_WORKERS=4, no graph manifest,
# ports 8080 / 50051 / 50151, clients on CPUs 8-15. SOAK_FLAGS: more benchmarks.stack.soak flags.
# SMOKE=1: the bundled MiniLM on this machine's CPU, tiny sizes, no wheels needed (checks the script, not speed).
# Results: $OUT/soak_<model>.json + .png, the run's and the stack's logs in $OUT/soak_device.log; the table last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
[ -n "${SMOKE:-}" ] || require_carried .whl
run=${SOAK_RUN_DIR:-/root/soak}
wait_run() {  # wait_run SECONDS: until the background soak ends or SECONDS pass; its progress every 30 s
  local until=$(( $(date +%s) + $1 )) n=0
  while kill -0 "$(cat $run/pid)" 2> /dev/null && [ "$(date +%s)" -lt $until ]; do
    sleep 5; n=$(( n + 1 )); [ $(( n % 6 )) -eq 0 ] && echo "   soak: $(tail -1 $run/run.log 2> /dev/null | cut -c1-150)"
  done
  ! kill -0 "$(cat $run/pid)" 2> /dev/null
}
case "${STEP:-}" in
  start)
    rm -rf $run; mkdir -p $run/out
    OUT=$run/out DURATION=${DURATION:-600} BUDGET=100000 STEP= setsid nohup bash "${BASH_SOURCE[0]}" \
      > $run/run.log 2>&1 < /dev/null &
    echo $! > $run/pid
    echo "soak started in the background (pid $(cat $run/pid), $run/run.log)"
    wait_run $(( ${WAIT_S:-${BUDGET:-570} - 15} )) && echo "soak already ended" || echo "soak still running: STEP=finish next"
    exit 0 ;;
  finish)
    [ -f $run/pid ] || { echo "soak: no background run in $run (STEP=start first, on this machine)" >&2; exit 1; }
    wait_run $(( ${BUDGET:-570} - 15 )) || { echo "soak: still running after this call's budget" >&2; exit 1; }
    cp $run/out/* "$OUT"/ 2> /dev/null; cp $run/run.log "$OUT"/soak_device.log
    tail -25 $run/run.log
    exit 0 ;;
esac
export IVY_WORKERS=${IVY_WORKERS:-4} TULIP_GRAPH_MANIFEST=off
t0=$(date +%s)
log=$OUT/soak_device.log logs=/tmp/soak_logs
rm -rf $logs
if [ -n "${SMOKE:-}" ]; then
  export IVY_WORKERS=1
  args=(--duration-s ${DURATION:-4} --interval-s 1 --saturation-step-s 1 --saturation-max-clients 2 --load-procs 1
        --load-threads 4 --batch-docs 4 --distinct-inputs 2 --doc-max-tokens 32
        --port 18580 --tulip-port 18551 --metrics-port 18651)  # ports of their own: this machine may run other stacks
else
  dir=/tmp/m/qwen3-0.6b
  zoo_folder qwen3-0.6b $dir || exit 1
  echo "model ready ($(( $(date +%s) - t0 )) s)"
  left=$(( ${BUDGET:-570} - $(date +%s) + t0 ))
  duration=$(( left - 150 )); [ $duration -gt 480 ] && duration=480
  duration=${DURATION:-$duration}
  [ "$duration" -ge 60 ] || { echo "soak: only $left s left in this call; run it first, alone" >&2; exit 1; }
  echo "soak: $duration s of load ($left s left in the call)"
  args=(--model-dir $dir --duration-s $duration --client-cpus ${CLIENT_CPUS:-8-15})
fi
limit=$(( ${BUDGET:-570} - $(date +%s) + t0 - 5 ))
set -o pipefail
# shellcheck disable=SC2086  # SOAK_FLAGS are words
timeout $limit python3 -m benchmarks.stack.soak "${args[@]}" --out $OUT --logs $logs ${SOAK_FLAGS:-} 2>&1 | tee -a $log
rc=$?
cat $logs/*.log >> $log 2> /dev/null
exit $rc
