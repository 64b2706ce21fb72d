"""POST /pooling, vLLM's pooling API, for an embedding model: vLLM's response shape for each input kind, the
vectors and usage of /v1/embeddings, base64, truncate_prompt_tokens, lanes, and a 4xx naming each vLLM field Ivy
cannot honour (reaching no replica)."""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest
from starlette.routing import Match, Route
from cross_folders import bert_reranker
from fake_tulip import FakeTulip
from ivy_testkit import MODEL, gateway

from ivy.app import create_app
from ivy.config import IvyConfig
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

TOKENIZER = Tokenizer(load_spec(bundled_model_dir()))
TEXTS = ["The cat sat on the mat.", "A quick brown fox", "Embeddings are vectors"]
IDS = [e.ids for e in TOKENIZER.encode_batch(TEXTS)]
INPUTS = {"str": TEXTS[0], "list of str": TEXTS, "ids": IDS[1], "list of ids": IDS}
LONG = "hello world " * 200  # ~400 tokens, over the model's 256


def _pooled(body: dict) -> np.ndarray:
    return np.array([d["data"] for d in body["data"]], dtype=np.float32)


def _embedded(body: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


@pytest.mark.parametrize("kind", list(INPUTS))
def test_vllm_shape_for_each_input_kind(client, kind) -> None:
    before = int(time.time())
    r = client.post("/pooling", json={"model": MODEL, "input": INPUTS[kind]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]  # vLLM's PoolingResponse, in order
    assert body["id"] == f"pool-{r.headers['x-request-id']}" and body["object"] == "list"
    assert before <= body["created"] <= time.time() and body["model"] == MODEL
    n = 1 if kind in ("str", "ids") else 3
    assert [list(d) for d in body["data"]] == [["index", "object", "data"]] * n
    assert [d["index"] for d in body["data"]] == list(range(n)) and {d["object"] for d in body["data"]} == {"pooling"}
    assert all(len(d["data"]) == 384 and isinstance(d["data"][0], float) for d in body["data"])
    tokens = {"str": len(IDS[0]), "ids": len(IDS[1])}.get(kind, sum(map(len, IDS)))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                             "prompt_tokens_details": None}


@pytest.mark.parametrize("kind", list(INPUTS))
def test_vectors_and_usage_are_those_of_v1_embeddings(client, kind) -> None:
    for extra in ({}, {"dimensions": 64}, {"normalize": False}):
        pooled = client.post("/pooling", json={"input": INPUTS[kind], **extra}).json()
        embedded = client.post("/v1/embeddings", json={"input": INPUTS[kind], **extra}).json()
        np.testing.assert_array_equal(_pooled(pooled), _embedded(embedded))
        assert pooled["usage"]["prompt_tokens"] == embedded["usage"]["prompt_tokens"]
    raw = client.post("/v1/embeddings", json={"input": INPUTS[kind], "normalize": False}).json()
    activation = client.post("/pooling", json={"input": INPUTS[kind], "use_activation": False}).json()
    np.testing.assert_array_equal(_pooled(activation), _embedded(raw))  # vLLM's newer name for normalize


def test_base64_decodes_to_the_float_vectors(client) -> None:
    floats = _pooled(client.post("/pooling", json={"input": TEXTS}).json())
    for extra in ({}, {"embed_dtype": "float32", "endianness": "little"}, {"endianness": "native"}):
        b64 = client.post("/pooling", json={"input": TEXTS, "encoding_format": "base64", **extra}).json()
        assert all(isinstance(d["data"], str) for d in b64["data"])
        decoded = np.stack([np.frombuffer(base64.b64decode(d["data"]), dtype="<f4") for d in b64["data"]])
        np.testing.assert_array_equal(decoded, floats)
    for fmt in ("base64_int8", "base64_binary"):  # Ivy's own encodings, as /v1/embeddings answers them
        pooled = client.post("/pooling", json={"input": TEXTS, "encoding_format": fmt}).json()
        embedded = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": fmt}).json()
        assert [d["data"] for d in pooled["data"]] == [d["embedding"] for d in embedded["data"]]


def test_usage_counts_the_tokens_sent(client, fake) -> None:
    body = client.post("/pooling", json={"input": TEXTS}).json()
    assert body["usage"]["prompt_tokens"] == sum(map(len, IDS)) == fake.tokens_served
    assert client.post("/pooling", json={"input": [5, 6, 7]}).json()["usage"]["total_tokens"] == 3


def test_truncate_prompt_tokens(client, fake) -> None:
    r = client.post("/pooling", json={"input": ["ok", LONG]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "input[1]", r.text  # none: too long is an error
    for cut in ({"truncate_prompt_tokens": -1}, {"truncate": True}):
        body = client.post("/pooling", json={"input": ["ok", LONG], **cut}).json()
        assert body["usage"]["prompt_tokens"] == len(TOKENIZER.encode("ok").ids) + 256, cut
    content = TOKENIZER.encode(LONG).ids[1:-1]
    for side, kept in (("right", content[:8]), ("left", content[-8:])):  # a text's k counts its [CLS] and [SEP]
        body = client.post("/pooling", json={"input": LONG, "truncate_prompt_tokens": 10,
                                             "truncation_side": side}).json()
        same = client.post("/v1/embeddings", json={"input": [IDS[0][:1] + kept + IDS[0][-1:]]}).json()
        assert body["usage"]["prompt_tokens"] == 10 and fake.calls[-2].tokens == 10
        np.testing.assert_array_equal(_pooled(body), _embedded(same))
    ids = list(range(1000, 1020))
    for side, kept in (("right", ids[:5]), ("left", ids[-5:])):  # ids are cut as sent
        body = client.post("/pooling", json={"input": ids, "truncate_prompt_tokens": 5, "truncation_side": side})
        same = client.post("/v1/embeddings", json={"input": kept}).json()
        np.testing.assert_array_equal(_pooled(body.json()), _embedded(same))
        assert body.json()["usage"]["prompt_tokens"] == 5
    short = client.post("/pooling", json={"input": "hi", "truncate_prompt_tokens": 200}).json()
    assert short["usage"]["prompt_tokens"] == len(TOKENIZER.encode("hi").ids)  # nothing to cut


def test_v1_embeddings_takes_truncate_prompt_tokens_as_vllm_does(client, fake) -> None:
    """vLLM's clients send truncate_prompt_tokens to /v1/embeddings too: k keeps k tokens there as well (before,
    the field was ignored and the whole input embedded), -1 cuts to the model's length, a bad k names the field."""
    content = TOKENIZER.encode(LONG).ids[1:-1]
    body = client.post("/v1/embeddings", json={"input": LONG, "truncate_prompt_tokens": 10}).json()
    same = client.post("/v1/embeddings", json={"input": [IDS[0][:1] + content[:8] + IDS[0][-1:]]}).json()
    assert body["usage"]["prompt_tokens"] == 10
    np.testing.assert_array_equal(_embedded(body), _embedded(same))
    assert client.post("/v1/embeddings", json={"input": LONG, "truncate_prompt_tokens": -1}).json()["usage"][
        "prompt_tokens"] == 256
    r = client.post("/v1/embeddings", json={"input": LONG, "truncate_prompt_tokens": 1})
    assert r.status_code == 422 and r.json()["error"]["param"] == "truncate_prompt_tokens", r.text


def test_v1_embeddings_takes_use_activation_as_vllm_does(client) -> None:
    """vLLM's name for an embedding's normalization, sent to /v1/embeddings: false gives the raw rows (it was
    ignored, and the rows came normalized)."""
    raw = client.post("/v1/embeddings", json={"input": "hello there", "normalize": False}).json()
    for flag, like in ((False, raw), (True, client.post("/v1/embeddings", json={"input": "hello there"}).json())):
        body = client.post("/v1/embeddings", json={"input": "hello there", "use_activation": flag}).json()
        np.testing.assert_array_equal(_embedded(body), _embedded(like))
    assert abs(np.linalg.norm(_embedded(raw)[0]) - 1) > 1e-3  # the fake's raw rows are not unit vectors


def _error(client, body: dict) -> tuple[int, str, str]:
    r = client.post("/pooling", json=body)
    assert 400 <= r.status_code < 500, (body, r.text)
    return r.status_code, r.json()["error"]["param"], r.json()["error"]["message"]


@pytest.mark.parametrize("extra,status,param,says", [
    ({"messages": [{"role": "user", "content": "hi"}]}, 422, "messages", "chat input is not served"),
    ({"task": "classify"}, 400, "task", "/classify"),
    ({"task": "token_embed"}, 400, "task", "/embed_multi_vector"),
    ({"task": "encode"}, 400, "task", "removed"),
    ({"task": "plugin"}, 400, "task", "plugins"),
    ({"task": "something"}, 400, "task", '"embed" only'),
    ({"encoding_format": "msgpack"}, 422, "encoding_format", '"bytes_only"'),
    ({"embed_dtype": "fp8", "encoding_format": "base64"}, 422, "embed_dtype", "fp8_e4m3"),
    ({"embed_dtype": "float16", "encoding_format": "base64_int8"}, 422, "embed_dtype", "base64_int8 has its own"),
    ({"endianness": "middle"}, 422, "endianness", "'native', 'little' or 'big'"),
    ({"add_special_tokens": False}, 422, "add_special_tokens", "special tokens"),
    ({"padding": "max_length"}, 422, "padding", "unpadded"),
    ({"mm_processor_kwargs": {"size": 224}}, 422, "mm_processor_kwargs", "multimodal"),
    ({"truncate_prompt_tokens": 257}, 422, "truncate_prompt_tokens", "between 3 (a text's 2 special tokens"),
    ({"truncate_prompt_tokens": 2}, 422, "truncate_prompt_tokens", "and 256, got 2"),
    ({"truncate_prompt_tokens": -2}, 422, "truncate_prompt_tokens", "-1 (the model's length, 256)"),
    ({"truncate_prompt_tokens": "5"}, 422, "truncate_prompt_tokens", "integer"),
    ({"truncate_prompt_tokens": 5, "truncate": False}, 422, "truncate", "contradicts"),
    ({"dimensions": 385}, 422, "dimensions", "between 1 and 384"),
    ({"priority": "urgent"}, 422, "priority", "vLLM's priority"),
    ({"request_id": "has spaces"}, 422, "request_id", "pattern"),
    ({"truncation_side": "middle"}, 422, "truncation_side", ""),
    ({"input": []}, 400, "input", "must not be empty"),
    ({"input": [1, "a"]}, 422, "input[1]", "token id"),
    ({"model": "gpt-9"}, 404, "model", "not served here"),
])
def test_what_ivy_cannot_honour_is_a_4xx_naming_the_field(client, fake, extra, status, param, says) -> None:
    code, named, message = _error(client, {"input": "hi", **extra})
    assert (code, named) == (status, param) and says in message, message
    assert fake.calls == []  # refused before any replica


def test_a_plugin_request_names_data(client) -> None:
    assert _error(client, {"data": {"image": "..."}})[:2] == (422, "data")
    assert _error(client, {"messages": [{"role": "user", "content": "hi"}]})[:2] == (422, "messages")  # no input


def test_a_body_with_vllm_defaults_written_out_is_served(client) -> None:
    """What a client serializing vLLM's whole PoolingCompletionRequest sends: every default, nulls included."""
    body = {"model": MODEL, "user": None, "input": TEXTS, "truncate_prompt_tokens": None, "padding": None,
            "truncation_side": None, "request_id": "0123abcd", "priority": 0, "mm_processor_kwargs": None,
            "cache_salt": None, "add_special_tokens": True, "encoding_format": "float", "embed_dtype": "float32",
            "endianness": "native", "dimensions": None, "use_activation": None, "task": "embed"}
    r = client.post("/pooling", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "pool-0123abcd"  # the body's request_id, as vLLM returns it
    np.testing.assert_array_equal(_pooled(r.json()), _embedded(client.post("/v1/embeddings",
                                                                            json={"input": TEXTS}).json()))
    with_header = client.post("/pooling", json=body, headers={"x-request-id": "trace-7"})
    assert with_header.json()["id"] == "pool-trace-7"  # X-Request-Id wins, as in vLLM


def test_priority_maps_to_ivy_lanes(client, fake) -> None:
    """vLLM's priority (lower is earlier) on Ivy's lanes: < 0 interactive, > 0 bulk (ivy/lanes.py); 0, vLLM's
    default, is served as omitted (by size), so a client that writes every default out is not all interactive."""
    large = [[1000 + i] * 250 for i in range(20)]  # 5000 tokens, over --bulk-above-tokens' 4096: bulk by size
    for body, lane in (({"input": "hi", "priority": 1}, 1), ({"input": "hi", "priority": -5}, 0),
                       ({"input": "hi", "priority": "bulk"}, 1), ({"input": "hi", "priority": 0}, 0),
                       ({"input": large, "priority": 0}, 1), ({"input": large, "priority": 0.0}, 1),
                       ({"input": large, "priority": -1}, 0), ({"input": large, "priority": "interactive"}, 0)):
        assert client.post("/pooling", json=body).status_code == 200
        assert fake.calls[-1].lane == lane, body["priority"]


def test_a_reranker_answers_400_naming_the_model(tmp_path) -> None:
    folder = bert_reranker(tmp_path)
    with FakeTulip(model_dir=folder) as fake, gateway(fake, model=str(folder)) as client:
        code, param, message = _error(client, {"input": "hi"})
        assert (code, param) == (400, "model") and "rerank" in message and fake.calls == []


def test_pooling_is_hot_lean_documented_and_counted(client) -> None:
    app = create_app(IvyConfig())
    assert "/pooling" in app._hot  # ahead of the middleware stack, as /v1/embeddings
    scope = {"type": "http", "path": "/pooling", "method": "POST", "root_path": ""}
    first = next(r for r in app.router.routes if r.matches(scope)[0] is Match.FULL)
    assert type(first) is Route  # the lean twin, not FastAPI's APIRoute
    paths = client.get("/openapi.json").json()["paths"]
    schema = paths["/pooling"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["title"] == "PoolingRequest" and {"truncate_prompt_tokens", "task"} <= set(schema["properties"])
    r = client.post("/pooling", json={"input": TEXTS})
    assert {"x-request-id", "x-total-time", "x-tokenization-time"} <= set(r.headers)  # TEI's timing headers too
    exposition = client.get("/metrics").text
    assert 'ivy_requests_total{route="/pooling",status="200"}' in exposition
    assert 'ivy_tokens_total{route="/pooling"}' in exposition and 'ivy_inputs_total{route="/pooling"}' in exposition
