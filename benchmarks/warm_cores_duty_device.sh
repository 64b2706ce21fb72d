#!/usr/bin/env bash
# What the warm-cores loops cost on the H200 host: `ivy up` with its default (--warm-cores auto) on the Qwen3-0.6B config, then benchmarks.warm_cores_duty (the loops' CPU idle, serving one client at 1 x 128 ids, and after) (~1 min; carry .whl).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
require_carried .whl
dir=/tmp/m/qwen3-0.6b
zoo_folder qwen3-0.6b $dir || exit 1
grep -qw hypervisor /proc/cpuinfo && echo "cpu flags: hypervisor (a virtual machine)" || echo "cpu flags: no hypervisor"
TULIP_GRAPH_MANIFEST=off python3 -m ivy up --model $dir --served-model-name qwen3-0.6b --port 8080 --tulip-port 50051 \
  > /tmp/up_duty.log 2>&1 &
up=$!
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8080/ready > /dev/null && break; sleep 1; done
echo "ready after $i s"; grep -h "warm\|kept" /tmp/up_duty.log
python3 -m benchmarks.warm_cores_duty --url http://127.0.0.1:8080 --model qwen3-0.6b --serve-s ${SERVE_S:-5} \
  --idle-s ${IDLE_S:-5}
kill -TERM $up; wait $up
