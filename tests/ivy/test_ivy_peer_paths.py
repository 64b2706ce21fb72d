"""The peers' paths for the same work, so their clients need no change: POST /rerank (text-embeddings-inference's
`texts` shape answered in its list shape; `documents` as /v1/rerank, as vLLM and Infinity take it), POST /score
(vLLM) and POST /embeddings (Infinity) as their /v1 routes; TEI's /similarity and /decode, vLLM's /detokenize."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from cross_folders import bert_reranker
from fake_tulip import FakeTulip, fake_scores
from ivy_testkit import gateway
from test_ivy_scoring import DOCS, QUERY, TOKENIZER, _cosines

from ivy.errors import IvyError
from rose.spec import load_spec
from rose.tokenizer import Tokenizer


def test_tei_rerank_shape_by_cosine(client) -> None:
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200, r.text
    expected = _cosines(QUERY, DOCS)
    body = r.json()
    assert isinstance(body, list) and [x["index"] for x in body] == list(np.argsort(-expected, kind="stable"))
    for item in body:
        assert abs(item["score"] - expected[item["index"]]) < 1e-5 and item["text"] == DOCS[item["index"]]
    plain = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "truncation_direction": "Left"}).json()
    assert [x["index"] for x in plain] == [x["index"] for x in body] and "text" not in plain[0]


def test_tei_rerank_errors_name_its_fields(client) -> None:
    # cosine scores have no activation to take off: raw_scores is honoured as they are (a reranker's 422 naming
    # raw_scores: tests/ivy/test_ivy_peer_fields.py)
    raw = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True})
    assert raw.status_code == 200 and raw.json() == client.post("/rerank", json={"query": QUERY, "texts": DOCS}).json()
    r = client.post("/rerank", json={"query": QUERY, "texts": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "texts"
    r = client.post("/rerank", json={"query": QUERY, "texts": ["ok", ""]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "texts[1]"


def test_rerank_with_documents_is_the_v1_route(client) -> None:
    body = {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True}
    v1, peer = client.post("/v1/rerank", json=body).json(), client.post("/rerank", json=body).json()
    assert peer["results"] == v1["results"] and len(peer["results"]) == 2 and peer["usage"] == v1["usage"]


def test_top_n_zero_is_vllms_every_document(client) -> None:
    """vLLM's RerankRequest defaults top_n to 0, meaning every document: a vLLM client's body is served, not 422."""
    for route in ("/rerank", "/v1/rerank"):
        every = client.post(route, json={"query": QUERY, "documents": DOCS}).json()["results"]
        zero = client.post(route, json={"query": QUERY, "documents": DOCS, "top_n": 0})
        assert zero.status_code == 200 and zero.json()["results"] == every and len(every) == len(DOCS), zero.text
        negative = client.post(route, json={"query": QUERY, "documents": DOCS, "top_n": -1})
        assert negative.status_code == 422 and negative.json()["error"]["param"] == "top_n"


def test_score_and_embeddings_paths_answer_as_the_v1_routes(client) -> None:
    score = {"text_1": QUERY, "text_2": DOCS}
    assert client.post("/score", json=score).json()["data"] == client.post("/v1/score", json=score).json()["data"]
    embed = {"input": ["hello world", "good morning"]}
    infinity, v1 = client.post("/embeddings", json=embed).json(), client.post("/v1/embeddings", json=embed).json()
    assert infinity["data"] == v1["data"] and infinity["usage"] == v1["usage"]
    paths = client.get("/openapi.json").json()["paths"]
    assert "/rerank" in paths and "/score" not in paths and "/embeddings" not in paths  # the twins stay out
    body = paths["/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {s["title"] for s in body["oneOf"]} == {"RerankRequest", "TeiRerankRequest"}
    exposition = client.get("/metrics").text  # counted under their own paths, not "other"
    assert 'ivy_requests_total{route="/score",status="200"}' in exposition
    assert 'ivy_requests_total{route="/embeddings",status="200"}' in exposition


def test_tei_rerank_with_a_cross_encoder(tmp_path) -> None:
    folder = bert_reranker(tmp_path)
    with FakeTulip(model_dir=folder) as fake, gateway(fake, model=str(folder)) as client:
        r = client.post("/rerank", json={"query": QUERY, "texts": DOCS})
        assert r.status_code == 200, r.text
        enc = Tokenizer(load_spec(folder)).encode_pairs([(QUERY, d) for d in DOCS])
        want = fake_scores([e.ids for e in enc], [e.type_ids for e in enc])[:, 0]
        assert [x["index"] for x in r.json()] == list(np.argsort(-want, kind="stable"))
        np.testing.assert_allclose(sorted(x["score"] for x in r.json()), sorted(want), atol=1e-6)


def test_tei_similarity_is_the_symmetric_cosine(client) -> None:
    r = client.post("/similarity", json={"inputs": {"source_sentence": QUERY, "sentences": DOCS},
                                         "parameters": {"truncate": True, "truncation_direction": "Left"}})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json(), _cosines(QUERY, DOCS), atol=1e-5)  # no query/document templates
    assert client.post("/similarity", json={"inputs": {"source_sentence": QUERY, "sentences": DOCS}}).json() == r.json()
    assert 'ivy_requests_total{route="/similarity",status="200"}' in client.get("/metrics").text


def test_tei_similarity_errors_name_its_fields(client) -> None:
    def param(body) -> str:
        r = client.post("/similarity", json=body)
        assert 400 <= r.status_code < 500, r.text
        return r.json()["error"]["param"]

    assert param({"inputs": {"source_sentence": "", "sentences": DOCS}}) == "inputs.source_sentence"
    assert param({"inputs": {"source_sentence": QUERY, "sentences": ["ok", ""]}}) == "inputs.sentences[1]"
    assert param({"inputs": {"source_sentence": QUERY, "sentences": DOCS},
                  "parameters": {"prompt_name": "nope"}}) == "parameters.prompt_name"
    assert param({"inputs": {"source_sentence": "word " * 400, "sentences": DOCS}}) == "inputs.source_sentence"
    assert param({"inputs": {"source_sentence": QUERY, "sentences": DOCS},
                  "parameters": {"truncation_direction": "Up"}}) == "parameters.truncation_direction"  # as sent
    assert param({"inputs": {"sentences": DOCS}}).startswith("inputs")
    r = client.post("/similarity", json={"inputs": {"source_sentence": QUERY, "sentences": ["b"] * 2048}})
    assert r.status_code == 422 and "2048 items; at most 2047" in r.json()["error"]["message"]  # + the source


def test_similarity_needs_an_embedding_model(tmp_path) -> None:
    folder = bert_reranker(tmp_path)
    with FakeTulip(model_dir=folder) as fake, gateway(fake, model=str(folder)) as client:
        r = client.post("/similarity", json={"inputs": {"source_sentence": QUERY, "sentences": DOCS}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
        assert "rerank" in r.json()["error"]["message"]


def test_detokenize_and_decode_are_the_way_back_from_tokenize(client) -> None:
    ids = TOKENIZER.encode("hello world, good morning").ids
    r = client.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": TOKENIZER.hf.decode(ids, skip_special_tokens=False)}
    assert r.json()["prompt"].startswith("[CLS] hello world")  # vLLM keeps the special tokens
    assert client.post("/decode", json={"ids": ids}).json() == ["hello world, good morning"]
    both = client.post("/decode", json={"ids": [ids, ids[:3]], "skip_special_tokens": False}).json()
    assert both == [TOKENIZER.hf.decode(ids, skip_special_tokens=False), "[CLS] hello world"]
    assert client.post("/decode", json={"ids": []}).json() == [""]


def test_a_peer_field_a_route_does_not_take_is_ignored(client) -> None:
    """truncation_direction is read only where truncation_side is a field; elsewhere it is ignored like any
    other unknown field (other servers' SDKs send their own)."""
    assert client.post("/tokenize", json={"prompt": "hi", "truncation_direction": "bogus"}).status_code == 200
    assert client.post("/tokenize", json={"prompt": "hi"}, headers={"x-priority": "urgent"}).status_code == 200


def test_decode_takes_the_untruncated_ids_tokenize_gives(client) -> None:
    text = " ".join(["hello world"] * 200)  # ~400 tokens, over the model's 256
    ids = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert len(ids) > 256
    r = client.post("/decode", json={"ids": [ids, ids[:3]]})
    assert r.status_code == 200 and r.json() == [text, "hello world hello"], r.text
    ids = client.post("/tokenize", json={"prompt": "!" * 4096}).json()["tokens"]  # the input cap, specials on top
    assert len(ids) > 4096 and client.post("/decode", json={"ids": ids}).status_code == 200


def test_detokenize_and_decode_errors_name_the_id(client) -> None:
    r = client.post("/detokenize", json={"tokens": [101, 10**6]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "tokens[1]", r.text
    r = client.post("/decode", json={"ids": [[101], [7, -1]]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "ids[1][1]"
    r = client.post("/decode", json={"ids": [1000] * (64 * 4096 + 1)})  # over what /tokenize takes, in characters
    assert r.status_code == 422 and r.json()["error"]["param"] == "ids" and "at most 262144" in r.json()["error"]["message"]
    assert client.post("/detokenize", json={"tokens": ["a"]}).status_code == 422
    for ids, where in (([[1], 2], "ids[1]"), ([1, [2]], "ids[1]"), ([[[1]]], "ids[0][0]"), ([True], "ids[0]"),
                       ("abc", "ids")):
        r = client.post("/decode", json={"ids": ids})
        assert r.status_code == 422 and r.json()["error"]["param"] == where, (ids, r.text)


def test_tei_info_reports_the_model_and_the_limits_clients_size_requests_by(client, fake) -> None:
    r = client.get("/info")
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["model_id"] == info["served_model_name"] == client.get("/v1/models").json()["data"][0]["id"]
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] == 2048
    assert info["max_batch_tokens"] > 0 and info["auto_truncate"] is False and info["model_dtype"] == "float32"


def test_tei_info_names_last_token_pooling_as_tei_does(client) -> None:
    from dataclasses import replace

    from ivy.app import _tei_info

    gw = client.app.state.gateway
    gw.spec = replace(gw.spec, pooling="last")  # a decoder embedder's (Qwen3, e5-mistral)
    assert _tei_info(gw)["model_type"] == {"embedding": {"pooling": "last_token"}}


def test_tei_info_of_a_reranker(tmp_path) -> None:
    folder = bert_reranker(tmp_path)
    with FakeTulip(model_dir=folder) as fake, gateway(fake, model=str(folder), api_key="k") as client:
        assert client.get("/info").status_code == 401  # behind the key like every route but the probes
        info = client.get("/info", headers={"authorization": "Bearer k"}).json()
        assert list(info["model_type"]) == ["reranker"]


def _python_calls(fn) -> int:
    """How many calls (Python functions and builtins called from Python) `fn()` makes."""
    calls = 0

    def count(frame, event, arg) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_decode_ids_are_checked_in_c_not_per_id_on_the_event_loop() -> None:
    """RELIABILITY 9 (and the loop's promise in ivy.tokenization): /decode's body is validated on the event loop,
    and its `ids` were checked with a Python call or two per id: 2 MB of ids (a million) held the loop ~180 ms
    before any cap was checked, 18 times what the same ids cost /v1/embeddings (ivy.inputs._all_ints, in C).
    Now a few calls per sequence; an error still names the first bad element."""
    from ivy.token_schemas import DecodeRequest

    for ids in ([1] * 100_000, [[1] * 400] * 250):
        assert _python_calls(lambda ids=ids: DecodeRequest.model_validate({"ids": ids})) < 5_000, len(ids)
    for ids, param in (([1, 2, True], "ids[2]"), ([1, 2.0], "ids[1]"), ([[1], [2, "3"]], "ids[1][1]"),
                       ([[1], 2], "ids[1]"), ([1, [2]], "ids[1]")):
        with pytest.raises(IvyError) as err:
            DecodeRequest.model_validate({"ids": ids})
        assert err.value.param == param, (ids, err.value.param)
