"""Ivy over Tulip's EmbedStream: one long-lived stream per replica carries the requests; a timed-out or
abandoned request sends a cancel; a large answer takes a unary call; a replica that restarts gets a new
stream; `grpc_stream=false` is unary only. Failure and retry behaviour is the unary path's (the other
Ivy tests run with the stream on)."""

import base64

import numpy as np
from fake_tulip import FakeTulip, wait_until
from ivy_testkit import gateway


def test_requests_share_one_stream_and_match_the_unary_path() -> None:
    with FakeTulip() as fake:
        with gateway(fake) as client:
            streamed = [client.post("/v1/embeddings", json={"input": f"text number {i}"}).json() for i in range(20)]
        assert fake.streams_opened == 1 and fake.unary_calls == 0 and len(fake.calls) == 20
        with gateway(fake, grpc_stream=False) as client:
            unary = [client.post("/v1/embeddings", json={"input": f"text number {i}"}).json() for i in range(20)]
        assert fake.streams_opened == 1 and fake.unary_calls == 20
    for a, b in zip(streamed, unary):
        assert a["data"][0]["embedding"] == b["data"][0]["embedding"]


def test_a_large_answer_takes_a_unary_call() -> None:
    with FakeTulip() as fake, gateway(fake) as client:
        r = client.post("/v1/embeddings", json={"input": ["word"] * 60, "encoding_format": "base64"})
        assert r.status_code == 200 and len(r.json()["data"]) == 60
        assert fake.unary_calls == 0  # 60 x 384 float32 = 92 KB: on the stream
    with FakeTulip() as fake, gateway(fake, chunk_max_seqs=2048) as client:
        r = client.post("/v1/embeddings", json={"input": ["word"] * 1000, "encoding_format": "base64"})
        assert r.status_code == 200
        rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in r.json()["data"]]
        assert len(rows) == 1000 and all(np.allclose(rows[0], x) for x in rows)
        assert fake.unary_calls == 1  # 1000 x 384 float32 = 1.5 MB: over the stream's 1 MiB


def test_a_request_past_its_deadline_cancels_its_work_on_the_stream() -> None:
    with FakeTulip(delay_s=5.0) as fake, gateway(fake) as client:  # the cancel ends its wait: 5 s cost nothing
        r = client.post("/v1/embeddings", json={"input": "slow"}, headers={"X-Request-Timeout": "0.2"})
        assert r.status_code == 504
        wait_until(lambda: fake.stream_cancels == 1)
        fake.delay_s = 0
        assert client.post("/v1/embeddings", json={"input": "fast"}).status_code == 200
        assert fake.streams_opened == 1  # the stream outlived the timed-out request


def test_a_restarted_replica_gets_a_new_stream() -> None:
    with FakeTulip() as fake, gateway(fake) as client:
        assert client.post("/v1/embeddings", json={"input": "before"}).status_code == 200
        fake.stop()
        fake.restart()
        wait_until(lambda: client.get("/ready").status_code == 200)
        statuses = [client.post("/v1/embeddings", json={"input": "after"}).status_code for _ in range(3)]
        assert statuses == [200, 200, 200]
        assert fake.streams_opened == 2


def test_a_cold_hit_is_answered_with_x_cold_start() -> None:
    with FakeTulip() as fake, gateway(fake) as client:
        assert "x-cold-start" not in client.post("/v1/embeddings", json={"input": "warm"}).headers
        fake.cold = True
        r = client.post("/v1/embeddings", json={"input": ["cold", "too"]})
        assert r.status_code == 200 and r.headers["x-cold-start"] == "1"


def test_answers_carry_tei_timing_headers() -> None:
    """x-total-time and x-tokenization-time from Ivy, x-queue-time / x-inference-time / x-batcher-time from Tulip's
    answer, in milliseconds; a request refused before any replica saw it has only Ivy's (x-tokenization-time
    only where something was tokenized). The same on the gRPC stream and on unary calls (the framed
    stream's answers: tests/e2e/test_e2e_framed.py)."""
    for options in ({}, {"grpc_stream": False}):
        with FakeTulip() as fake, gateway(fake, **options) as client:
            fake.timings = (120, 1450, 1800)
            r = client.post("/v1/embeddings", json={"input": "a text to tokenize " * 20})
            assert r.status_code == 200, (options, r.text)
            h = r.headers
            assert (float(h["x-queue-time"]), float(h["x-inference-time"]), float(h["x-batcher-time"])) == \
                (0.12, 1.45, 1.8), options
            assert 0 < float(h["x-tokenization-time"]) < float(h["x-total-time"]), options
            ids = client.post("/v1/embeddings", json={"input": [[101, 7592, 102]] * 3})
            assert float(ids.headers["x-total-time"]) > 0 and ids.headers["x-batcher-time"] == "1.800"
            bad = client.post("/v1/embeddings", json={"input": ""})
            assert bad.status_code == 400 and float(bad.headers["x-total-time"]) > 0
            assert "x-queue-time" not in bad.headers and "x-batcher-time" not in bad.headers
            assert "x-tokenization-time" not in bad.headers  # refused before anything was tokenized
            health = client.get("/health")
            assert float(health.headers["x-total-time"]) >= 0 and "x-tokenization-time" not in health.headers
            fake.timings = (0, 0, 0)  # a replica that does not measure them (an older Tulip)
            old = client.post("/v1/embeddings", json={"input": "text"})
            assert old.status_code == 200 and "x-queue-time" not in old.headers and "x-total-time" in old.headers


def test_a_request_in_several_chunks_reports_the_slowest_calls_three_figures() -> None:
    """Never the largest of each figure across calls (a queue from one, an inference from another)."""
    by_first = {101: (5000, 1000, 6500), 102: (100, 9000, 9500), 103: (200, 2000, 2600)}
    with FakeTulip() as fake, gateway(fake, chunk_max_seqs=2, coalesce=False) as client:
        fake.timings = lambda request: by_first[int(np.frombuffer(request.token_ids, "<i4")[0])]
        seqs = [[101, 1], [101, 2], [102, 1], [102, 2], [103, 1], [103, 2]]
        r = client.post("/v1/embeddings", json={"input": seqs})
        assert r.status_code == 200 and len(fake.calls) == 3
        assert (r.headers["x-queue-time"], r.headers["x-inference-time"], r.headers["x-batcher-time"]) == \
            ("0.100", "9.000", "9.500")
