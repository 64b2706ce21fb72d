#!/usr/bin/env bash
# Programmatic dependent launch for ROSE's Triton kernels (rose/layers/launch.py): the kernel-edge costs (benchmarks.kernel_edges), ModelRunner.step() on the Qwen3-0.6B config with ROSE_PROGRAMMATIC_LAUNCH off and on alternating twice (benchmarks.step_host), then the GPU tests with it on (~8 min).
# Carry .whl. From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh programmatic-launch
# Results: $OUT/kernel_edges.json, $OUT/step_host_pdl{0,1}_{1,2}.json, $OUT/programmatic_launch_tests.log; prints
# the step A/B's table last.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
status=0
dir=/tmp/m/qwen3-0.6b
zoo_folder qwen3-0.6b $dir || exit 1
timeout 150 python3 -m benchmarks.kernel_edges --json $OUT/kernel_edges.json || { echo "kernel_edges failed"; status=1; }
for round in 1 2; do
  for pdl in 0 1; do
    echo "== ROSE_PROGRAMMATIC_LAUNCH=$pdl, round $round"
    ROSE_PROGRAMMATIC_LAUNCH=$pdl timeout 120 python3 -m benchmarks.step_host --model-dir $dir --iters ${ITERS:-300} \
      --json $OUT/step_host_pdl${pdl}_$round.json > /tmp/step_host.log 2>&1 || { tail -5 /tmp/step_host.log; status=1; }
  done
done
ROSE_PROGRAMMATIC_LAUNCH=1 timeout ${TESTS_S:-200} python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
  tests/rose/test_rose_programmatic_launch.py tests/rose/test_rose_fused.py tests/rose/test_rose_triton_attention.py \
  tests/rose/test_rose_gpu.py tests/rose/test_rose_decoders_gpu.py > $OUT/programmatic_launch_tests.log 2>&1
rc=$?; echo "GPU tests with PDL on: rc=$rc"; tail -3 $OUT/programmatic_launch_tests.log; [ $rc = 0 ] || status=$rc
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
print("step_host p50 µs (host to host / one replay's GPU time), PDL off vs on, two rounds")
rows = {}
for rnd in (1, 2):
    for pdl in (0, 1):
        try:
            res = json.load(open(f"{out}/step_host_pdl{pdl}_{rnd}.json"))["results"]
        except OSError:
            continue
        for shape, r in res.items():
            rows.setdefault(shape, []).append(f"{'on ' if pdl else 'off'} {r['host_to_host']['p50_us']:7.1f} / {r['gpu']['p50_us']:7.1f}")
for shape, cells in rows.items():
    print(f"  {shape:8s} " + "   ".join(cells))
PY
exit $status
