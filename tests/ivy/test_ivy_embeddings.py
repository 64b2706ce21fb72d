"""POST /v1/embeddings against fake replicas: shape, encodings, dimensions, token ids, usage, truncation, templating."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from ivy_testkit import MODEL, gateway, model_copy
from fake_tulip import FakeTulip, fake_rows
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

TOKENIZER = Tokenizer(load_spec(bundled_model_dir()))
TEXTS = ["The cat sat on the mat.", "A quick brown fox", "Embeddings are vectors"]


def reference(texts: list[str], dims: int = 0) -> np.ndarray:
    seqs = [e.ids for e in TOKENIZER.encode_batch(texts)]
    rows = fake_rows(seqs, 384)
    if dims:
        rows = rows[:, :dims]
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _vectors(body: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def test_openai_shape_order_and_exact_usage(client) -> None:
    r = client.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in body["data"])
    np.testing.assert_allclose(_vectors(body), reference(TEXTS), atol=1e-6)
    tokens = sum(len(e.ids) for e in TOKENIZER.encode_batch(TEXTS))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    single = client.post("/v1/embeddings", json={"input": TEXTS[1]}).json()  # a bare string, model omitted
    np.testing.assert_allclose(_vectors(single)[0], reference(TEXTS)[1], atol=1e-6)


def test_encodings_agree_with_float(client) -> None:
    floats = _vectors(client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "float"}).json())
    b64 = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"}).json()
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64["data"]])
    np.testing.assert_array_equal(decoded, floats)
    i8 = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64_int8"}).json()
    ints = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.int8) for d in i8["data"]])
    scale = np.abs(floats).max(axis=1, keepdims=True) / 127.0
    np.testing.assert_array_equal(ints, np.clip(np.rint(floats / scale), -127, 127).astype(np.int8))
    binary = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64_binary"}).json()
    bits = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.uint8) for d in binary["data"]])
    assert bits.shape == (3, 384 // 8)
    np.testing.assert_array_equal(np.unpackbits(bits, axis=1, bitorder="little").astype(bool), floats > 0)


def test_dimensions_truncate_then_renormalize(client) -> None:
    body = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 64}).json()
    vectors = _vectors(body)
    assert vectors.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors, reference(TEXTS, 64), atol=1e-6)
    for bad in (0, 385, -3):
        r = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": bad})
        assert r.status_code == 422 and r.json()["error"]["param"] == "dimensions"
    raw = _vectors(client.post("/v1/embeddings", json={"input": TEXTS, "normalize": False}).json())
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_token_id_inputs(client) -> None:
    ids = [e.ids for e in TOKENIZER.encode_batch(TEXTS)]
    body = client.post("/v1/embeddings", json={"input": ids}).json()
    np.testing.assert_allclose(_vectors(body), reference(TEXTS), atol=1e-6)
    one = client.post("/v1/embeddings", json={"input": ids[0]}).json()
    assert len(one["data"]) == 1 and one["usage"]["prompt_tokens"] == len(ids[0])
    for bad in (10**6, -1, 2**64 - 1, 2**70):
        r = client.post("/v1/embeddings", json={"input": [[1, 2], [5, bad]]})
        assert r.status_code == 422 and r.json()["error"]["param"] == "input[1][1]", r.text
    long_ids = list(range(1000, 1300))
    r = client.post("/v1/embeddings", json={"input": [long_ids]})
    assert r.status_code == 422 and "300 tokens; the model takes at most 256" in r.json()["error"]["message"]
    cut = client.post("/v1/embeddings", json={"input": [long_ids], "truncate": True, "truncation_side": "left"})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 256
    tei = client.post("/v1/embeddings", json={"input": [long_ids], "truncate": True, "truncation_direction": "Left"})
    right = client.post("/v1/embeddings", json={"input": [long_ids], "truncate": True})
    assert _vectors(tei.json()).tolist() == _vectors(cut.json()).tolist() != _vectors(right.json()).tolist()
    bad = client.post("/v1/embeddings", json={"input": [long_ids], "truncation_direction": "middle"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "truncation_direction"  # the field sent


def test_too_long_input_422_or_truncated_with_exact_usage(client) -> None:
    """RELIABILITY 6 and 7."""
    text = "word " * 400
    n = TOKENIZER.encode(text, 10**6).original_length
    r = client.post("/v1/embeddings", json={"input": ["ok", text]})
    assert r.status_code == 422
    assert r.json()["error"]["message"].startswith(f"input[1] has {n} tokens; the model takes at most 256")
    assert r.json()["error"]["param"] == "input[1]"
    ok = client.post("/v1/embeddings", json={"input": ["ok", text], "truncate": True})
    assert ok.status_code == 200
    assert ok.json()["usage"]["prompt_tokens"] == len(TOKENIZER.encode("ok").ids) + 256
    huge = client.post("/v1/embeddings", json={"input": ["x" * 100_000]})  # the character cap, before tokenizing
    assert huge.status_code == 422 and "characters" in huge.json()["error"]["message"]
    assert client.post("/v1/embeddings", json={"input": ["x " * 50_000], "truncate": True}).status_code == 200


def test_server_default_truncate_flag(fake) -> None:
    with gateway(fake, truncate=True) as client:
        assert client.post("/v1/embeddings", json={"input": "word " * 400}).status_code == 200
        assert client.post("/v1/embeddings", json={"input": "word " * 400, "truncate": False}).status_code == 422


def test_input_type_and_prompt_name_templating(tmp_path) -> None:
    folder = model_copy(tmp_path, "prompted", st_config={"prompts": {"query": "query: ", "document": "passage: ",
                                                                     "qa": "Question: "}})
    with FakeTulip(model_dir=folder) as fake, gateway(fake, model=str(folder)) as client:
        def vec(body):
            r = client.post("/v1/embeddings", json=body)
            assert r.status_code == 200, r.text
            return _vectors(r.json())[0], r.json()["usage"]["prompt_tokens"]

        plain, n_plain = vec({"input": "hello there"})
        query, n_query = vec({"input": "hello there", "input_type": "query"})
        np.testing.assert_allclose(query, vec({"input": "query: hello there"})[0], atol=1e-6)
        assert n_query > n_plain and not np.allclose(query, plain)
        np.testing.assert_allclose(vec({"input": "hello there", "input_type": "search_document"})[0],
                                   vec({"input": "passage: hello there"})[0], atol=1e-6)
        np.testing.assert_allclose(vec({"input": "hello there", "prompt_name": "qa"})[0],
                                   vec({"input": "Question: hello there"})[0], atol=1e-6)
        r = client.post("/v1/embeddings", json={"input": "x", "prompt_name": "nope"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "prompt_name"


def test_configured_prefixes_when_the_model_has_no_prompts(fake) -> None:
    with gateway(fake, query_prefix="search_query: ") as client:
        a = client.post("/v1/embeddings", json={"input": "hello", "input_type": "query"}).json()
        b = client.post("/v1/embeddings", json={"input": "search_query: hello"}).json()
        c = client.post("/v1/embeddings", json={"input": "hello", "input_type": "document"}).json()
        d = client.post("/v1/embeddings", json={"input": "hello"}).json()
    np.testing.assert_allclose(_vectors(a), _vectors(b), atol=1e-6)
    np.testing.assert_allclose(_vectors(c), _vectors(d), atol=1e-6)


def test_native_int8_models_default_to_base64_int8(tmp_path) -> None:
    folder = model_copy(tmp_path, "pplx-embed-tiny", config={"model_type": "bidirectional_pplx_qwen3"})
    with FakeTulip(model_dir=folder) as fake, gateway(fake, model=str(folder)) as client:
        body = client.post("/v1/embeddings", json={"input": TEXTS}).json()
        ints = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.int8) for d in body["data"]])
        floats = _vectors(client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "float"}).json())
    assert ints.shape == (3, 384) and np.abs(ints).max() > 1
    # float is the same native int8 vector (this copy keeps MiniLM's Normalize module, so unit length)
    np.testing.assert_allclose(ints / np.linalg.norm(ints.astype(np.float32), axis=1, keepdims=True), floats,
                               atol=1e-6)


@pytest.mark.parametrize("n_inputs, status", [(4, 200), (5, 422)])
def test_input_count_limit(fake, n_inputs, status) -> None:
    """RELIABILITY 3."""
    with gateway(fake, max_inputs_per_request=4) as client:
        r = client.post("/v1/embeddings", json={"input": ["a"] * n_inputs})
    assert r.status_code == status
    if status == 422:
        assert "at most 4" in r.json()["error"]["message"] and r.json()["error"]["code"] == "too_many_inputs"


def test_tokenize_counts_every_token_untruncated(client) -> None:
    long_text = "word " * 400  # over the model's 256: /tokenize never cuts
    full = TOKENIZER.encode(long_text, 10**6).ids
    r = client.post("/tokenize", json={"prompt": long_text})
    assert r.status_code == 200
    assert r.json() == {"count": len(full), "max_model_len": 256, "tokens": full, "token_strs": None}
    bare = client.post("/tokenize", json={"prompt": "hello world", "add_special_tokens": False}).json()
    assert bare["tokens"] == TOKENIZER.encode("hello world").ids[1:-1] and bare["count"] == 2
    assert client.post("/tokenize", json={"prompt": "x", "model": "other"}).status_code == 404
    assert client.post("/tokenize", json={}).json()["error"]["param"] == "prompt"
    huge = client.post("/tokenize", json={"prompt": "x" * (64 * 4096 + 1)})
    assert huge.status_code == 422 and huge.json()["error"]["param"] == "prompt"
    assert "at most 262144" in huge.json()["error"]["message"]


def test_tei_embed_route_for_its_clients(client) -> None:
    """text-embeddings-inference's /embed: `inputs` in, a bare list of normalized float lists out."""
    texts = ["hello world", "good morning"]
    ours = client.post("/v1/embeddings", json={"input": texts, "normalize": True}).json()
    tei = client.post("/embed", json={"inputs": texts})
    assert tei.status_code == 200 and isinstance(tei.json(), list)
    np.testing.assert_allclose(tei.json(), [d["embedding"] for d in ours["data"]], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(tei.json(), axis=1), 1.0, atol=1e-5)
    one = client.post("/embed", json={"inputs": "hello world", "dimensions": 32}).json()
    assert len(one) == 1 and len(one[0]) == 32
    long = client.post("/embed", json={"inputs": ["word " * 400], "truncate": True, "truncation_direction": "Left"})
    assert long.status_code == 200
    root = client.post("/", json={"inputs": texts})  # huggingface_hub's feature_extraction posts to the base URL
    np.testing.assert_allclose(root.json(), tei.json(), atol=1e-6)
    assert 'ivy_requests_total{route="/",status="200"}' in client.get("/metrics").text  # its own, not "other"
    bad = client.post("/embed", json={"inputs": ["a", ""]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "inputs[1]"
    too_long = client.post("/embed", json={"inputs": ["word " * 400]})
    assert too_long.status_code == 422 and too_long.json()["error"]["param"] == "inputs[0]"


@pytest.mark.parametrize("route, field", [("/v1/embeddings", "input"), ("/embed", "inputs"), ("/pooling", "input")])
def test_one_text_sent_as_a_string_is_named_by_its_field(client, fake, route, field) -> None:
    """RELIABILITY 9 and 35: an over-long text sent as the field itself ("input": "...") was named input[0], an
    element that does not exist (as a flat list of ids once was); a text in a list keeps its index."""
    for text, code in (("word " * 400, "input_too_long"), ("x" * 100_000, "input_too_long")):
        error = client.post(route, json={field: text}).json()["error"]
        assert (error["param"], error["code"]) == (field, code), error
        assert error["message"].startswith(f"{field} has "), error["message"]
        listed = client.post(route, json={field: ["ok", text]}).json()["error"]
        assert listed["param"] == f"{field}[1]" and listed["message"].startswith(f"{field}[1] has "), listed
    assert fake.calls == []
