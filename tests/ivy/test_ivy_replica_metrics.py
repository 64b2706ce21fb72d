"""A Tulip replica that left the headless Service's DNS (a rolled or scaled-down pod: its IP is gone for good)
leaves no series behind (RELIABILITY 50), with one gateway worker and with several (prometheus-client's
multiprocess mode, where a labelled child cannot be removed). An `ivy_replica_up` series stuck at 0 would read
as a replica down and fire the TulipReplicaDown alert (`max by (replica) (ivy_replica_up) == 0` for 2 min,
deploy/k8s/monitoring.yaml) after every Tulip rollout, until the gateway restarts; the per-replica chunk,
latency and outstanding-token series of every pod IP ever seen grew without bound with rolling Tulip pods."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_tulip import FakeTulip, wait_until
from ivy import metrics
from ivy.replicas import Expected, ReplicaPool, State
from ivy_testkit import ivy_process
from raw_sockets import embed_once

HERE = Path(__file__).resolve().parent

NAME = "tulip-headless.ns.svc"

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


# `ivy serve`'s processes (its uvicorn workers too: they inherit PYTHONPATH) resolve the test's name from a file
# the test rewrites, as a headless Service's records change when a pod rolls.
SITECUSTOMIZE = """
import os, socket

_getaddrinfo = socket.getaddrinfo


def getaddrinfo(host, port, *args, **kwargs):
    if host != os.environ["TEST_DNS_NAME"]:
        return _getaddrinfo(host, port, *args, **kwargs)
    with open(os.environ["TEST_DNS_FILE"]) as records:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", int(p))) for p in records.read().split()]


socket.getaddrinfo = getaddrinfo
"""


def _replica_labels(port: int, sample: str | None = None) -> set[str]:
    """The replica addresses /metrics names (in `sample`'s series, or in any)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.labels["replica"] for family in text_string_to_metric_families(text) for s in family.samples
            if "replica" in s.labels and (sample is None or s.name == sample)}


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_replica_gone_from_dns_leaves_metrics_within_a_health_round(workers: str, tmp_path: Path) -> None:
    """RELIABILITY 50: a real `ivy serve` routes chunks to two replicas of a DNS name; one leaves the records and,
    within a few health rounds, /metrics names it in no series (chunks, latency, outstanding tokens, up), with
    one worker (its children removed) and with two (multiprocess files, where they cannot be: left out)."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    records = tmp_path / "records"
    with FakeTulip() as a, FakeTulip() as b:
        records.write_text(f"{a.port} {b.port}")
        env = dict(IVY_REPLICAS_DNS=f"{NAME}:50051", IVY_WORKERS=workers, IVY_HEALTH_INTERVAL_S="0.2",
                   TEST_DNS_NAME=NAME, TEST_DNS_FILE=str(records),
                   PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
        with ivy_process(**env) as port:
            both = {a.address, b.address}
            wait_until(lambda: embed_once(port)[0] == 200 and _replica_labels(port, "ivy_chunks_total") == both,
                       timeout=30)
            assert _replica_labels(port) == both
            records.write_text(f"{b.port}")  # a's pod is gone
            wait_until(lambda: a.address not in _replica_labels(port), timeout=10)
            assert embed_once(port)[0] == 200
            assert _replica_labels(port, "ivy_chunks_total") == {b.address}


def test_a_replica_back_in_dns_before_its_old_self_closed_keeps_its_series() -> None:
    """RELIABILITY 50: a pod IP that leaves the records and comes back (reused) while its old replica still
    finishes a call is the same series: the old one's forgetting, once its call is answered, must not remove the
    series the new replica counts into (with one worker they would be gone from /metrics for good); an address
    that did not come back is forgotten. The pool's own step (_close_when_idle), driven directly: the same
    scenario through live DNS and a call held on the old replica left that call unanswered (and the pool's close
    waiting) in about 1 of 75 runs on a loaded 2-core VM, cause not found; that is not what this checks."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        pytest.skip("in-process registry needed")

    def series(name: str) -> dict[str, float]:
        text = metrics.render()[0].decode()
        return {s.labels["replica"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == name}

    async def run() -> None:
        expected = Expected(frozenset({"m"}), "", 8, 16)
        pool = ReplicaPool((f"dns:///{NAME}:50051",), expected, health_interval_s=60, max_message_bytes=1 << 20)
        back, gone = "127.0.0.1:59001", "127.0.0.1:59002"
        old_back, old_gone, new_back = pool._new(back), pool._new(gone), pool._new(back)
        for address in (back, gone):
            metrics.REPLICA_UP.labels(address).set(1)
            metrics.CHUNKS.labels(address).inc(2)
        pool.replicas = [new_back]  # `back` resolved again while its old self was leaving; `gone` did not
        for old in (old_back, old_gone):
            pool._leaving[old] = asyncio.current_task()
            await pool._close_when_idle(old)  # no tokens in flight: forgets (or not) and closes at once
        assert series("ivy_chunks_total").get(back) == 2 and series("ivy_replica_up").get(back) == 1.0
        assert gone not in series("ivy_chunks_total") and gone not in series("ivy_replica_up")
        assert not pool._leaving
        await pool.close()

    asyncio.run(run())


def test_a_forgotten_replica_marked_down_later_stays_out_of_metrics() -> None:
    """RELIABILITY 50: a replica that left DNS is forgotten after the leave's grace even with a call still open
    (a hung pod); that call failing afterwards (its stream closed) marked it down, which set its up gauge again:
    the series came back at 0, for good, and TulipReplicaDown fired for a pod long gone."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        pytest.skip("in-process registry needed")

    def up() -> dict[str, float]:
        text = metrics.render()[0].decode()
        return {s.labels["replica"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "ivy_replica_up"}

    async def run() -> None:
        expected = Expected(frozenset({"m"}), "", 8, 16)
        pool = ReplicaPool((f"dns:///{NAME}:50051",), expected, health_interval_s=60, max_message_bytes=1 << 20)
        gone = "127.0.0.1:59003"
        old = pool._new(gone)
        metrics.REPLICA_UP.labels(gone).set(1)
        pool.replicas = []
        pool._leaving[old] = asyncio.current_task()
        await pool._close_when_idle(old)
        assert gone not in up()
        old.mark_down("UNAVAILABLE: its call failed after it was forgotten")
        old.set_state(State.SERVING)
        assert gone not in up()
        await pool.close()

    asyncio.run(run())


def test_a_dead_workers_live_gauges_do_not_keep_a_gone_replica(tmp_path) -> None:
    """RELIABILITY 50 with a worker that died (uvicorn restarts a killed or crashed one): its live gauges' file
    still said ivy_replica_up 1 for the address, so the max over workers kept every series of a replica gone
    from DNS in /metrics for good. A scrape drops the live files of processes no longer alive."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    address = "10.9.8.7:50051"
    dead = ("from ivy import metrics; "
            f"metrics.REPLICA_UP.labels({address!r}).set(1); metrics.CHUNKS.labels({address!r}).inc(3)")
    subprocess.run([sys.executable, "-c", dead], env=env, check=True, timeout=60)  # a worker, then gone
    alive = ("from ivy import metrics; "
             f"metrics.REPLICA_UP.labels({address!r}).set(1); metrics.forget_replica({address!r}); "
             "print(metrics.render()[0].decode())")
    out = subprocess.run([sys.executable, "-c", alive], env=env, check=True, timeout=60, capture_output=True,
                         text=True).stdout
    assert "ivy_replica_up" in out and address not in out, [line for line in out.splitlines() if address in line]
