#!/usr/bin/env bash
# The stack's layers apart on the Qwen3-0.6B config (random bf16; MODEL=minilm-l6 or another benchmarks.model_zoo name: that one): STEP=layers (default) runs ROSE's GPU tests, then ivy-text, ivy-ids, tulip-grpc and in-process on the same requests in one run; STEP=ab runs stack A/Bs (stream vs unary, idle capture, Tulips per GPU); STEP=commits runs an older commit's services beside this tree's.
# Carry .whl (STEP=commits: .whl and .base). From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh stack-layers     # STEP=layers (GPU_TESTS=0: no tests; SUITES=embed-latency,concurrency: those only)
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh stack-ab         # STEP=ab
#   BASE=48731df; rm -rf .base && mkdir .base && git archive $BASE ivy tulip rose protos | tar -x -C .base
#   (STEP=commits took ~8 min on an H100 host with every layer and level: LAYERS, EMBED and LEVELS narrow it)
#   GIT_COMMIT=$(git rev-parse --short HEAD) BASE_COMMIT=$BASE bash benchmarks/device.sh stack-commits
# Prints one table last. Results: $OUT/host_probe.txt (Ivy's app alone on this host, every step),
# $OUT/stack_layers_qwen3-0.6b.json + .png (STEP=layers),
# $OUT/stack_ab_qwen3-0.6b.tgz (STEP=ab: each variant's stack_layers_qwen3-0.6b_<variant>.json; their PNGs are dropped),
# $OUT/stack_commits_qwen3-0.6b.tgz (STEP=commits: stack_layers_qwen3-0.6b_{base,head}{1,2}.json, PNGs dropped: a
# call returns at most 8 files; the same client, this tree's, against `ivy up` from .base and from this tree,
# alternating twice; ivy-text, ivy-ids and tulip-grpc at 1 x 128, 1 x 4096 and 1-16 clients),
# $OUT/stack_layers_qwen3-0.6b_{grpc,framed}{1,2}.json (STEP=framed: `ivy up --framed false` vs `ivy up`, the same way).
# TOKENIZER=qwen-bpe (any step; default wordpiece, MiniLM's): the folder carries a Qwen3-style byte-level BPE trained
# on the corpus (benchmarks.model_zoo --tokenizer qwen-bpe), at /tmp/m/qwen3-0.6b-bpe with /tmp/ref_qwen3-0.6b-bpe.json;
# served under its folder's name, so the results above read stack_layers_qwen3-0.6b-bpe*.json.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
export TULIP_GRAPH_MANIFEST=off  # Ivy's workers: the default (auto: 4 on the 16-core host) unless IVY_WORKERS is set
echo "ivy workers: ${IVY_WORKERS:-auto = $(python3 -c 'from ivy.config import auto_workers; print(auto_workers())')}"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tokenizer=${TOKENIZER:-wordpiece} model=${MODEL:-qwen3-0.6b}
name=$model; [ "$tokenizer" = wordpiece ] || name=$model-${tokenizer#qwen-}  # the served name: the folder's
dir=/tmp/m/$name
if [ ! -f $dir/config.json ]; then
  python3 -m benchmarks.model_zoo $model $dir --dtype bfloat16 --tokenizer $tokenizer 2>&1 | grep -v Writing | tail -1
fi
[ -f /tmp/ref_$name.json ] || python3 -m benchmarks.stack.reference --model-dir $dir --out /tmp/ref_$name.json \
  --device cuda --dtype float32 2>&1 | tail -1
echo "model and reference ready ($(el) s)"
# The host's own CPU speed for the harness, before any stack runs: Ivy's app alone on a 128-token request (no sockets,
# a pool that costs nothing; ~285-310 µs a request on the project's CPU VM). H100 starts have differed ~2 x here.
# Then 4096 tokens (text-pool: IVY_TOKENIZE_WARM_INLINE=false; 640 / 879 / 1297 µs ids / text / text-pool on the VM).
probe() {  # probe TOKENS PER_ROUND: one line of medians, appended with its output to host_probe.txt
  local log=/tmp/host_probe_$1.txt
  timeout 90 python3 -m benchmarks.ivy_text_path --model $dir --tokens $1 --rounds 2 --per-round $2 > $log 2>&1
  local rc=$?
  echo "host probe (Ivy's app alone, µs a request), $1 tokens: $(grep -E '^(text|text-pool|ids) +median' $log \
    | awk '{print $1, $3}' | xargs) (rc=$rc)"
  { echo "== $1 tokens"; cat $log; } >> $OUT/host_probe.txt
}
probe 128 500
# the long probe at 4096 tokens or the model's max length, whichever is less (all-MiniLM: 512)
probe $(python3 -c "from rose.spec import load_spec; print(min(4096, load_spec('$dir').max_length))") 200
# The exchange around the app (sockets and wake-ups: a host whose app probe read faster than the VM still gave Ivy
# 0.49-0.64 ms of its own a request at 2bf6598): the framed and gRPC hops with no work behind them (VM: 0.127 / 0.401 ms).
timeout 60 python3 -m benchmarks.transport_floor --requests 1000 --inflight 1 --transports framed,grpc \
  > /tmp/host_probe_hop.txt 2>&1
echo "host probe, the hop alone (p50 ms): $(awk '$2 == 1 {print $1, $3}' /tmp/host_probe_hop.txt | xargs)"
{ echo "== the hop alone"; cat /tmp/host_probe_hop.txt; } >> $OUT/host_probe.txt
# And the HTTP server's own floor (uvicorn with a bare ASGI app, and a bare httptools protocol; VM: 112 / 28 µs p50,
# 87 / 20 µs of the server's CPU a request).
timeout 60 python3 -m benchmarks.http_floor --requests 2000 --repeat 2 > /tmp/host_probe_http.txt 2>&1
echo "host probe, HTTP alone (p50 µs, server CPU µs): $(awk 'NR > 1 {print $1, $2, $4}' /tmp/host_probe_http.txt | xargs)"
{ echo "== HTTP alone"; cat /tmp/host_probe_http.txt; } >> $OUT/host_probe.txt

# start_stack LABEL [VAR=value ...] [ivy up flags ...]: `ivy up` in the background, until /ready.
start_stack() {
  local label=$1; shift
  env "$@" --model $dir --port 8080 --tulip-port 50051 > /tmp/up_$label.log 2>&1 &
  up=$!
  for i in $(seq 1 150); do curl -sf http://127.0.0.1:8080/ready > /dev/null && break; sleep 1; done
  echo "== $label ready after $i s ($(el) s)"
}
stop_stack() { kill -TERM $up; wait $up; tail -1 /tmp/up_$1.log; }

layers() {  # layers LABEL METRICS_URLS [benchmarks.stack.layers flags...]
  local label=$1 metrics=$2; shift 2
  python3 -m benchmarks.stack.layers --url http://127.0.0.1:8080 --tulip 127.0.0.1:50051 --model-dir $dir \
    --model $name --reference /tmp/ref_$name.json --out $OUT --client-cpus 8-15 --gpus 1 --gpu-hour-price 3.5 \
    --server-metrics $metrics ${label:+--label $label} "$@" 2>> $OUT/stack_layers.log
  echo "   layers $label rc=$? ($(el) s)"
}

metrics1=http://127.0.0.1:50151/metrics
if [ "${STEP:-layers}" = layers ]; then
  if [ "${GPU_TESTS:-1}" = 1 ]; then  # GPU_TESTS=0: the layers alone (a tree whose ROSE is unchanged)
    timeout 300 python3 -m pytest -q -m gpu tests/rose -p no:cacheprovider > $OUT/gpu_tests.log 2>&1  # 215 s on a warm H100, ~235 cold
    echo "gpu tests rc=$? ($(el) s)"; tail -2 $OUT/gpu_tests.log
  fi
  start_stack layers python3 -m ivy up
  layers "" $metrics1 --suite ${SUITES:-all} --inprocess true --duration-s ${DURATION:-2}
  stop_stack layers
elif [ "${STEP}" = commits ]; then
  [ -f .base/ivy/__init__.py ] || { echo "no .base tree in this call: carry .base (see this script's header)" >&2; exit 1; }
  echo "base ${BASE_COMMIT:-?} (.base) vs head $GIT_COMMIT (this tree)"
  for round in 1 2; do
    for side in base head; do
      path=$PWD; [ $side = base ] && path=$PWD/.base
      cd $path  # `python3 -m` puts the working directory first on sys.path: the side's own packages
      # warm cores off on both sides: the code is compared, not the host's cores (the flag is auto since 817e29d)
      start_stack $side$round PYTHONPATH=/tmp/site:$path IVY_UP_WARM_CORES=off python3 -m ivy up
      cd - > /dev/null
      layers $side$round $metrics1 --layers ${LAYERS:-ivy-text,ivy-ids,tulip-grpc} --suite embed-latency,concurrency \
        --embed-tokens ${EMBED:-128,4096} --concurrency-levels ${LEVELS:-1,2,4,8,16} --duration-s ${DURATION:-2}
      stop_stack $side$round
    done
  done
elif [ "${STEP}" = framed ]; then
  # The framed EmbedStream (ivy up's default) beside the gRPC stream (--framed false), alternating twice: the same client, the
  # Tulip-direct layer over the framed port (--tulip-call framed) or the gRPC stream.
  for round in 1 2; do
    for side in grpc framed; do
      flags=(--framed false); call=stream  # `ivy up` serves the framed EmbedStream by default
      [ $side = framed ] && { flags=(--framed true); call=framed; }
      start_stack $side$round python3 -m ivy up "${flags[@]}"
      layers $side$round $metrics1 --layers ivy-text,ivy-ids,tulip-grpc --tulip-call $call \
        --suite embed-latency,concurrency --embed-tokens 128,4096 --duration-s ${DURATION:-2}
      stop_stack $side$round
    done
  done
else
  # VARIANTS: ';'-separated, each "LABEL [VAR=value ...] [ivy up flags ...]"; LAYERS, SUITES, EMBED (token
  # counts of embed-latency), LEVELS, DURATION and TULIP_CALL (stream | unary | framed) choose the measurement
  IFS=';' read -ra variants <<< "${VARIANTS:-stream;unary IVY_GRPC_STREAM=false;idle1 TULIP_IDLE_CAPTURE_MS=1;tulips2 --tulips-per-gpu 2}"
  for variant in "${variants[@]}"; do
    set -- $variant
    label=$1; shift
    envs=() flags=() metrics=$metrics1
    for a in "$@"; do case $a in *=*) envs+=("$a") ;; *) flags+=("$a") ;; esac; done
    case " ${flags[*]:-} " in *" --tulips-per-gpu "[2-9]" "*)  # every replica's counters (ports 50151, 50152, ...)
      n="${flags[*]}"; n=${n##*--tulips-per-gpu }; n=${n%% *}
      for i in $(seq 2 $n); do metrics=$metrics,http://127.0.0.1:$((50150 + i))/metrics; done ;;
    esac
    start_stack $label "${envs[@]}" python3 -m ivy up "${flags[@]}"
    layers $label $metrics --layers ${LAYERS:-ivy-text} --suite ${SUITES:-embed-latency,concurrency} \
      --embed-tokens ${EMBED:-128,4096} --concurrency-levels ${LEVELS:-1,2,4,8,16} --duration-s ${DURATION:-3} \
      ${TULIP_CALL:+--tulip-call $TULIP_CALL}
    stop_stack $label
  done
fi
cat /tmp/up_*.log >> $OUT/stack_layers.log
rm -f $OUT/*_inputs.json
python3 - <<'PY'
import glob, json, os
from benchmarks.stack.server_counters import describe
def timing(r):  # the server's own account, p50 ms: Ivy's whole and tokenizing, Tulip's queue, inference, whole
    t = r.get("server_timing_p50_ms") or {}
    names = {"ivy_total": "ivy", "tokenization": "tok", "queue": "q", "inference": "inf", "batcher": "tulip"}
    cpu = f" client-cpu {r['client_cpu_p50_ms']:.3f}" if r.get("client_cpu_p50_ms") is not None else ""
    return ("  |" + " ".join(f"{n} {t[k]:.3f}" for k, n in names.items() if k in t) + cpu) if t or cpu else ""
print(f"{'file':34s} {'layer':10s} {'suite':14s} {'param':>5s} {'p50':>7s} {'p95':>7s} {'p99':>7s} {'req/s':>8s} {'k tok/s':>8s} "
      f"{'cold':>5s} {'st.p99':>7s}  server")
for path in sorted(glob.glob(os.environ["OUT"] + "/stack_layers_*.json")):
    name = os.path.basename(path)[:-5]
    for r in json.load(open(path))["records"]:
        if r.get("error"):
            print(f"{name:34s} {r.get('layer', ''):10s} {r['suite']:14s} {str(r.get('param')):>5s} ERROR {r['error'][:60]}")
            continue
        print(f"{name:34s} {r.get('layer', ''):10s} {r['suite']:14s} {r['param']:>5} {r['p50_ms']:7.2f} {r['p95_ms']:7.2f} "
              f"{r['p99_ms']:7.2f} {r['rps']:8.1f} {r['tokens_per_s'] / 1e3:8.1f} {r.get('cold_requests', 0):5d} "
              f"{r.get('steady_p99_ms') or 0:7.2f}  {describe(r.get('server') or {})}{timing(r)}")
PY
case "${STEP:-layers}" in ab|commits)  # a call returns at most 8 files: the runs' JSON files in one archive
  (cd $OUT && rm -f stack_layers_${name}_*.png && tar czf stack_${STEP}_$name.tgz stack_layers_${name}_*.json \
    && rm -f stack_layers_${name}_*.json) ;;
esac
echo "done in $(el) s"
