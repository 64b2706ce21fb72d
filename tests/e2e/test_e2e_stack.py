"""The whole stack as the README starts it (`ivy up`), with the bundled model, checked from the outside.

One stack per module (starting Tulip loads and warms the real model). Requests go through HTTP with the
official `openai` client or httpx; results are compared with sentence-transformers on the same folder.
"""

from __future__ import annotations

import base64
import time

import httpx
import numpy as np
import openai
import pytest

from rose.spec import bundled_model_dir
from stack_testkit import free_port, http_status, ivy, ivy_up

pytestmark = pytest.mark.slow

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors.",
    "Ünïcødé, emoji 🚀 and accents: café, naïve, 東京.",
    "short",
    " ".join(["A longer passage that repeats itself to make a few hundred tokens."] * 12),
]


STACK_OUT: list[str] = []  # `ivy up`'s stdout once ready


@pytest.fixture(scope="module")
def stack():
    proc, port = ivy_up()
    try:
        assert any("curl" in line for line in proc.out)
        metrics_port = proc.argv[proc.argv.index("--tulip-metrics-port") + 1]
        assert any(f"http://127.0.0.1:{metrics_port}/metrics" in line for line in proc.out)  # the banner names it
        STACK_OUT[:] = list(proc.out)
        yield f"http://127.0.0.1:{port}"
    finally:
        code = proc.stop()
    assert code == 0, proc.output()


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    return lambda texts: model.encode(texts, convert_to_numpy=True)


@pytest.fixture(scope="module")
def oai(stack):
    return openai.OpenAI(base_url=f"{stack}/v1", api_key="x", max_retries=0)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _post(stack: str, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{stack}{route}", json=body, timeout=60)


def test_openai_client_matches_sentence_transformers(oai, reference) -> None:
    expected = reference(TEXTS)
    response = oai.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64 and decodes it
    got = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert got.shape == expected.shape
    assert _cosine(got, expected).min() >= 0.9999
    assert response.usage.prompt_tokens == response.usage.total_tokens > len(TEXTS)
    floats = oai.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="float")
    assert _cosine(np.array([d.embedding for d in floats.data]), expected[:2]).min() >= 0.9999
    assert [m.id for m in oai.models.list().data] == [MODEL]


