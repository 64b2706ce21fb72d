#!/usr/bin/env bash
# Where the harness's CPU goes on the H200 host, one client at 1 x 128 token ids through `ivy up` (Qwen3-0.6B config, random bf16) and straight to Tulip: each thread's user / kernel / run-queue time per request (benchmarks.thread_cpu), then py-spy on Tulip and the busy Ivy worker (benchmarks.profile_summary), then the same with the collector's thresholds raised (GC=0 skips that). STEP=spin: the stack pinned to PIN with and without SCHED_IDLE busy loops on its cores (is the host's idle the cost?); STEP=warm: `ivy up` beside `ivy up --warm-cores`; STEP=warm-load: the same at 4 and 16 clients. STEP=load-profile: Tulip's threads and py-spy while CLIENTS (16) closed-loop clients load it directly (LAYER, tulip-framed), one stack per LOAD_VARIANTS entry. SPY_IDLE=1: py-spy records the threads' waits too. MODEL: another benchmarks.model_zoo name (MODEL=minilm-l6).
# Carry .whl and .whl_prof (py-spy's wheel: pip download py-spy --no-deps -d .whl_prof --platform
# manylinux2014_x86_64 --only-binary=:all:). From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh stack-profile
# SECONDS_EACH (default 12) is how long each layer is recorded; RATE (default 997) py-spy's samples a second;
# SPY_NATIVE=1: py-spy with C frames (it pauses the process at each sample: take RATE ~200).
# Results (at most 8 files come back): $OUT/stack_profile.tar.gz (the collapsed stacks, the summaries, the
# per-thread tables as JSON, the layers' records) and $OUT/stack_profile.log.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
require_carried .whl_prof
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/prof .whl_prof/*.whl || exit 1
spy=/tmp/prof/bin/py-spy
export TULIP_GRAPH_MANIFEST=off
export SECONDS_EACH=${SECONDS_EACH:-12} RATE=${RATE:-997}
secs=$SECONDS_EACH rate=$RATE
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
model=${MODEL:-qwen3-0.6b} dir=${MODEL_DIR:-/tmp/m/$model}  # MODEL: a zoo name; MODEL_DIR: a folder (a dry run on a CPU)
[ -n "${MODEL_DIR:-}" ] || zoo_folder $model $dir || exit 1
mkdir -p /tmp/sp && rm -rf /tmp/sp/* && mkdir -p /tmp/gcx
# A variant's env, applied to every process of the stack from a sitecustomize: GCX_THRESHOLD, gc.set_threshold;
# GCX_SWITCH_MS, Python's thread switch interval (sys.setswitchinterval; Python's default is 5 ms).
printf 'import gc, os, sys\nt = os.environ.get("GCX_THRESHOLD")\nif t:\n    gc.set_threshold(*map(int, t.split(",")))\nw = os.environ.get("GCX_SWITCH_MS")\nif w:\n    sys.setswitchinterval(float(w) / 1e3)\n' > /tmp/gcx/sitecustomize.py

# Its steps compare cores kept warm by hand (STEP=spin) or by the flag (warm, warm-load) with a stack without them:
# `ivy up`'s own loops (--warm-cores auto, the default on this host) stay off unless a step turns them on.
export IVY_UP_WARM_CORES=${IVY_UP_WARM_CORES:-off}
start_up() {  # start_up LABEL [VAR=value ...]: `ivy up` until /ready; sets up, tulip_pid, ivy_pids
  local label=$1; shift
  env PYTHONPATH=/tmp/gcx:$PYTHONPATH "$@" ${PIN:+taskset -c $PIN} python3 -m ivy up --model $dir --served-model-name $model --port 8080 \
    --tulip-port 50051 > /tmp/up_$label.log 2>&1 &
  up=$!
  for i in $(seq 1 150); do curl -sf http://127.0.0.1:8080/ready > /dev/null && break; sleep 1; done
  tulip_pid=$(pgrep -f "tulip serve" | head -1)
  local serve_pid; serve_pid=$(pgrep -f "ivy serve" | head -1)
  ivy_pids=$(pgrep -P "$serve_pid" | tr '\n' ' '); ivy_pids=${ivy_pids:-$serve_pid}  # one worker: serve itself
  echo "== $label ready after $i s ($(el) s): tulip $tulip_pid, ivy workers $ivy_pids"
}
stop_up() { kill -TERM $up; wait $up; cat /tmp/up_$1.log >> $OUT/stack_profile.log; }

run_layer() {  # run_layer LABEL LAYER SECONDS: one client, 1 x 128 token ids; prints p50 and requests
  python3 -m benchmarks.stack.layers --url http://127.0.0.1:8080 --tulip 127.0.0.1:50051 --model-dir $dir \
    --model $model --out /tmp/sp --label "$1_$2" --layers "${2/warm-up/ivy-ids}" --suite embed-latency --embed-tokens 128 \
    --skip-verify true --client-cpus ${CLIENT_CPUS:-8-15} --gpus 1 --duration-s "$3" \
    --server-metrics http://127.0.0.1:50151/metrics >> $OUT/stack_profile.log 2>&1
  python3 -c "
import json, sys
r = [r for r in json.load(open('/tmp/sp/stack_layers_${model}_$1_$2.json'))['records'] if not r.get('error')][0]
s = r.get('server') or {}
print(f\"{r['p50_ms']:.3f} {r['p99_ms']:.3f} {int(s.get('batches') or r['rps'] * $3)}\")"
}

measure() {  # measure LABEL LAYER: the per-thread table of Tulip and Ivy's workers over one layer run
  local pids="$tulip_pid"; [ $2 = ivy-ids ] && pids="$tulip_pid $ivy_pids"
  python3 -m benchmarks.thread_cpu snap $pids > /tmp/sp/before.json
  read -r p50 p99 n <<< "$(run_layer $1 $2 $secs)"
  python3 -m benchmarks.thread_cpu snap $pids > /tmp/sp/after.json
  echo "-- $1 $2: p50 $p50 ms, p99 $p99 ms, $n requests ($(el) s)"
  python3 -m benchmarks.thread_cpu diff /tmp/sp/before.json /tmp/sp/after.json --requests $n \
    --label "$1 $2 (tulip $tulip_pid)" --json /tmp/sp/threads_$1_$2.json
}

spy_start() {  # spy_start PID FILE: py-spy on PID for SECONDS_EACH - 4 s, in the background (its pid: $!)
  local native=(--nonblocking); [ "${SPY_NATIVE:-0}" = 1 ] && native=(--native)  # native: C frames, pauses each sample
  [ "${SPY_IDLE:-0}" = 1 ] && native+=(--idle)  # idle: the threads' waits too (the GIL's, the driver's, the queues')
  $spy record --pid $1 --rate $rate --duration $((secs - 4)) --format raw "${native[@]}" --threads -o $2 \
    > /dev/null 2>> $OUT/stack_profile.log &
}

if [ "${STEP:-profile}" = load-profile ]; then
  # Tulip under load: CLIENTS (16) closed-loop clients on lognormal documents straight to Tulip over LAYER
  # (tulip-framed), its threads' CPU over the run and py-spy on it (all-MiniLM's ceiling: ~2 500 requests a second
  # on an H100 host with the device 40 % busy, benchmarks/NOTES.md "all-MiniLM-L6-v2, the bundled model").
  # LOAD_VARIANTS: "label [VAR=value ...];label2 ..." (default "load"), one stack each, in turn (an A/B of
  # GCX_SWITCH_MS, say: "base;switch05 GCX_SWITCH_MS=0.5;base2;switch05b GCX_SWITCH_MS=0.5").
  IFS=';' read -ra variants <<< "${LOAD_VARIANTS:-load}"
  for variant in "${variants[@]}"; do
    read -ra words <<< "$variant"
    label=${words[0]}
    start_up $label "${words[@]:1}"
    run_layer $label warm-up 2 > /dev/null
    python3 -m benchmarks.thread_cpu snap $tulip_pid > /tmp/sp/before.json
    spy_start $tulip_pid /tmp/sp/spy_tulip_$label.txt
    spy_pid=$!
    python3 -m benchmarks.stack.layers --url http://127.0.0.1:8080 --tulip 127.0.0.1:50051 --model-dir $dir \
      --model $model --out /tmp/sp --label $label --layers ${LAYER:-tulip-framed} --suite concurrency \
      --concurrency-levels ${CLIENTS:-16} --skip-verify true --client-cpus ${CLIENT_CPUS:-8-15} --gpus 1 \
      --duration-s $secs --server-metrics http://127.0.0.1:50151/metrics >> $OUT/stack_profile.log 2>&1
    python3 -m benchmarks.thread_cpu snap $tulip_pid > /tmp/sp/after.json
    wait $spy_pid
    read -r n line <<< "$(python3 -c "
import json
from benchmarks.stack.server_counters import describe
r = [r for r in json.load(open('/tmp/sp/stack_layers_${model}_$label.json'))['records'] if not r.get('error')][0]
print(int(r['rps'] * $secs), f\"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f}, {r['rps']:.0f} requests/s;\", describe(r.get('server') or {}))")"
    echo "-- $variant: $line ($(el) s)"
    python3 -m benchmarks.thread_cpu diff /tmp/sp/before.json /tmp/sp/after.json --requests $n \
      --label "$label (tulip $tulip_pid)" --json /tmp/sp/threads_$label.json
    python3 -m benchmarks.profile_summary /tmp/sp/spy_tulip_$label.txt --rate $rate \
      --requests $(( n * (secs - 4) / secs )) --top ${TOP:-30} --json /tmp/sp/spy_summary_$label.json \
      $([ "${SPY_NATIVE:-0}" = 1 ] && echo --drop-idle)
    stop_up $label
  done
elif [ "${STEP:-profile}" = warm-load ]; then
  # The same two under load: 4 and 16 closed-loop clients on lognormal documents with token ids, one round.
  for side in plain warm; do
    flags=(IVY_UP_WARM_CORES=off); [ $side = warm ] && flags=(IVY_UP_WARM_CORES=on)
    start_up $side "${flags[@]}"
    run_layer $side warm-up 2 > /dev/null
    python3 -m benchmarks.stack.layers --url http://127.0.0.1:8080 --tulip 127.0.0.1:50051 --model-dir $dir \
      --model $model --out /tmp/sp --label "${side}_load" --layers ivy-ids --suite concurrency \
      --concurrency-levels 4,16 --skip-verify true --client-cpus ${CLIENT_CPUS:-8-15} --gpus 1 --duration-s $secs \
      >> $OUT/stack_profile.log 2>&1
    python3 -c "
import json
for r in json.load(open('/tmp/sp/stack_layers_${model}_${side}_load.json'))['records']:
    print(f\"-- $side {r['suite']} {r['param']}: \" + (r.get('error') or f\"{r['tokens_per_s'] / 1e3:.1f} k tok/s, p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms\"))"
    stop_up $side
  done
elif [ "${STEP:-profile}" = warm ]; then
  # `ivy up` beside `ivy up --warm-cores` (the product's flag, no pinning), alternating ROUNDS (2) times;
  # LAYERS (default "ivy-ids tulip-grpc") are measured in each.
  for round in $(seq 1 ${ROUNDS:-2}); do
    for side in plain warm; do
      flags=(IVY_UP_WARM_CORES=off); [ $side = warm ] && flags=(IVY_UP_WARM_CORES=on)
      start_up $side$round "${flags[@]}"
      run_layer $side$round warm-up 2 > /dev/null
      for layer in ${LAYERS:-ivy-ids tulip-grpc}; do measure $side$round $layer; done
      stop_up $side$round
    done
  done
elif [ "${STEP:-profile}" = spin ]; then
  # Whether the host's idle cores cost the stack: `ivy up` pinned to PIN (default 0-7), the client on 8-15, and
  # rounds without and with one SCHED_IDLE busy loop per pinned core (they run only when the core has nothing
  # else, so the stack's threads wake on a core that never halted), alternating twice.
  export PIN=${PIN:-0-7}
  start_up pinned
  run_layer pinned warm-up 2 > /dev/null
  for round in 1 2; do
    for side in plain spin; do
      spinners=()
      if [ $side = spin ]; then
        for c in $(python3 -c "import os; print(' '.join(map(str, sorted(os.sched_getaffinity($tulip_pid)))))"); do
          python3 -m ivy.warm_cores $c &  # what `ivy up --warm-cores` starts per core
          spinners+=($!)
        done
        sleep 1
      fi
      measure $side$round ivy-ids
      measure $side$round tulip-grpc
      [ ${#spinners[@]} -gt 0 ] && kill "${spinners[@]}" && wait "${spinners[@]}" 2> /dev/null
    done
  done
  stop_up pinned
else
variants=("base")
[ "${GC:-1}" = 1 ] && variants+=("gc GCX_THRESHOLD=50000,50,100000")
for variant in "${variants[@]}"; do
  set -- $variant; label=$1; shift
  start_up $label "$@"
  run_layer $label warm-up 2 > /dev/null  # the layout's graph captured, the connections open
  measure $label ivy-ids
  measure $label tulip-grpc
  if [ $label = base ]; then  # py-spy on Tulip and every Ivy worker (the connection lands on any of them)
    spies=()
    for pid in $tulip_pid $ivy_pids; do
      name=ivy$pid; [ $pid = $tulip_pid ] && name=tulip
      spy_start $pid /tmp/sp/spy_$name.txt
      spies+=($!)
    done
    read -r p50 p99 n <<< "$(run_layer spy ivy-ids $secs)"
    wait "${spies[@]}"
    busy=$(ls -S /tmp/sp/spy_ivy*.txt | head -1)  # the worker that served: the most samples
    echo "-- py-spy during ivy-ids: p50 $p50 ms ($(el) s); µs a request over the $((secs - 4)) s recorded"
    python3 -m benchmarks.profile_summary /tmp/sp/spy_tulip.txt $busy --rate $rate \
      --requests $(( n * (secs - 4) / secs )) --top ${TOP:-22} --json /tmp/sp/spy_summary.json \
      $([ "${SPY_NATIVE:-0}" = 1 ] && echo --drop-idle)
  fi
  stop_up $label
done
fi
rm -f /tmp/sp/*_inputs.json /tmp/sp/before.json /tmp/sp/after.json
tar -czf $OUT/stack_profile.tar.gz -C /tmp/sp .
