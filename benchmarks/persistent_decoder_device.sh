#!/usr/bin/env bash
# The persistent decoder (issue 14): a smoke run, GPU time per graph replay beside the layer-by-layer kernels at 16-128 tokens and a sweep of its tiles (MODEL=minilm-l6 for all-MiniLM's encoder; NO_SWEEP=1 skips the sweep, SWEEP=prefetch,keys keeps only the rows changing those fields; MODELS_BENCH=qwen3-0.6b,minilm-l6 runs the benchmark and phases for each; TILES=o=64,split_od=8 changes the fitted tiles of both), then its GPU tests; ENGINE=1 adds benchmarks.rose_gpu's rows of MODELS (qwen3-0.6b,minilm-l6) at 16-128 tokens (SUITES) with ROSE_PERSISTENT_DECODER off and at 128; TESTS=0 skips the smoke run and the tests, BENCH=0 the benchmark; PHASES=1 adds the kernel's own clock per phase, PROGRAMS=1 every program's clock (benchmarks.persistent_clock).
# Carry nothing (torch and Triton only; .whl when ENGINE=1). From the repository root. Timeouts: smoke 90 s, benchmark
# BENCH_TIMEOUT (360), phases 120, every program's clock 180, tests 480, engine 150 per flag; a call may run 600 s, so never TESTS=1 with
# BENCH=1 or ENGINE=1 (Triton's cache under /root stays while the machine is warm: a later call compiles less):
#   GIT_COMMIT=$(git rev-parse --short HEAD) PHASES=1 TESTS=0 bash benchmarks/device.sh persistent-decoder
#   GIT_COMMIT=... BENCH=0 TESTS=1 bash benchmarks/device.sh persistent-decoder
#   GIT_COMMIT=... MODEL=minilm-l6 NO_SWEEP=1 BENCH_TIMEOUT=120 PHASES=1 TESTS=0 ENGINE=1 bash benchmarks/device.sh ...
# Results in $OUT: persistent_decoder.json and .log, persistent_decoder_tests.log (the smoke run's lines first; and
# rose_gpu_persistent{0,128}.json and .log);
# the table last.
set -u
MODELS_BENCH=${MODELS_BENCH:-${MODEL:-qwen3-0.6b}}
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
t0=$(date +%s)
stamp() { echo "-- $1 rc=$2 ($(( $(date +%s) - t0 )) s)"; }
if [ "${TESTS:-1}" = 1 ]; then
timeout 90 python3 - <<'PY' > $OUT/persistent_decoder_tests.log 2>&1
import time, torch
from benchmarks.persistent_decoder import device_meta, random_qwen3
from rose.layers.persistent_decoder import PersistentDecoder
model = random_qwen3(layers=2)
meta = device_meta([128], 1000)
dec = PersistentDecoder(model)
with torch.inference_mode():
    for persistent in (False, True):
        t = time.perf_counter()
        out = dec(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids, persistent=persistent)
        torch.cuda.synchronize()
        print(f"persistent={persistent}: first call {time.perf_counter() - t:.1f} s, finite {bool(out.isfinite().all())}")
PY
rc=$?; stamp smoke $rc; tail -5 $OUT/persistent_decoder_tests.log
[ $rc -eq 0 ] || exit $rc
fi
rc=0
for model in ${MODELS_BENCH//,/ }; do  # each model's log named by it; MODEL's (the default) unsuffixed
[ "$model" = "${MODEL:-qwen3-0.6b}" ] && log=persistent_decoder || log=persistent_decoder_$model
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-360} python3 -m benchmarks.persistent_decoder --out $OUT ${TOKENS:+--tokens $TOKENS} --model $model \
    ${TILES:+--tiles $TILES} ${NO_SWEEP:+--no-sweep} ${SWEEP:+--sweep $SWEEP} > $OUT/$log.log 2>&1
  rc=$?; stamp "benchmark $model" $rc
fi
if [ "${PHASES:-0}" = 1 ]; then
  timeout 120 python3 -m benchmarks.persistent_decoder --phases --tokens ${TOKENS:-16,64,128} --out $OUT \
    --model $model ${TILES:+--tiles $TILES} > $OUT/${log}_phases.log 2>&1
  stamp "phases $model" $?; tail -5 $OUT/${log}_phases.log
fi
if [ "${PROGRAMS:-0}" = 1 ]; then
  timeout 180 python3 -m benchmarks.persistent_clock --tokens ${TOKENS:-16,64,128} --out $OUT \
    --model $model ${TILES:+--tiles $TILES} > $OUT/${log}_clock.log 2>&1
  stamp "every program's clock $model" $?; tail -40 $OUT/${log}_clock.log
fi
done
if [ "${TESTS:-1}" = 1 ]; then
  timeout 480 python3 -m pytest -q -m gpu tests/rose/test_rose_persistent_decoder_gpu.py \
    tests/rose/test_rose_persistent_phases_gpu.py \
    "tests/rose/test_rose_backend_parity_gpu.py::test_persistent_decoder_parity_with_transformers" \
    >> $OUT/persistent_decoder_tests.log 2>&1
  stamp tests $?; tail -4 $OUT/persistent_decoder_tests.log
fi
if [ "${ENGINE:-0}" = 1 ]; then
  for flag in 0 128; do
    ROSE_PERSISTENT_DECODER=$flag timeout 150 python3 -m benchmarks.rose_gpu --models ${MODELS:-qwen3-0.6b,minilm-l6} \
      --variants rose-graphs \
      --quick --suites ${SUITES:-bs1-16,bs1-32,bs1-64,bs1-128} --tag _persistent$flag --out $OUT \
      > $OUT/rose_gpu_persistent$flag.log 2>&1
    stamp "rose_gpu ROSE_PERSISTENT_DECODER=$flag" $?; grep -E '^(qwen3|minilm)' $OUT/rose_gpu_persistent$flag.log | tail -6
  done
fi
[ "${BENCH:-1}" = 1 ] && for f in $OUT/persistent_decoder*.log; do case $f in *_phases.log|*_clock.log|*_tests.log) ;; *)
  grep -A40 'weight-read floor' $f | tail -40 ;; esac; done
exit $rc
