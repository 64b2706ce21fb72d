#!/usr/bin/env bash
# Where the harness's CPU goes on the H200 host: py-spy on Tulip and Ivy's workers while one client sends 1 x 128 token ids through `ivy up` (Qwen3-0.6B config, random bf16), then while it calls Tulip directly; benchmarks.profile_summary's table per process.
# Carry .whl and .whl_prof (py-spy's wheel: pip download py-spy --no-deps -d .whl_prof --platform
# manylinux2014_x86_64 --only-binary=:all:). From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh stack-profile
# SECONDS_EACH (default 12) is how long each layer is recorded; RATE (default 997) py-spy's samples a second.
# Results: $OUT/profile/{ivy-ids,tulip-grpc}_{tulip,ivy<pid>}.txt (collapsed stacks), profile_summary.json,
# the layers' records (stack_layers_qwen3-0.6b_<layer>.json) and the log.
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
dir=${MODEL_DIR:-/tmp/m/qwen3-0.6b} model=qwen3-0.6b  # MODEL_DIR: another folder (a dry run on a CPU)
[ -n "${MODEL_DIR:-}" ] || zoo_folder $model $dir || exit 1
mkdir -p $OUT/profile
python3 -m ivy up --model $dir --served-model-name $model --port 8080 --tulip-port 50051 > /tmp/up_profile.log 2>&1 &
up=$!
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8080/ready > /dev/null && break; sleep 1; done
echo "ready after $i s ($(el) s)"
tulip_pid=$(pgrep -f "tulip serve" | head -1)
serve_pid=$(pgrep -f "ivy serve" | head -1)
ivy_pids=$(pgrep -P "$serve_pid" | tr '\n' ' ')
ivy_pids=${ivy_pids:-$serve_pid}  # one worker: `ivy serve` serves in its own process
echo "tulip $tulip_pid, ivy serve $serve_pid, its workers: $ivy_pids"

run_layer() {  # run_layer LAYER DURATION: one client, 1 x 128 token ids
  python3 -m benchmarks.stack.layers --url http://127.0.0.1:8080 --tulip 127.0.0.1:50051 --model-dir $dir \
    --model $model --out $OUT --label "$1" --layers "$1" --suite embed-latency --embed-tokens 128 \
    --skip-verify true --client-cpus ${CLIENT_CPUS:-8-15} --gpus 1 --duration-s "$2" --server-metrics http://127.0.0.1:50151/metrics \
    2>> $OUT/stack_profile.log | tail -1
}

run_layer ivy-ids 2 > /dev/null  # the layout's graph captured, the connections open
for layer in ivy-ids tulip-grpc; do
  pids="$tulip_pid"; [ $layer = ivy-ids ] && pids="$tulip_pid $ivy_pids"
  spies=()
  for pid in $pids; do
    name=ivy$pid; [ $pid = $tulip_pid ] && name=tulip
    $spy record --pid $pid --rate $rate --duration $((secs - 2)) --format raw --nonblocking --threads \
      -o $OUT/profile/${layer}_$name.txt > /dev/null 2>> $OUT/stack_profile.log &
    spies+=($!)
  done
  sleep 0.5
  echo "$layer: $(run_layer $layer $secs) ($(el) s)"
  wait "${spies[@]}"
done
kill -TERM $up; wait $up
cat /tmp/up_profile.log >> $OUT/stack_profile.log
python3 - <<'PY'
import glob, json, os, subprocess, sys
out = os.environ["OUT"]
summaries = []
for layer in ("ivy-ids", "tulip-grpc"):
    recs = json.load(open(f"{out}/stack_layers_qwen3-0.6b_{layer}.json"))["records"]
    r = next(r for r in recs if r.get("layer") == layer and not r.get("error"))
    print(f"{layer}: p50 {r['p50_ms']:.3f} ms, {r['rps']:.0f} requests/s")
    files = sorted(glob.glob(f"{out}/profile/{layer}_*.txt"))
    files = [f for f in files if os.path.getsize(f) > 0]
    # py-spy recorded for SECONDS_EACH - 2 s of the layer's steady requests
    requests = int(r["rps"] * (int(os.environ.get("SECONDS_EACH", 12)) - 2))
    subprocess.run([sys.executable, "-m", "benchmarks.profile_summary", *files, "--rate", os.environ.get("RATE", "997"),
                    "--requests", str(requests), "--top", "25", "--json", f"{out}/profile/{layer}_summary.json"])
PY
