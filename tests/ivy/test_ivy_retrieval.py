"""POST /embed_sparse and /embed_multi_vector in front of SPLADE and BGE-M3 (issue 16), with the fake Tulip:
the output asked for, the spans of the tokens that count (BGE-M3: no CLS vector, no weights for its special
tokens), {indices, values} per input with max over repeated ids and top_k, and 400 naming the model's tasks
on a model that does not do the route."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from fake_tulip import FakeTulip, fake_rows
from ivy_testkit import gateway

sys.path.insert(0, str(Path(__file__).parent.parent / "rose"))  # the tiny model builders
from rose_retrieval_models import build_bge_m3, build_splade  # noqa: E402

from rose.spec import load_spec  # noqa: E402
from rose.tokenizer import Tokenizer  # noqa: E402

pytest.importorskip("sentence_transformers")
TEXTS = ["hello world hello", "the quick brown fox"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ivy-retrieval")
    return {"splade": build_splade(root), "bge-m3": build_bge_m3(root)}


def served(folder):
    fake = FakeTulip(model_dir=folder)
    return fake, gateway(fake, model=str(folder))


def ids_of(folder, texts):
    return [e.ids for e in Tokenizer(load_spec(folder)).encode_batch(texts)]


def test_splade_sparse_vectors_with_top_k(folders):
    fake, gw = served(folders["splade"])
    with fake, gw as client:
        r = client.post("/embed_sparse", json={"inputs": TEXTS})
        assert r.status_code == 200, r.text
        rows = np.maximum(fake_rows(ids_of(folders["splade"], TEXTS), 256), 0)
        for got, row in zip(r.json(), rows):
            assert got["indices"] == np.flatnonzero(row > 0).tolist()
            np.testing.assert_allclose(got["values"], row[row > 0], atol=1e-6)
        top = client.post("/embed_sparse", json={"inputs": TEXTS[0], "top_k": 3}).json()[0]
        assert top["indices"] == sorted(np.argsort(-rows[0])[:3].tolist())
        assert fake.calls[-1].output == "vocab-weights"
        assert client.post("/embed_multi_vector", json={"inputs": "a"}).status_code == 400
        assert "sparse" in client.post("/v1/embeddings", json={"input": "a"}).json()["error"]["message"]
        models = client.get("/v1/models").json()["data"][0]
        assert models["tasks"] == ["sparse"]


def test_splade_max_active_dims_is_the_default_top_k(folders, tmp_path):
    """config_sentence_transformers.json's max_active_dims (SparseEncoder keeps that many largest weights per
    input unless encode() is told otherwise) is the default top_k: all 160-177 weights were answered where
    SparseEncoder gives 3. A request's top_k still wins."""
    import json
    import shutil

    folder = tmp_path / "splade-top3"
    shutil.copytree(folders["splade"], folder)
    path = folder / "config_sentence_transformers.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**config, "max_active_dims": 3}))
    assert load_spec(folder).retrieval.max_active_dims == 3
    fake, gw = served(folder)
    with fake, gw as client:
        rows = np.maximum(fake_rows(ids_of(folder, TEXTS), 256), 0)
        got = client.post("/embed_sparse", json={"inputs": TEXTS}).json()
        assert [g["indices"] for g in got] == [sorted(np.argsort(-row)[:3].tolist()) for row in rows]
        assert len(client.post("/embed_sparse", json={"inputs": TEXTS[0], "top_k": 5}).json()[0]["indices"]) == 5
    for bad in (0, -1, "3"):
        path.write_text(json.dumps({**config, "max_active_dims": bad}))
        with pytest.raises(Exception, match="max_active_dims"):
            load_spec(folder)


def test_bge_m3_token_weights_max_over_repeats(folders):
    fake, gw = served(folders["bge-m3"])
    with fake, gw as client:
        r = client.post("/embed_sparse", json={"inputs": TEXTS})
        assert r.status_code == 200, r.text
        ids = ids_of(folders["bge-m3"], TEXTS)
        for got, seq in zip(r.json(), ids):
            spans = [(0, t, t + 1) for t, tok in enumerate(seq) if tok not in (0, 1, 2, 3)]
            weights = np.maximum(fake_rows([seq], 1, spans=spans)[:, 0], 0)
            want: dict[int, float] = {}
            for (_, t, _), w in zip(spans, weights):
                if w > 0:
                    want[seq[t]] = max(want.get(seq[t], 0.0), float(w))
            assert got["indices"] == sorted(want)
            np.testing.assert_allclose(got["values"], [want[k] for k in sorted(want)], atol=1e-6)
        assert fake.calls[-1].output == "token-weights" and fake.calls[-1].rows == sum(
            sum(1 for tok in s if tok not in (0, 1, 2, 3)) for s in ids)
        assert len(ids[0]) > len(set(ids[0]) - {0, 1, 2, 3}) + 2  # "hello" twice: one entry, its max


def test_bge_m3_multi_vector_drops_cls_and_is_normalized(folders):
    fake, gw = served(folders["bge-m3"])
    with fake, gw as client:
        r = client.post("/embed_multi_vector", json={"inputs": TEXTS})
        assert r.status_code == 200, r.text
        ids = ids_of(folders["bge-m3"], TEXTS)
        for got, seq in zip(r.json(), ids):
            want = fake_rows([seq], 64, spans=[(0, t, t + 1) for t in range(1, len(seq))])
            want /= np.linalg.norm(want, axis=1, keepdims=True)
            np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
        assert fake.calls[-1].output == "token-vectors"
        dense = client.post("/v1/embeddings", json={"input": TEXTS[0]})
        assert dense.status_code == 200 and len(dense.json()["data"][0]["embedding"]) == 64
