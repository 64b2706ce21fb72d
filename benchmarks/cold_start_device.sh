#!/usr/bin/env bash
# A replica's start on the Qwen3-0.6B config with an empty Triton cache: in-process without a kernel manifest, with one (its variants compiled ahead in worker processes, rose.kernel_ahead), with one but the workers off (ALL=1), and with the cache kept (INPROC=1); `rose build-kernels` on the GPU and with no GPU visible (an image build) and a start from that cache (BUILD=1); `ivy up` to ready fresh, with the manifest and kept (STACK=1); ROSE's GPU tests (TESTS=1) (~5 min with all).
# Carry .whl. From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh cold-start
# Results: $OUT/cold_start.json (every in-process start's phases), $OUT/start_to_ready.json, $OUT/cold_start_tests.log;
# prints one line per start.
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
status=0
dir=/tmp/m/qwen3-0.6b
zoo_folder qwen3-0.6b $dir || exit 1
rm -f $dir/rose_kernels.json $dir/rose_graphs.json
export TRITON_CACHE_DIR=/tmp/cold_start_triton
start() {  # start LABEL [VAR=VALUE ...]: one replica's start, its line and record
  local label=$1; shift
  env "$@" timeout 150 python3 -m benchmarks.cold_start --model-dir $dir --json /tmp/cold_$label.json 2>/tmp/cold_$label.err \
    | sed "s/^cold start:/$label:/" || { tail -5 /tmp/cold_$label.err; status=1; }
}
if [ "${INPROC:-1}" = 1 ]; then
  rm -rf $TRITON_CACHE_DIR; start fresh_no_manifest
  echo "manifest: $(python3 -c "import json; print(len(json.load(open('$dir/rose_kernels.json'))['kernels']))" 2>&1) variants"
  rm -rf $TRITON_CACHE_DIR; start fresh_manifest
  if [ "${ALL:-1}" = 1 ]; then
    rm -rf $TRITON_CACHE_DIR; start fresh_workers_off ROSE_KERNEL_COMPILE_WORKERS=0
    rm -rf $TRITON_CACHE_DIR; start fresh_manifest_again
  fi
  start kept
fi
if [ "${BUILD:-1}" = 1 ]; then
  rm -rf /tmp/bk /tmp/bk_cpu $dir/rose_kernels.json
  timeout 150 python3 -m rose.cli build-kernels $dir --cache-dir /tmp/bk 2>&1 | tail -4 || status=1
  CUDA_VISIBLE_DEVICES= timeout 150 python3 -m rose.cli build-kernels $dir --cache-dir /tmp/bk_cpu 2>&1 | tail -2 || status=1
  start from_image_cache TRITON_CACHE_DIR=/tmp/bk_cpu/triton ROSE_KERNEL_COMPILE_WORKERS=0
fi
python3 - <<'PY'
import glob, json, os
runs = {os.path.basename(p)[5:-5]: json.load(open(p)) for p in sorted(glob.glob("/tmp/cold_*.json"))}
json.dump(runs, open(os.path.join(os.environ["OUT"], "cold_start.json"), "w"), indent=1)
PY
unset TRITON_CACHE_DIR
if [ "${STACK:-1}" = 1 ]; then
  IVY_WORKERS=${IVY_WORKERS:-4} timeout 400 python3 -m benchmarks.stack.start_to_ready --model-dir $dir \
    --json $OUT/start_to_ready.json || status=1
fi
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TESTS_S:-150} python3 -m pytest -q -m gpu -p no:cacheprovider tests/rose/test_rose_gpu.py \
    tests/rose/test_rose_capture_gpu.py > $OUT/cold_start_tests.log 2>&1 || status=1
  tail -2 $OUT/cold_start_tests.log
fi
exit $status
