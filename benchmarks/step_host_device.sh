#!/usr/bin/env bash
# ROSE's host time per step, phase by phase (benchmarks.step_host): this tree alone for each of MODELS (default qwen3-0.6b), or, when .base is carried, an older tree's ROSE (BASE_COMMIT) beside this tree's on each model, alternating twice.
# Carry .whl (and .base for the A/B). From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) MODELS=qwen3-0.6b,minilm-l6 bash benchmarks/device.sh step-host
#   BASE=75cbcfc; rm -rf .base && mkdir .base && git archive $BASE ivy tulip rose protos | tar -x -C .base
#   GIT_COMMIT=$(git rev-parse --short HEAD) BASE_COMMIT=$BASE bash benchmarks/device.sh step-host
# then, here: python -m benchmarks.step_host_compare FOLDER [FOLDER ...] (the rounds side by side, medians)
# Results: $OUT/step_host_<model>.json (this tree alone) or $OUT/step_host_<model>_{base,head}{1,2}.json (the A/B);
# prints each run's table. In the A/B each round runs base first, then head.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
head=$PWD
IFS=',' read -r -a models <<< "${MODELS:-qwen3-0.6b}"
for model in "${models[@]}"; do zoo_folder "$model" "/tmp/m/$model" || exit 1; done

# one_run SIDE_PATH COMMIT MODEL JSON: benchmarks.step_host on that tree's rose; prints its table
one_run() {
  cd "$1"  # `python3 -m` puts the working directory first on sys.path: the side's own rose
  GIT_COMMIT=$2 PYTHONPATH=/tmp/site:$1:$head timeout 120 python3 -m benchmarks.step_host --model-dir /tmp/m/$3 \
    --iters ${ITERS:-400} --json "$4" > /tmp/step_host.log 2>&1
  local rc=$?
  tail -15 /tmp/step_host.log
  cd "$head"
  return $rc
}

status=0
if [ ! -f .base/rose/__init__.py ]; then  # this tree alone, each model
  for model in "${models[@]}"; do
    echo "== $model ($GIT_COMMIT)"
    one_run "$head" "$GIT_COMMIT" "$model" "$OUT/step_host_$model.json" || { echo "step_host $model failed"; status=1; }
  done
  exit $status
fi
for round in 1 2; do
  for model in "${models[@]}"; do
    for side in base head; do
      path=$head; [ $side = base ] && path=$head/.base
      commit=$GIT_COMMIT; [ $side = base ] && commit=${BASE_COMMIT:-?}
      echo "== $side$round ($commit, $model)"
      one_run "$path" "$commit" "$model" "$OUT/step_host_${model}_$side$round.json" \
        || { echo "step_host $model $side$round failed"; status=1; }
    done
  done
done
exit $status
