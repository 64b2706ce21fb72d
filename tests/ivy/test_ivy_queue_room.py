"""RELIABILITY 31: a request larger than the replicas' free queue, on an idle stack, waits for room within
its deadline instead of getting 429: its chunks go out a few at a time, and a full queue is retried after
a jittered pause (on the same replica or another) until the deadline."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

import ivy.replica as replica_module

from fake_tulip import FakeTulip, wait_until
from ivy_testkit import gateway

TEXTS = [f"document {i} " + "word " * 20 for i in range(24)]  # ~24 tokens each


def _vectors(r) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_a_request_larger_than_the_queue_succeeds_on_an_idle_stack() -> None:
    with FakeTulip() as reference:
        with gateway(reference) as client:
            expected = _vectors(client.post("/v1/embeddings", json={"input": TEXTS}))
    # 12 chunks of ~48 tokens; the replica's queue holds two of them at a time
    with FakeTulip(max_queue_tokens=120, delay_s=0.02) as small_queue:
        with gateway(small_queue, chunk_max_seqs=2) as client:
            r = client.post("/v1/embeddings", json={"input": TEXTS})
            np.testing.assert_allclose(_vectors(r), expected, atol=1e-6)
        assert small_queue.queue_full > 0  # it was full on the way: the request waited for room
        assert small_queue.tokens_served == reference.tokens_served


def test_a_request_has_at_most_max_chunks_in_flight() -> None:
    for flag, replicas, want in ((3, 1, 3), (0, 1, 4), (0, 2, 8)):
        fakes = [FakeTulip(delay_s=0.02).start() for _ in range(replicas)]
        try:
            with gateway(*fakes, chunk_max_seqs=1, max_chunks_in_flight=flag) as client:
                assert client.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200
            assert sum(f.tokens_served > 0 for f in fakes) == replicas
            peak = sum(f.peak_calls for f in fakes)
            assert peak <= want and max(f.peak_calls for f in fakes) > 1, (flag, replicas, peak)
        finally:
            for f in fakes:
                f.close()


def test_every_queue_full_until_the_deadline_is_429_with_retry_after() -> None:
    gate = threading.Event()
    with FakeTulip(max_queue_tokens=30, gate=gate) as full:
        with gateway(full) as client:
            held = threading.Thread(target=lambda: client.post("/v1/embeddings", json={"input": TEXTS[0]}))
            held.start()  # fills the queue and stays
            wait_until(lambda: full.waiting == 1)
            # 2 s: room for the retries (queue_full > 1) on a loaded host, whose stall would leave no time for one
            r = client.post("/v1/embeddings", json={"input": TEXTS[1]}, headers={"X-Request-Timeout": "2"})
            assert r.status_code == 429 and r.headers["retry-after"] and full.queue_full > 1  # retried, then 429
            gate.set()
            held.join(10)


@pytest.mark.parametrize("stream", [True, False])
def test_a_stall_during_the_last_retry_after_queue_full_is_still_429(monkeypatch, stream: bool) -> None:
    """The host stalls (a GC pause, a starved CPU) while the last retry after queue full is in flight, past
    the deadline: the answer is still the queue being full (429), not a 504."""
    real = replica_module.Replica.embed
    timeouts: list[float] = []

    async def stalled(self, request, timeout, response_bytes):
        timeouts.append(timeout)
        if len(timeouts) == 3:  # the third attempt (two short pauses in): the replica's host freezes past the
            fake._loop.call_soon_threadsafe(time.sleep, timeout + 0.05)  # deadline, so this retry is the last
        return await real(self, request, timeout, response_bytes)

    monkeypatch.setattr(replica_module.Replica, "embed", stalled)
    with FakeTulip(fail_with=grpc.StatusCode.RESOURCE_EXHAUSTED, fail_details="the queue holds too many tokens",
                   fail_reason="queue_full") as fake, gateway(fake, grpc_stream=stream) as client:
        r = client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Timeout": "2"})
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] and len(timeouts) == 3  # the stalled retry was the last
