"""POST /v1/score and POST /v1/rerank: cosine scores, ordering, top_n, documents echoed, client shapes."""

from __future__ import annotations

import time

import numpy as np

from ivy_testkit import MODEL
from fake_tulip import fake_rows
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

TOKENIZER = Tokenizer(load_spec(bundled_model_dir()))
QUERY = "where do cats sleep"
DOCS = ["cats sleep on the sofa", "stock prices fell today", "cats and dogs", "where do birds fly"]


def _cosines(query: str, docs: list[str]) -> np.ndarray:
    rows = fake_rows([e.ids for e in TOKENIZER.encode_batch([query, *docs])], 384)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows[1:] @ rows[0]


def test_rerank_sorted_by_cosine_with_documents(client) -> None:
    r = client.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS, "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = _cosines(QUERY, DOCS)
    assert [x["index"] for x in body["results"]] == list(np.argsort(-expected))
    for item in body["results"]:
        assert abs(item["relevance_score"] - expected[item["index"]]) < 1e-5
        assert item["document"] == {"text": DOCS[item["index"]]}
    tokens = sum(len(e.ids) for e in TOKENIZER.encode_batch([QUERY, *DOCS]))
    assert body["usage"]["total_tokens"] == tokens and body["model"] == MODEL and body["id"]


def test_rerank_top_n_objects_and_documents_by_default(client) -> None:
    """Documents echoed unless return_documents is false, as vLLM and Jina do (/v2/rerank, Cohere v2's, does not
    echo them: tests/ivy/test_ivy_peer_fields.py)."""
    docs = [{"text": d} for d in DOCS]
    body = client.post("/v1/rerank", json={"query": QUERY, "documents": docs, "top_n": 2}).json()
    assert len(body["results"]) == 2 and all(x["document"] == docs[x["index"]] for x in body["results"])
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert client.post("/v1/rerank", json={"query": "", "documents": DOCS}).status_code == 400
    assert client.post("/v1/rerank", json={"query": QUERY, "documents": []}).status_code == 400
    assert client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": -1}).status_code == 422
    # top_n 0 is vLLM's default, every document (tests/ivy/test_ivy_peer_paths.py)


def test_rerank_answers_voyages_shape_beside(client) -> None:
    """The voyageai SDK sends top_k and truncation, and reads `data` (each result's index and relevance_score) and
    usage.total_tokens: they are in every answer beside `results`, the same order and scores; a document there (a
    string, Voyage's) only with return_documents, as Voyage answers."""
    body = client.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS, "top_k": 2,
                                           "truncation": True}).json()
    assert body["object"] == "list" and len(body["data"]) == 2
    assert [(d["index"], d["relevance_score"]) for d in body["data"]] == [
        (r["index"], r["relevance_score"]) for r in body["results"]]
    assert all("document" not in d for d in body["data"]) and body["usage"]["total_tokens"] > 0
    echoed = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "return_documents": True}).json()
    assert [d["document"] for d in echoed["data"]] == [DOCS[d["index"]] for d in echoed["data"]]
    assert len(echoed["data"]) == len(DOCS)


def test_score_one_against_many_and_pairwise(client) -> None:
    body = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS}).json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert body["object"] == "list" and abs(body["created"] - time.time()) < 600  # vLLM's shape
    np.testing.assert_allclose([d["score"] for d in body["data"]], _cosines(QUERY, DOCS), atol=1e-5)
    pairs = client.post("/v1/score", json={"text_1": DOCS[:2], "text_2": DOCS[2:]}).json()
    np.testing.assert_allclose([d["score"] for d in pairs["data"]],
                               [_cosines(DOCS[0], [DOCS[2]])[0], _cosines(DOCS[1], [DOCS[3]])[0]], atol=1e-5)
    r = client.post("/v1/score", json={"text_1": DOCS[:2], "text_2": DOCS})
    assert r.status_code == 422 and r.json()["error"]["param"] == "text_1"


def test_cohere_v2_path_and_openapi(client) -> None:
    r = client.post("/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": 1})
    assert r.status_code == 200 and len(r.json()["results"]) == 1
    paths = client.get("/openapi.json").json()["paths"]
    for route in ("/v1/embeddings", "/v1/contextualizedembeddings", "/v1/score", "/v1/rerank", "/v1/models"):
        assert route in paths


def test_an_over_long_query_is_named_query_not_an_element_of_it(client, fake) -> None:
    """`query` is one text: an over-long one was named query[0] (and /v1/score's text_1 sent as a string
    text_1[0]), an element that does not exist; documents keep their index."""
    long_text, long_chars = "word " * 400, "x" * 100_000
    for route, body, param in (
            ("/v1/rerank", {"query": long_text, "documents": DOCS}, "query"),
            ("/v1/rerank", {"query": long_chars, "documents": DOCS}, "query"),
            ("/rerank", {"query": long_text, "texts": DOCS}, "query"),
            ("/v1/score", {"text_1": long_text, "text_2": DOCS}, "text_1"),
            ("/v1/score", {"text_1": QUERY, "text_2": long_text}, "text_2"),
            ("/v1/score", {"text_1": [long_text], "text_2": DOCS}, "text_1[0]"),
            ("/v1/score", {"text_1": QUERY, "text_2": [DOCS[0], long_text]}, "text_2[1]"),
            ("/v1/rerank", {"query": QUERY, "documents": [DOCS[0], long_text]}, "documents[1]")):
        r = client.post(route, json=body)
        error = r.json()["error"]
        assert r.status_code == 422 and (error["param"], error["code"]) == (param, "input_too_long"), (route, error)
        assert error["message"].startswith(f"{param} has "), error["message"]
    assert fake.calls == []