def test_concurrent_clients_each_get_their_own_embedding(stack, reference) -> None:
    """16 clients at once through the real stack: requests share gRPC calls (Ivy) and batches (Tulip);
    every answer must still be its own text's embedding."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"{i}: " + TEXTS[i % len(TEXTS)] for i in range(48)]
    expected = reference(texts)

    def one(i: int) -> np.ndarray:
        body = _post(stack, "/v1/embeddings", {"input": texts[i], "model": MODEL}).json()
        return np.asarray(body["data"][0]["embedding"], dtype=np.float32)

    with ThreadPoolExecutor(16) as pool:
        got = np.stack(list(pool.map(one, range(len(texts)))))
    assert _cosine(got, expected).min() >= 0.9999


def test_unknown_model_404_and_empty_input_400(oai) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        oai.embeddings.create(model="no-such-model", input=["x"])
    assert "is not served here" in str(info.value)
    with pytest.raises(openai.BadRequestError):
        oai.embeddings.create(model=MODEL, input=[])


def test_encodings_and_dimensions(stack) -> None:
    floats = np.array([d["embedding"] for d in _post(stack, "/v1/embeddings", {"input": TEXTS}).json()["data"]],
                      dtype=np.float32)
    b64 = _post(stack, "/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"}).json()["data"]
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64])
    np.testing.assert_allclose(decoded, floats, rtol=0, atol=1e-6)

    i8 = _post(stack, "/v1/embeddings", {"input": TEXTS, "encoding_format": "base64_int8"}).json()["data"]
    ints = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.int8) for d in i8]).astype(np.int32)
    scale = np.abs(floats).max(axis=1, keepdims=True) / 127.0
    want = np.clip(np.rint(floats / scale), -127, 127)
    assert np.abs(ints - want).max() <= 1  # float rounding may flip a value sitting on .5
    assert _cosine(ints.astype(np.float32), floats).min() > 0.999

    binary = _post(stack, "/v1/embeddings", {"input": TEXTS, "encoding_format": "base64_binary"}).json()["data"]
    packed = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.uint8) for d in binary])
    bits = np.unpackbits(packed, axis=1, bitorder="little").astype(bool)
    clear = np.abs(floats) > 1e-6  # signs of values that are not ~0 must agree exactly
    assert (bits[clear] == (floats > 0)[clear]).all()

    short = _post(stack, "/v1/embeddings", {"input": TEXTS, "dimensions": 128}).json()["data"]
    small = np.array([d["embedding"] for d in short], dtype=np.float32)
    assert small.shape == (len(TEXTS), 128)
    np.testing.assert_allclose(np.linalg.norm(small, axis=1), 1.0, atol=1e-5)
    prefix = floats[:, :128] / np.linalg.norm(floats[:, :128], axis=1, keepdims=True)
    assert _cosine(small, prefix).min() >= 0.9999
    assert _post(stack, "/v1/embeddings", {"input": "x", "dimensions": 385}).status_code == 422


def test_rerank_puts_the_paraphrase_above_the_unrelated_text(stack) -> None:
    query = "How can I bake bread at home?"
    documents = ["The stock market fell sharply on Tuesday after the earnings report.",
                 "What is the best way to make my own bread in a home kitchen?",
                 "Bears hibernate through the winter."]
    body = _post(stack, "/v1/rerank", {"model": MODEL, "query": query, "documents": documents,
                                       "return_documents": True}).json()
    assert body["results"][0]["index"] == 1
    assert body["results"][0]["document"] == {"text": documents[1]}
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and scores[0] - scores[-1] > 0.2
    score = _post(stack, "/v1/score", {"text_1": query, "text_2": documents}).json()["data"]
    assert max(range(3), key=lambda i: score[i]["score"]) == 1


def test_contextual_chunks_differ_from_chunks_alone(stack, reference) -> None:
    chunks = ["Marie Curie was a physicist and chemist.", "She won two Nobel prizes.",
              "Her work on radioactivity changed science."]
    body = _post(stack, "/v1/contextualizedembeddings", {"input": [chunks, chunks[:1]]}).json()
    assert [len(d["data"]) for d in body["data"]] == [3, 1]
    in_context = np.array([c["embedding"] for c in body["data"][0]["data"]], dtype=np.float32)
    alone = reference(chunks)
    cosines = _cosine(in_context, alone)
    assert (cosines < 0.999).all() and (cosines > 0.3).all()  # related to the chunk, shaped by its context


def test_readiness_and_health(stack) -> None:
    assert http_status(f"{stack}/health") == 200
    assert http_status(f"{stack}/ready") == 200
    assert "ivy_requests_total" in httpx.get(f"{stack}/metrics").text
    banner = next(line for line in STACK_OUT if "/metrics" in line and "gateway" in line)
    tulip_metrics = banner.split(", ")[-1].strip()
    assert "tulip_queue_tokens" in httpx.get(tulip_metrics).text  # `ivy up` gives each Tulip its metrics port


def test_gateway_without_reachable_tulip_is_not_ready_and_fails_fast() -> None:
    port = free_port()
    proc = ivy("serve", "--port", str(port), "--replicas", f"127.0.0.1:{free_port()}")
    try:
        base = f"http://127.0.0.1:{port}"
        proc.wait_for(lambda: http_status(f"{base}/health") == 200, "ivy serve alive", timeout=60)
        assert http_status(f"{base}/ready") == 503
        start = time.monotonic()
        r = httpx.post(f"{base}/v1/embeddings", json={"input": ["hello"]}, timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == "replicas_unavailable"
        assert time.monotonic() - start < 10  # answered, not left hanging until the request deadline
    finally:
        proc.stop()
