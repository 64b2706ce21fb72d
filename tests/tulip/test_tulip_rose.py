"""Tulip driving the real ROSE engine with the bundled all-MiniLM-L6-v2 on a CPU, over loopback gRPC."""

import random

import numpy as np
import pytest
from tulip_testkit import ServerThread, decode_response, encode_request, make_config

from protos import embed_pb2

pytest.importorskip("torch")

TEXTS = ["hello world", "Tulip packs sequences first come, first served.", "a b c",
         "Embeddings are cheap when the GPU never waits for the host. " * 6, "gRPC carries token ids",
         "short", "The quick brown fox jumps over the lazy dog.", "ROSE replays CUDA graphs per token bucket."]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.slow
def test_real_minilm_through_tulip_matches_solo_and_sentence_transformers() -> None:
    config = make_config(max_batch_tokens=256, max_batch_seqs=8, warmup_full_batch="true")
    with ServerThread(config) as s:  # engine=None: the default factory, rose.Engine.from_pretrained
        engine = s.server.engine
        info = s.stub.Info(embed_pb2.InfoRequest(), timeout=10)
        assert (info.dimensions, info.pooling, info.normalized) == (384, "mean", True)
        assert info.tokenizer_fingerprint == engine.info.tokenizer_fingerprint
        ids = [e.ids for e in engine.tokenizer.encode_batch(TEXTS)]
        rng = random.Random(0)
        picks = [rng.sample(range(len(TEXTS)), rng.randint(1, 3)) for _ in range(40)]
        requests = [encode_request([ids[i] for i in pick], dimensions=rng.choice([0, 128])) for pick in picks]
        futures = [s.stub.Embed.future(r, timeout=120) for r in requests]
        solo = engine.embed(ids)  # each text alone through the same engine, full width, normalized
        for pick, req, fut in zip(picks, requests, futures):
            got = decode_response(fut.result())
            want = solo[pick][:, : req.dimensions or 384]
            want = want / np.linalg.norm(want, axis=1, keepdims=True)
            assert np.all(cosine(got, want) > 0.99999)
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    from sentence_transformers import SentenceTransformer

    from tulip.engine_loader import model_dir

    reference = SentenceTransformer(model_dir(config), device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert np.all(cosine(solo, reference) >= 0.9999)


@pytest.mark.slow
def test_tulip_serve_with_the_bundled_model_starts_answers_and_drains() -> None:
    import signal

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from test_tulip_process import TulipProcess

    from protos import embed_pb2_grpc

    server = TulipProcess(base=("--device", "auto"))  # the default factory, as `tulip serve` runs
    try:
        port = int(server.wait_for_line(r"tulip listening on 127\.0\.0\.1:(\d+)").group(1))
        server.wait_for_line(r"tulip ready", timeout=120)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="tulip.v1.Embedder"), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        resp = embed_pb2_grpc.EmbedderStub(channel).Embed(encode_request([[101, 7592, 2088, 102]]), timeout=30)
        assert (resp.rows, resp.dimensions) == (1, 384)
        np.testing.assert_allclose(np.linalg.norm(decode_response(resp)), 1.0, atol=1e-5)
        channel.close()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
    finally:
        server.kill()
