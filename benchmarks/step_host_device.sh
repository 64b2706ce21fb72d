#!/usr/bin/env bash
# ROSE's host time per step, phase by phase (benchmarks.step_host), on the Qwen3-0.6B config: an older tree's ROSE (.base, BASE_COMMIT) beside this tree's, alternating twice.
# Carry .whl and .base. From the repository root:
#   BASE=75cbcfc; rm -rf .base && mkdir .base && git archive $BASE ivy tulip rose protos | tar -x -C .base
#   GIT_COMMIT=$(git rev-parse --short HEAD) BASE_COMMIT=$BASE bash benchmarks/device.sh step-host
# Results: $OUT/step_host_{base,head}{1,2}.json; prints each run's table. Each round runs base first, then head.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
[ -f .base/rose/__init__.py ] || { echo "no .base tree in this call: carry .base (see this script's header)" >&2; exit 1; }
head=$PWD
dir=/tmp/m/qwen3-0.6b
[ -f $dir/config.json ] || python3 -m benchmarks.model_zoo qwen3-0.6b $dir --dtype bfloat16 2>&1 | grep -v Writing | tail -1
status=0
for round in 1 2; do
  for side in base head; do
    path=$head; [ $side = base ] && path=$head/.base
    commit=$GIT_COMMIT; [ $side = base ] && commit=${BASE_COMMIT:-?}
    echo "== $side$round ($commit)"
    cd $path  # `python3 -m` puts the working directory first on sys.path: the side's own rose
    GIT_COMMIT=$commit PYTHONPATH=/tmp/site:$path:$head timeout 120 python3 -m benchmarks.step_host --model-dir $dir \
      --iters ${ITERS:-400} --json $OUT/step_host_$side$round.json > /tmp/step_host.log 2>&1
    rc=$?; tail -15 /tmp/step_host.log; [ $rc = 0 ] || { echo "step_host $side$round failed: rc=$rc"; status=$rc; }
    cd $head
  done
done
exit $status
