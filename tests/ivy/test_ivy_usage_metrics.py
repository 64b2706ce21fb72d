"""ivy_inputs_total and ivy_tokens_total count what usage reports: a request's inputs and the tokens sent, once
it is answered. A request the replicas failed (503) was counted all the same by the embedding routes, which
counted when tokenizing, before the replica call; a cross-encoder's score and rerank counted pairs (score) or
the texts (rerank) where the other scoring counts the request's texts."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest
from cross_folders import bert_reranker
from fake_tulip import FakeTulip, wait_until
from ivy_testkit import gateway
from prometheus_client import REGISTRY

from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

TEXTS = ["hello world"] * 3
QUERY = "where do cats sleep"
DOCS = ["cats sleep on the sofa", "stock prices fell today"]


def counted(route: str) -> tuple[float, float]:
    """(ivy_inputs_total, ivy_tokens_total) of a route so far (this process's registry)."""
    return tuple(REGISTRY.get_sample_value(f"ivy_{name}_total", {"route": route}) or 0.0
                 for name in ("inputs", "tokens"))


def tokens_of(texts: list[str], folder: Path | None = None) -> int:
    return sum(len(e.ids) for e in Tokenizer(load_spec(folder or bundled_model_dir())).encode_batch(texts))


ROUTES = {"/v1/embeddings": {"input": TEXTS}, "/embed": {"inputs": TEXTS}, "/pooling": {"input": TEXTS}}


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_request_the_replicas_failed_counts_no_inputs_or_tokens(route: str) -> None:
    fake = FakeTulip(fail_with=grpc.StatusCode.UNAVAILABLE)
    with fake, gateway(fake) as client:
        before = counted(route)
        r = client.post(route, json=ROUTES[route])
        assert r.status_code == 503, r.text
        assert counted(route) == before  # usage reported nothing; the metric said 3 inputs, 12 tokens
        fake.fail_with = None
        wait_until(lambda: client.get("/ready").status_code == 200)  # the failure took it out until a probe
        assert client.post(route, json=ROUTES[route]).status_code == 200
        assert counted(route) == (before[0] + 3, before[1] + tokens_of(TEXTS))


def test_retrieval_routes_count_only_what_was_answered(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    sys.path.insert(0, str(Path(__file__).parent.parent / "rose"))  # the tiny model builders
    from rose_retrieval_models import build_bge_m3

    folder = build_bge_m3(tmp_path)
    fake = FakeTulip(model_dir=folder, fail_with=grpc.StatusCode.UNAVAILABLE)
    with fake, gateway(fake, model=str(folder)) as client:
        for route in ("/embed_sparse", "/embed_multi_vector"):
            before = counted(route)
            assert client.post(route, json={"inputs": TEXTS}).status_code == 503
            assert counted(route) == before, route
        fake.fail_with = None
        wait_until(lambda: client.get("/ready").status_code == 200)
        for route in ("/embed_sparse", "/embed_multi_vector"):
            before = counted(route)
            assert client.post(route, json={"inputs": TEXTS}).status_code == 200
            assert counted(route) == (before[0] + 3, before[1] + tokens_of(TEXTS, folder)), route


def test_a_cross_encoder_counts_the_requests_texts_as_other_scoring_does(tmp_path: Path, client) -> None:
    """One rule for every scoring model: the texts of the request (queries and documents), not the pairs."""
    folder = bert_reranker(tmp_path)
    fake = FakeTulip(model_dir=folder)
    with fake, gateway(fake, model=str(folder)) as cross:
        for c in (client, cross):  # the bi-encoder, then the cross-encoder
            for route, body, texts in (("/v1/score", {"text_1": QUERY, "text_2": DOCS}, 3),
                                       ("/v1/score", {"text_1": DOCS, "text_2": DOCS[::-1]}, 4),
                                       ("/v1/rerank", {"query": QUERY, "documents": DOCS}, 3),
                                       ("/rerank", {"query": QUERY, "texts": DOCS}, 3)):
                before = counted(route)
                r = c.post(route, json=body)
                assert r.status_code == 200, r.text
                usage = r.json()["usage"]["total_tokens"] if route != "/rerank" else None
                inputs, tokens = counted(route)
                assert inputs - before[0] == texts, (route, body)
                assert usage is None or tokens - before[1] == usage


def test_a_cross_encoder_request_that_failed_counts_nothing(tmp_path: Path) -> None:
    folder = bert_reranker(tmp_path)
    fake = FakeTulip(model_dir=folder, fail_with=grpc.StatusCode.UNAVAILABLE)
    with fake, gateway(fake, model=str(folder)) as client:
        before = counted("/v1/rerank")
        assert client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).status_code == 503
        assert counted("/v1/rerank") == before



@pytest.mark.parametrize("route, body", [
    ("/v1/embeddings", {"input": TEXTS}),
    ("/v1/score", {"text_1": QUERY, "text_2": DOCS}),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS}),
    ("/similarity", {"inputs": {"source_sentence": QUERY, "sentences": DOCS}}),
])
def test_tokenize_seconds_is_one_sample_a_request_its_calls_summed(client, route: str, body: dict) -> None:
    """ivy_tokenize_seconds is "per request" (its help, the RUNBOOK's triage): a score, rerank or similarity request
    tokenizes its two sides in two calls, which gave two samples of part of its time each; now one, their sum,
    which is the request's x-tokenization-time."""
    def count() -> float:
        return REGISTRY.get_sample_value("ivy_tokenize_seconds_count") or 0.0

    def total() -> float:
        return REGISTRY.get_sample_value("ivy_tokenize_seconds_sum") or 0.0

    before, before_sum = count(), total()
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    assert count() == before + 1
    header = float(r.headers["x-tokenization-time"]) / 1e3
    assert total() - before_sum == pytest.approx(header, abs=1e-6)
