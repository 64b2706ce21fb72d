"""Chunking, least-outstanding-tokens routing, retries, health watching and readiness over fake replicas."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import grpc
import numpy as np
import pytest

from ivy_testkit import gateway
from fake_tulip import FakeTulip, wait_until
from ivy.gateway import plan_chunks
from ivy.replicas import STALE_AFTER_S, Expected, ReplicaPool, State

TEXTS = [f"sentence number {i} about topic {i % 3}" for i in range(9)]


def _vectors(r) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_plan_chunks_budget_and_count() -> None:
    chunks = plan_chunks([3, 3, 3, 10, 1, 1], [1] * 6, max_tokens=7, max_seqs=2)
    assert [(c.first, c.count, c.tokens) for c in chunks] == [(0, 2, 6), (2, 1, 3), (3, 1, 10), (4, 2, 2)]
    assert sum(c.count for c in chunks) == 6
    spans = plan_chunks([5, 5], [3, 2], max_tokens=100, max_seqs=8)
    assert [(c.count, c.rows) for c in spans] == [(2, 5)]
    assert plan_chunks([], [], 10, 10) == []


def test_pick_least_outstanding_tokens_skips_unhealthy_and_excluded() -> None:
    async def run() -> None:
        expected = Expected(frozenset({"m"}), "fp", 8, 16)
        pool = ReplicaPool(("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"), expected, health_interval_s=1,
                           max_message_bytes=1 << 20)
        a, b, c = pool.replicas
        for r in pool.replicas:
            r.state = State.SERVING
        a.outstanding_tokens, b.outstanding_tokens, c.outstanding_tokens = 50, 10, 30
        assert pool.pick(set()) is b
        assert pool.pick({b}) is c
        b.state = State.UNREACHABLE
        assert pool.pick(set()) is c
        c.state = State.MISMATCH
        assert pool.pick(set()) is a and pool.pick({a}) is None
        for r in pool.replicas:
            r.state, r.outstanding_tokens = State.SERVING, 0
        assert {pool.pick(set()) for _ in range(6)} == {a, b, c}  # ties rotate
        await pool.close()

    asyncio.run(run())


def test_large_request_split_over_replicas_reassembled_in_order() -> None:
    with FakeTulip() as one, FakeTulip() as a, FakeTulip() as b:
        with gateway(one) as client:
            whole = _vectors(client.post("/v1/embeddings", json={"input": TEXTS}))
        assert len(one.calls) == 1
        with gateway(a, b, chunk_max_seqs=2) as client:
            split = client.post("/v1/embeddings", json={"input": TEXTS})
            np.testing.assert_allclose(_vectors(split), whole, atol=1e-6)
            assert split.json()["usage"]["prompt_tokens"] == one.tokens_served
        assert len(a.calls) + len(b.calls) == 5 and a.calls and b.calls
        assert max(c.seqs for c in a.calls + b.calls) <= 2


def test_chunks_are_in_flight_concurrently_on_both_replicas() -> None:
    gate = threading.Event()
    with FakeTulip(gate=gate) as a, FakeTulip(gate=gate) as b:
        with gateway(a, b, chunk_max_seqs=3) as client:
            result = {}
            t = threading.Thread(target=lambda: result.update(r=client.post("/v1/embeddings", json={"input": TEXTS})))
            t.start()
            wait_until(lambda: a.waiting + b.waiting == 3)
            assert a.waiting >= 1 and b.waiting >= 1
            gate.set()
            t.join(timeout=10)
            assert result["r"].status_code == 200


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED])
def test_dropped_chunk_is_retried_on_another_replica(code) -> None:
    """UNAVAILABLE, or CANCELLED (what a stopping server answers for calls it still holds), is the replica's
    failure, not the client's: the chunk goes to another replica."""
    with FakeTulip() as reference, FakeTulip(fail_with=code) as bad, FakeTulip() as good:
        with gateway(reference) as client:
            expected = _vectors(client.post("/v1/embeddings", json={"input": TEXTS}))
        with gateway(bad, good, chunk_max_seqs=1, health_interval_s=0.05) as client:
            for _ in range(5):
                np.testing.assert_allclose(_vectors(client.post("/v1/embeddings", json={"input": TEXTS})),
                                           expected, atol=1e-6)
        assert bad.calls == [] and good.tokens_served == 5 * reference.tokens_served


def test_full_queue_on_one_replica_goes_to_the_other() -> None:
    with FakeTulip(fail_with=grpc.StatusCode.RESOURCE_EXHAUSTED, fail_details="queue full") as busy, \
            FakeTulip() as free:
        with gateway(busy, free) as client:
            for _ in range(4):
                assert client.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200
        assert len(free.calls) == 4


def test_killed_replica_mid_request_loses_nothing() -> None:
    """RELIABILITY 17: the chunks of a replica killed mid-request are answered by another one."""
    gate = threading.Event()
    with FakeTulip(gate=gate) as doomed, FakeTulip() as survivor:
        with gateway(doomed, survivor, chunk_max_seqs=1) as client:
            results = {}
            t = threading.Thread(target=lambda: results.update(r=client.post("/v1/embeddings", json={"input": TEXTS})))
            t.start()
            wait_until(lambda: doomed.waiting >= 1)
            doomed.stop()  # in-flight calls on it fail; Ivy retries them on the survivor
            t.join(timeout=20)
            assert results["r"].status_code == 200, results["r"].text
            assert len(results["r"].json()["data"]) == len(TEXTS)


