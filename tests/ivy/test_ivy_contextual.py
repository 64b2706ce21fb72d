"""POST /v1/contextualizedembeddings: documents joined into one sequence, one span-pooled row per chunk."""

from __future__ import annotations

import base64

import numpy as np

from ivy_testkit import gateway, model_copy
from fake_tulip import FakeTulip, fake_rows
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

TOKENIZER = Tokenizer(load_spec(bundled_model_dir()))
DOCS = [["Curiosity begins in childhood.", "It drives exploration.", "Science starts with questions."],
        ["The rover explores Mars.", "Each discovery sparks questions."]]


def _content(text: str) -> list[int]:
    return TOKENIZER.encode(text).ids[1:-1]  # without [CLS] ... [SEP]


def _expected(docs, separator: list[int] | None = None) -> list[np.ndarray]:
    out = []
    for doc in docs:
        seq, spans = [101], []
        for j, chunk in enumerate(doc):
            if j and separator:
                seq += separator
            ids = _content(chunk)
            spans.append((0, len(seq), len(seq) + len(ids)))
            seq += ids
        seq.append(102)
        rows = fake_rows([seq], 384, spans=spans)
        out.append(rows / np.linalg.norm(rows, axis=1, keepdims=True))
    return out


def test_perplexity_shape_and_span_pooling(client, fake) -> None:
    r = client.post("/v1/contextualizedembeddings", json={"input": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    for doc, expected in zip(body["data"], _expected(DOCS)):
        assert doc["object"] == "list"
        assert [c["index"] for c in doc["data"]] == list(range(len(expected)))
        np.testing.assert_allclose(np.array([c["embedding"] for c in doc["data"]]), expected, atol=1e-6)
    tokens = sum(2 + sum(len(_content(c)) for c in doc) for doc in DOCS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert fake.calls[-1].seqs == 2 and fake.calls[-1].rows == 5


def test_chunks_in_context_differ_from_chunks_alone(client) -> None:
    ctx = client.post("/v1/contextualizedembeddings", json={"input": [DOCS[0]]}).json()["data"][0]["data"]
    alone = client.post("/v1/embeddings", json={"input": DOCS[0]}).json()["data"]
    for c, a in zip(ctx, alone):
        assert not np.allclose(c["embedding"], a["embedding"], atol=1e-3)


def test_documents_split_over_replicas_keep_order() -> None:
    many = [[f"doc {i} part {j}" for j in range(i % 3 + 1)] for i in range(7)]
    with FakeTulip() as a, FakeTulip() as b, gateway(a, b, chunk_max_seqs=2) as client:
        body = client.post("/v1/contextualizedembeddings", json={"input": many, "encoding_format": "base64"}).json()
        assert a.calls and b.calls
    for doc, expected in zip(body["data"], _expected(many)):
        got = np.stack([np.frombuffer(base64.b64decode(c["embedding"]), dtype="<f4") for c in doc["data"]])
        np.testing.assert_allclose(got, expected, atol=1e-6)


def test_separator_from_the_model_config(tmp_path) -> None:
    folder = model_copy(tmp_path, "with-separator", config={"chunk_separator": " ; "})
    with FakeTulip(model_dir=folder) as fake, gateway(fake, model=str(folder)) as client:
        body = client.post("/v1/contextualizedembeddings", json={"input": DOCS[:1], "dimensions": 384}).json()
    got = np.array([c["embedding"] for c in body["data"][0]["data"]])
    np.testing.assert_allclose(got, _expected(DOCS[:1], separator=_content(" ; "))[0], atol=1e-6)


def test_contextual_errors(fake) -> None:
    with gateway(fake, max_inputs_per_request=3, max_chunks_per_request=4) as client:
        assert client.post("/v1/contextualizedembeddings", json={"input": []}).status_code == 400
        r = client.post("/v1/contextualizedembeddings", json={"input": [["a"], []]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[1]"
        r = client.post("/v1/contextualizedembeddings", json={"input": [["a"], ["b", "   "]]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[1][1]"
        r = client.post("/v1/contextualizedembeddings", json={"input": [["a"]] * 4})
        assert r.status_code == 422 and "at most 3" in r.json()["error"]["message"]
        r = client.post("/v1/contextualizedembeddings", json={"input": [["a", "b", "c"], ["d", "e"]]})
        assert r.status_code == 422 and "at most 4" in r.json()["error"]["message"]
        r = client.post("/v1/contextualizedembeddings", json={"input": [["word " * 200, "word " * 200]]})
        assert r.status_code == 422 and "the model takes at most 256" in r.json()["error"]["message"]
        assert "never cut" in r.json()["error"]["message"] and "truncate=true" not in r.json()["error"]["message"]
        r = client.post("/v1/contextualizedembeddings", json={"input": ["not a list"]})
        assert r.status_code == 422 and r.json()["error"]["param"] == "input[0]"
