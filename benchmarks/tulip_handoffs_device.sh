#!/usr/bin/env bash
# Tulip's own cost per request beside a fake device of 1.7 ms (the 0.6B's 1 x 128 step): inline launch off, on (gRPC stream), and the framed EmbedStream, alternating (~1.5 min)
# Carry .whl (tulip serve needs grpcio-health-checking). From the repository root:
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh tulip-handoffs
# Prints one table last; $OUT/tulip_handoffs.json.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
python3 -m benchmarks.tulip_handoffs --device-ms 1.7 --requests 400 --inflight 1,4,16 --repeat ${REPEAT:-3} \
  --model benchmarks/assets/minilm-l6 --env "TULIP_INLINE_LAUNCH=false" --env base --env "TULIP_FRAMED_PORT=51777" --json $OUT/tulip_handoffs.json 2>&1 | tail -8
