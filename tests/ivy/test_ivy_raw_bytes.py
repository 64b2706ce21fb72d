"""vLLM's raw answers (`encoding_format: bytes` and `bytes_only`, vllm/entrypoints/pooling/embed serving and
vllm's serial_utils.encode_pooling_bytes) on /v1/embeddings, /embeddings and /pooling: no JSON, an
application/octet-stream body of every row's bytes back to back, each row as base64 carries it (float32, or
`embed_dtype` in the `endianness` asked); for bytes a `metadata` header, JSON of the id, created, model, each row's
{"index", "embed_dtype", "endianness", "start", "end", "shape"} and the usage. Before, both were refused by name."""

from __future__ import annotations

import base64

import orjson
import pytest

TEXTS = ["hello world", "the cat sat on the mat", "a third text"]


@pytest.mark.parametrize("route, field, prefix", [("/v1/embeddings", "embedding", "embd-"),
                                                  ("/embeddings", "embedding", "embd-"), ("/pooling", "data", "pool-")])
@pytest.mark.parametrize("embed_dtype, endianness, width", [(None, None, 4), ("float16", "big", 2),
                                                            ("bfloat16", "little", 2), ("fp8_e4m3", "native", 1)])
def test_bytes_are_the_base64_rows_back_to_back(client, route, field, prefix, embed_dtype, endianness, width) -> None:
    asked = {k: v for k, v in (("embed_dtype", embed_dtype), ("endianness", endianness)) if v is not None}
    rows = client.post(route, json={"input": TEXTS, "encoding_format": "base64", **asked}).json()["data"]
    wanted = [base64.b64decode(r[field]) for r in rows]
    r = client.post(route, json={"input": TEXTS, "encoding_format": "bytes", **asked})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream" and r.content == b"".join(wanted)
    meta = orjson.loads(r.headers["metadata"])
    assert meta["id"].startswith(prefix) and meta["model"] and isinstance(meta["created"], int)
    assert meta["usage"]["prompt_tokens"] == meta["usage"]["total_tokens"] > len(TEXTS)
    size = 384 * width
    assert meta["data"] == [{"index": i, "embed_dtype": embed_dtype or "float32", "endianness": endianness or "native",
                             "start": i * size, "end": (i + 1) * size, "shape": [384]} for i in range(len(TEXTS))]
    only = client.post(route, json={"input": TEXTS, "encoding_format": "bytes_only", **asked})
    assert only.status_code == 200 and only.content == r.content and "metadata" not in only.headers


def test_bytes_take_dimensions_and_refuse_what_base64_refuses(client, fake) -> None:
    r = client.post("/v1/embeddings", json={"input": TEXTS[:2], "encoding_format": "bytes", "dimensions": 64})
    assert len(r.content) == 2 * 64 * 4 and orjson.loads(r.headers["metadata"])["data"][1]["shape"] == [64]
    calls = len(fake.calls)
    bad = client.post("/v1/embeddings", json={"input": "hi", "encoding_format": "bytes", "embed_dtype": "fp4"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "embed_dtype"  # errors stay JSON
    assert len(fake.calls) == calls


def test_contextualized_embeddings_keep_their_formats(client) -> None:
    """Perplexity's shape has no raw answer: bytes there is a 422 naming encoding_format."""
    body = {"input": [["a chunk", "another"]], "encoding_format": "bytes"}
    r = client.post("/v1/contextualizedembeddings", json=body)
    assert r.status_code == 422 and r.json()["error"]["param"] == "encoding_format"
