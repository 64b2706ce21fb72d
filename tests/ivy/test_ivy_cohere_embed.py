"""POST /v2/embed, Cohere's embed API v2 (the cohere SDK's ClientV2.embed; vLLM serves it too): the same vectors
as /v1/embeddings for the same texts, prompt, cut and dimensions, by type (float, base64, binary, ubinary) with
Cohere's bit order, its meta and texts; what a text-only server cannot honour is a 422 naming the field."""

from __future__ import annotations

import base64

import numpy as np
import pytest

TEXTS = ["where do cats sleep", "cats sleep on the sofa", "stock prices fell today"]
LONG = " ".join(["alpha", "beta", "gamma", "delta", "cats", "sofa", "stock", "prices"] * 50)


def openai_rows(client, texts, **extra) -> tuple[np.ndarray, int]:
    body = client.post("/v1/embeddings", json={"input": texts, **extra}).json()
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32), body["usage"]["prompt_tokens"]


@pytest.mark.parametrize("input_type", ["search_document", "search_query"])
def test_every_type_is_the_openai_route_s_vector(client, input_type) -> None:
    want, tokens = openai_rows(client, TEXTS, input_type=input_type)
    r = client.post("/v2/embed", json={"texts": TEXTS, "input_type": input_type,
                                       "embedding_types": ["ubinary", "float", "base64", "binary"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body["embeddings"]) == ["ubinary", "float", "base64", "binary"]  # the types asked, in that order
    np.testing.assert_array_equal(np.array(body["embeddings"]["float"], dtype=np.float32), want)
    decoded = [np.frombuffer(base64.b64decode(b), dtype="<f4") for b in body["embeddings"]["base64"]]
    np.testing.assert_array_equal(np.stack(decoded), want)
    bits = np.packbits(want >= 0, axis=1)  # most significant bit first, a value >= 0 sets its bit
    assert body["embeddings"]["ubinary"] == bits.tolist() and len(bits[0]) == 384 // 8
    assert body["embeddings"]["binary"] == (bits.astype(int) - 128).tolist()
    assert body["texts"] == TEXTS and body["response_type"] == "embeddings_by_type"
    assert body["meta"] == {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}}
    assert body["id"].startswith("embd-")


def test_float_by_default_inputs_blocks_and_output_dimension(client) -> None:
    want, _ = openai_rows(client, TEXTS[:2], dimensions=64)
    blocks = [{"content": [{"type": "text", "text": t}]} for t in TEXTS[:2]]
    body = client.post("/v2/embed", json={"inputs": blocks, "output_dimension": 64}).json()
    assert list(body["embeddings"]) == ["float"] and body["texts"] == TEXTS[:2]
    np.testing.assert_array_equal(np.array(body["embeddings"]["float"], dtype=np.float32), want)
    renamed = client.post("/v2/embed", json={"texts": TEXTS[:2], "dimensions": 64}).json()  # every other route's name
    np.testing.assert_array_equal(np.array(renamed["embeddings"]["float"], dtype=np.float32), want)


def test_the_sdk_s_nulls_are_the_defaults(client) -> None:
    """cohere's SDK sends null for every argument left None: truncate null cuts as END does."""
    nulls = {"input_type": None, "embedding_types": None, "truncate": None, "max_tokens": None,
             "output_dimension": None, "priority": None, "images": None, "inputs": None}
    long = [" ".join(["alpha", "beta"] * 300)]
    a = client.post("/v2/embed", json={"texts": long, **nulls})
    b = client.post("/v2/embed", json={"texts": long, "truncate": "END"})
    assert a.status_code == b.status_code == 200, a.text
    assert a.json()["embeddings"] == b.json()["embeddings"]


def test_truncate_end_start_none_and_max_tokens(client, fake) -> None:
    def sent_ids(**extra) -> list[int]:
        assert client.post("/v2/embed", json={"texts": [LONG, "short"], **extra}).status_code == 200
        ids = np.frombuffer(fake.calls[-1].token_ids, dtype="<i4")
        return ids.tolist()

    end, start = sent_ids(), sent_ids(truncate="START")
    client.post("/v1/embeddings", json={"input": [LONG, "short"], "truncate": True})
    assert end == np.frombuffer(fake.calls[-1].token_ids, dtype="<i4").tolist()
    client.post("/v1/embeddings", json={"input": [LONG, "short"], "truncate": True, "truncation_side": "left"})
    assert start == np.frombuffer(fake.calls[-1].token_ids, dtype="<i4").tolist() and start != end
    cut = sent_ids(max_tokens=6)
    client.post("/v1/embeddings", json={"input": [LONG, "short"], "truncate_prompt_tokens": 6})
    assert cut == np.frombuffer(fake.calls[-1].token_ids, dtype="<i4").tolist()
    calls = len(fake.calls)
    none = client.post("/v2/embed", json={"texts": ["short", LONG], "truncate": "NONE"})
    assert none.status_code == 422 and none.json()["error"]["param"] == "texts[1]"
    assert "truncate END or START" in none.json()["error"]["message"]  # Cohere's names, not truncate=true
    over = client.post("/v2/embed", json={"texts": ["short", "a longer text than that"], "truncate": "NONE",
                                          "max_tokens": 4})
    error = over.json()["error"]
    assert over.status_code == 422 and error["param"] == "texts[1]" and "max_tokens (4)" in error["message"]
    assert len(fake.calls) == calls


@pytest.mark.parametrize("body, param, says", [
    ({"texts": ["hi"], "images": ["data:image/png;base64,AAAA"]}, "images", "no images"),
    ({"texts": ["hi"], "input_type": "image"}, "input_type", "no images"),
    ({"texts": ["hi"], "embedding_types": ["int8"]}, "embedding_types", "int8 is not served"),
    ({"texts": ["hi"], "embedding_types": ["uint8", "float"]}, "embedding_types", "uint8 is not served"),
    ({"texts": ["hi"], "embedding_types": ["binary"], "output_dimension": 60}, "embedding_types", "multiple of 8"),
    ({"texts": ["hi"], "inputs": [{"content": [{"type": "text", "text": "hi"}]}]}, "texts", "one of texts and inputs"),
    ({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "inputs[0].content[0]", "images"),
    ({"inputs": [{"content": []}]}, "inputs[0].content", "one text block"),
    ({"texts": ["hi"], "truncate": "MIDDLE"}, "truncate", ""),
    ({"texts": ["hi"], "max_tokens": 2}, "max_tokens", "at least 3"),
    ({"texts": ["hi"], "output_dimension": 385}, "output_dimension", "between 1 and 384"),
    ({"inputs": [{"content": [{"type": "text"}]}]}, "inputs[0].content[0].text", "a string"),
    ({"inputs": [{"content": [{"type": "text", "text": {"text": "a"}}]}]}, "inputs[0].content[0].text", "a string"),
])
def test_what_is_not_served_is_a_422_naming_the_field(client, fake, body, param, says) -> None:
    r = client.post("/v2/embed", json=body)
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (422, param) and says in error["message"], error
    assert fake.calls == []


def test_binary_bytes_by_hand() -> None:
    """A row whose bits are known: >= 0 sets a bit (0.0 and -0.0 included), the first dimension the highest bit."""
    from ivy.routes_cohere import _typed

    row = np.array([[1.0, -1.0, 0.0, -0.0, -2.0, 3.0, -4.0, 5.0] * 2], dtype=np.float32)
    assert _typed(row, "ubinary").tolist() == [[0b10110101, 0b10110101]] == [[181, 181]]
    assert _typed(row, "binary").tolist() == [[53, 53]]


def test_empty_texts_are_a_400(client) -> None:
    r = client.post("/v2/embed", json={"texts": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "texts"


def test_v1_embed_is_the_older_client_s_shape(client) -> None:
    """cohere's older Client (LangChain's CohereEmbeddings) posts /v1/embed: without embedding_types a list of float
    lists as embeddings_floats; with them, by type as v2; api_version 1."""
    want, tokens = openai_rows(client, TEXTS, input_type="search_query")
    body = client.post("/v1/embed", json={"texts": TEXTS, "input_type": "search_query"}).json()
    assert body["response_type"] == "embeddings_floats" and body["texts"] == TEXTS
    np.testing.assert_array_equal(np.array(body["embeddings"], dtype=np.float32), want)
    assert body["meta"] == {"api_version": {"version": "1"}, "billed_units": {"input_tokens": tokens}}
    typed = client.post("/v1/embed", json={"texts": TEXTS, "input_type": "search_query",
                                           "embedding_types": ["float"]}).json()
    assert typed["response_type"] == "embeddings_by_type" and typed["embeddings"]["float"] == body["embeddings"]
    assert client.post("/v1/embed", json={"texts": ["hi"], "embedding_types": ["int8"]}).status_code == 422
