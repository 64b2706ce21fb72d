#!/usr/bin/env bash
# GPU time per kernel class (benchmarks.rose_breakdown) of MODELS (qwen3-0.6b) at TOKENS (4096) with the environment variable VAR (ROSE_TRITON_ATTENTION_TMA) at each of VALUES ("0 auto"), alternating ROUNDS (2) times: where an A/B's kernel saving goes in the forward. Carry .whl; ~2 min.
# Writes $OUT/breakdown_ab.tar (each run's folder: rose_breakdown.json and .log, appended as it ends); prints each
# run's table.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh breakdown-ab
set -u
source "$(dirname "$0")/device_env.sh" || exit 1
require_carried .whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
var=${VAR:-ROSE_TRITON_ATTENTION_TMA}
for round in $(seq "${ROUNDS:-2}"); do
  for value in ${VALUES:-0 auto}; do
    name=breakdown_${value}_$round
    mkdir -p "$OUT/$name"
    env "$var=$value" timeout 150 python3 -m benchmarks.rose_breakdown --models "${MODELS:-qwen3-0.6b}" \
      --tokens "${TOKENS:-4096}" --out "$OUT/$name" > "$OUT/$name/rose_breakdown.log" 2>&1
    echo "round $round $var=$value rc=$?"; tail -"${TAIL:-8}" "$OUT/$name/rose_breakdown.log"
    tar rf "$OUT/breakdown_ab.tar" -C "$OUT" --remove-files "$name"
  done
done
