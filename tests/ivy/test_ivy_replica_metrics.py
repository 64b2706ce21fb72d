"""A Tulip replica that left the headless Service's DNS (a rolled or scaled-down pod: its IP is gone for good)
leaves no `ivy_replica_up` series behind, with one gateway worker and with several (prometheus-client's
multiprocess mode, where a labelled child cannot be removed). A series stuck at 0 there would read as a
replica down and fire the TulipReplicaDown alert (`max by (replica) (ivy_replica_up) == 0` for 2 min,
deploy/k8s/monitoring.yaml) after every Tulip rollout, until the gateway restarts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SCRIPT = r"""
import asyncio, socket, time

from prometheus_client.parser import text_string_to_metric_families

from fake_tulip import FakeTulip
from ivy import metrics
from ivy.replicas import Expected, ReplicaPool, State

NAME = "tulip-headless.ns.svc"


def up_series() -> dict[str, float]:
    data, _ = metrics.render()
    return {s.labels["replica"]: s.value for family in text_string_to_metric_families(data.decode())
            for s in family.samples if s.name == "ivy_replica_up"}


async def until(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.01)


with FakeTulip() as a, FakeTulip() as b:
    ports = [a.port, b.port]

    def resolver(host, port, type=0, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p)) for p in ports]

    async def run():
        expected = Expected(frozenset({a.model_id}), a.fingerprint, a.spec.dimensions, a.spec.max_length)
        pool = ReplicaPool((f"dns:///{NAME}:50051",), expected, health_interval_s=0.05,
                           max_message_bytes=1 << 24, resolver=resolver)
        await pool.start()
        try:
            await until(lambda: [r.state for r in pool.replicas] == [State.SERVING] * 2)
            assert up_series() == {a.address: 1.0, b.address: 1.0}, up_series()
            ports[:] = [b.port]  # a's pod is gone (rolled: a new IP; or scaled down)
            await until(lambda: [r.address for r in pool.replicas] == [b.address] and not pool._leaving)
            series = up_series()
            down = sorted(r for r, v in series.items() if v == 0)
            assert down == [], f"a replica gone from DNS still reads as down: {series}"
            assert series == {b.address: 1.0}, series
        finally:
            await pool.close()

    asyncio.run(run())
print("ok")
"""


@pytest.mark.parametrize("mode", ["one worker", "several workers"])
def test_a_replica_gone_from_dns_leaves_no_down_series(mode: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    if mode == "several workers":  # what `ivy serve` sets before starting its uvicorn workers (ivy/cli.py)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
