"""Two real Tulip replicas behind one gateway: they share the load, and killing one mid-stream loses no request."""

from __future__ import annotations

import signal
import threading

import httpx
import numpy as np
import pytest

from stack_testkit import free_port, http_status, ivy, metric_values, tulip

pytestmark = pytest.mark.slow

TEXTS = [f"request text {i}: replicas share the work of embedding sentences" for i in range(8)]


@pytest.fixture(scope="module")
def two_replicas():
    ports = [free_port(), free_port()]
    # Skip the full-budget warm-up batch: on a 2-core CI machine it dominates start-up and proves nothing here.
    replicas = [tulip(p, env={"TULIP_WARMUP_FULL_BATCH": "false"}) for p in ports]
    gateway_port = free_port()
    # A long probe interval: the killed replica is found by the requests that fail on it, not by a probe.
    gateway = ivy("serve", "--port", str(gateway_port), "--replicas", ",".join(f"127.0.0.1:{p}" for p in ports),
                  "--chunk-max-seqs", "2", "--health-interval-s", "30")
    base = f"http://127.0.0.1:{gateway_port}"
    try:
        # 200 comes with one replica serving (RELIABILITY 29); "ready", not "degraded", once both do
        gateway.wait_for(lambda: http_status(f"{base}/ready") == 200 and
                         httpx.get(f"{base}/ready").json()["status"] == "ready", "both replicas ready behind ivy")
        yield base, replicas
    finally:
        gateway.stop()
        for r in replicas:
            r.stop()


def _chunks_per_replica(base: str) -> dict[str, float]:
    return metric_values(httpx.get(f"{base}/metrics").text, "ivy_chunks_total")


def test_load_is_shared_and_a_killed_replica_loses_nothing(two_replicas) -> None:
    base, (doomed, survivor) = two_replicas
    with httpx.Client(timeout=60) as client:
        expected = np.array([d["embedding"] for d in client.post(f"{base}/v1/embeddings",
                                                                 json={"input": TEXTS}).json()["data"]])
    statuses: list[int] = []
    mismatches: list[int] = []
    done = threading.Semaphore(0)
    stop = threading.Event()

    def client_loop() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                r = client.post(f"{base}/v1/embeddings", json={"input": TEXTS})
                statuses.append(r.status_code)
                if r.status_code == 200:
                    got = np.array([d["embedding"] for d in r.json()["data"]])
                    if not np.allclose(got, expected, atol=1e-5):
                        mismatches.append(len(statuses))
                done.release()

    threads = [threading.Thread(target=client_loop) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(12):
            assert done.acquire(timeout=120)
        shared = _chunks_per_replica(base)
        assert len(shared) == 2 and min(shared.values()) > 0, shared  # both replicas took chunks
        doomed.stop(signal.SIGKILL)  # mid-stream: four clients keep chunks in flight on both
        for _ in range(24):
            assert done.acquire(timeout=120)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert statuses and set(statuses) == {200}, statuses
    assert not mismatches
    retries = sum(metric_values(httpx.get(f"{base}/metrics").text, "ivy_chunk_retries_total").values())
    assert retries >= 1  # some chunks failed on the killed replica and were answered by the survivor
    ready = httpx.get(f"{base}/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "degraded"  # RELIABILITY 29: one is gone
    states = sorted(r["state"] for r in ready.json()["replicas"])
    assert states == ["serving", "unreachable"]