def test_dead_replica_skipped_until_healthy_again() -> None:
    with FakeTulip() as a, FakeTulip() as b:
        with gateway(a, b, health_interval_s=0.05) as client:
            pool = client.app.state.gateway.pool
            a.stop()
            wait_until(lambda: pool.replicas[0].state is State.UNREACHABLE)
            r = client.get("/ready")  # RELIABILITY 29: still ready on the other, and says it is degraded
            assert r.status_code == 200 and r.json()["status"] == "degraded"
            before = len(b.calls)
            for _ in range(4):
                assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 200
            assert len(b.calls) == before + 4
            a.restart()
            wait_until(lambda: pool.replicas[0].state is State.SERVING)
            assert client.get("/ready").json()["status"] == "ready"
            client.post("/v1/embeddings", json={"input": TEXTS})
            client.post("/v1/embeddings", json={"input": TEXTS})
            assert a.calls, "the recovered replica takes traffic again"


def test_stale_view_of_a_ready_replica_is_probed_before_a_503() -> None:
    """A gateway worker whose last probe saw the replica loading serves the request once it is ready
    (the H200 stack run: /ready 200 from one worker, the next request 503 from another)."""
    with FakeTulip() as fake:
        with gateway(fake, health_interval_s=60) as client:  # no background probe during the test
            pool = client.app.state.gateway.pool
            pool.replicas[0].set_state(State.NOT_SERVING, "loading")  # what the startup probe saw
            time.sleep(STALE_AFTER_S + 0.05)
            r = client.post("/v1/embeddings", json={"input": "x"})
            assert r.status_code == 200, r.text
            assert pool.replicas[0].state is State.SERVING


def test_the_probe_before_a_503_is_bounded_by_the_request_deadline() -> None:
    """RELIABILITY 14 and 17: with no replica serving in this worker's view, the probe a request runs first (the
    stale view above) waited out its own timeout (1-2 s: a silent replica, a SIGSTOPped host) whatever the
    request's deadline: X-Request-Timeout 0.2 was answered after 2 s. It waits at most until the deadline."""
    silent = socket.socket()  # connects (the kernel's backlog) and never answers a byte: every probe times out
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)

    class _Silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"

    with silent, gateway(_Silent(), health_interval_s=2) as client:  # probes time out after 2 s
        time.sleep(STALE_AFTER_S + 0.05)  # the startup probe is stale: the request probes again
        start = time.monotonic()
        r = client.post("/v1/embeddings", json={"input": "x"}, headers={"X-Request-Timeout": "0.2"})
        took = time.monotonic() - start
        assert r.status_code == 503 and "retry-after" in r.headers, r.text
        assert took < 1.0, f"answered after {took:.2f} s for a 0.2 s deadline"


def test_readiness_follows_serving_status_health_stays_open() -> None:
    """RELIABILITY 21: /health 200 while the replica loads; /ready 503 until it serves."""
    with FakeTulip(serving=False) as fake:
        with gateway(fake) as client:
            assert client.get("/health").status_code == 200
            r = client.get("/ready")
            assert r.status_code == 503 and r.json()["replicas"][0]["state"] == "not_serving"
            assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 503
            fake.serving = True
            wait_until(lambda: client.get("/ready").status_code == 200)
            assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 200


def test_replica_with_another_tokenizer_is_never_used() -> None:
    with FakeTulip(fingerprint="0" * 64) as wrong, FakeTulip() as right:
        with gateway(wrong, right) as client:
            r = client.get("/ready")
            assert r.status_code == 200 and r.json()["degraded"]  # ready on the right one (RELIABILITY 29)
            states = {x["state"] for x in r.json()["replicas"]}
            assert states == {"model_mismatch", "serving"}
            for _ in range(3):
                assert client.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200
        assert wrong.calls == [] and len(right.calls) == 3
    with FakeTulip(model_id="another-model") as other:
        with gateway(other) as client:
            assert client.get("/ready").status_code == 503
            assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 503


def test_ivy_channel_keepalive_mirrors_tulips_recommended_client_options() -> None:
    """RELIABILITY 23: Ivy does not import tulip, so its channel options are a copy of Tulip's
    CLIENT_CHANNEL_OPTIONS (which tests/tulip/test_tulip_keepalive.py proves against the server's floor)."""
    from ivy.replicas import channel_options
    from tulip.server import CLIENT_CHANNEL_OPTIONS

    ours = dict(channel_options(1 << 20))
    for key, value in CLIENT_CHANNEL_OPTIONS:
        if "keepalive" in key or "ping" in key:
            assert ours.get(key) == value, key


def _metric(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def test_ready_while_any_replica_serves_and_degraded_says_so() -> None:
    """RELIABILITY 29: one replica down or rolling leaves the gateway ready (k8s keeps it in the Service),
    with "degraded" in /ready's body and the ivy_degraded gauge; none serving is 503."""
    with FakeTulip() as a, FakeTulip() as b:
        with gateway(a, b, health_interval_s=0.05) as client:
            body = client.get("/ready").json()
            assert (body["status"], body["degraded"], body["replicas_serving"]) == ("ready", False, 2)
            assert _metric(client, "ivy_degraded") == 0 and _metric(client, "ivy_replicas_serving") == 2
            a.serving = False  # rolling: NOT_SERVING while it restarts
            wait_until(lambda: client.get("/ready").json()["status"] == "degraded")
            r = client.get("/ready")
            assert r.status_code == 200 and r.json()["degraded"] and r.json()["replicas_serving"] == 1
            assert _metric(client, "ivy_degraded") == 1 and _metric(client, "ivy_replicas_serving") == 1
            assert _metric(client, "ivy_replicas") == 2
            assert client.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200
            b.stop()
            wait_until(lambda: client.get("/ready").status_code == 503)
            assert client.get("/ready").json()["status"] == "not_ready" and _metric(client, "ivy_degraded") == 0
