"""POST /embed_sparse and /embed_multi_vector in front of SPLADE and BGE-M3 (issue 16), with the fake Tulip:
the output asked for, the spans of the tokens that count (BGE-M3: no CLS vector, no weights for its special
tokens), per input TEI's list of {index, value} with max over repeated ids and top_k, and 400 naming the model's
tasks on a model that does not do the route."""

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


def served(folder, **overrides):
    fake = FakeTulip(model_dir=folder)
    return fake, gateway(fake, model=str(folder), **overrides)


def ids_of(folder, texts):
    return [e.ids for e in Tokenizer(load_spec(folder)).encode_batch(texts)]


def indices(entries):
    """The ids of one input's answer ([{"index", "value"}, ...], TEI's shape)."""
    return [e["index"] for e in entries]


def values(entries):
    return [e["value"] for e in entries]


def test_splade_sparse_vectors_with_top_k(folders):
    fake, gw = served(folders["splade"])
    with fake, gw as client:
        r = client.post("/embed_sparse", json={"inputs": TEXTS})
        assert r.status_code == 200, r.text
        rows = np.maximum(fake_rows(ids_of(folders["splade"], TEXTS), 256), 0)
        for got, row in zip(r.json(), rows):
            assert indices(got) == np.flatnonzero(row > 0).tolist()
            np.testing.assert_allclose(values(got), row[row > 0], atol=1e-6)
        top = client.post("/embed_sparse", json={"inputs": TEXTS[0], "top_k": 3}).json()[0]
        assert indices(top) == sorted(np.argsort(-rows[0])[:3].tolist())
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
        assert [indices(g) for g in got] == [sorted(np.argsort(-row)[:3].tolist()) for row in rows]
        assert len(client.post("/embed_sparse", json={"inputs": TEXTS[0], "top_k": 5}).json()[0]) == 5
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
            assert indices(got) == sorted(want)
            np.testing.assert_allclose(values(got), [want[k] for k in sorted(want)], atol=1e-6)
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


def test_embed_sparse_answers_teis_list_of_index_value_pairs(folders):
    """text-embeddings-inference's router answers /embed_sparse as EmbedSparseResponse(Vec<Vec<SparseValue>>),
    SparseValue {index, value}: per input a list of {"index", "value"}, ids ascending. Ivy answered one
    {"indices", "values"} object per input, which TEI's clients cannot read."""
    for name in ("splade", "bge-m3"):
        fake, gw = served(folders[name])
        with fake, gw as client:
            r = client.post("/embed_sparse", json={"inputs": TEXTS})
            assert r.status_code == 200, r.text
            got = r.json()
            assert len(got) == len(TEXTS) and all(isinstance(entries, list) and entries for entries in got), name
            for entries in got:
                assert all(set(e) == {"index", "value"} for e in entries), name
                ids = [e["index"] for e in entries]
                assert ids == sorted(set(ids)) and all(e["value"] > 0 for e in entries), name


def test_embed_sparse_top_k_zero_is_every_weight_absent_is_the_models_default(folders, tmp_path):
    """`top_k` absent: the model's default (SPLADE's max_active_dims when its folder sets it, else every
    non-zero weight); `top_k: 0`: every non-zero weight, as documented. An explicit 0 got max_active_dims."""
    import json
    import shutil

    folder = tmp_path / "splade-top3"
    shutil.copytree(folders["splade"], folder)
    path = folder / "config_sentence_transformers.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**config, "max_active_dims": 3}))
    fake, gw = served(folder)
    with fake, gw as client:
        nonzero = int((np.maximum(fake_rows(ids_of(folder, TEXTS[:1]), 256), 0) > 0).sum())
        assert nonzero > 3
        assert len(client.post("/embed_sparse", json={"inputs": TEXTS[0]}).json()[0]) == 3
        assert len(client.post("/embed_sparse", json={"inputs": TEXTS[0], "top_k": 0}).json()[0]) == nonzero
        assert len(client.post("/embed_sparse", json={"inputs": TEXTS[0], "top_k": None}).json()[0]) == 3


def test_multi_vector_and_vocabulary_wide_rows_are_bounded_before_reaching_a_replica(folders):
    """/embed_multi_vector answers tokens x width floats (real BGE-M3: 1024 a token, up to 8192 tokens an input)
    and a SPLADE request brings inputs x vocabulary floats from Tulip before they are made sparse: over
    --max-output-values-per-request the request is a 413 naming `inputs` and the limit, and no replica sees it."""
    limit = 1000
    fake, gw = served(folders["bge-m3"], max_output_values_per_request=limit)
    with fake, gw as client:
        ids = [5] * 9  # 8 vectors of 64 (the CLS has none): 512 values an input
        assert client.post("/embed_multi_vector", json={"inputs": [ids]}).status_code == 200
        calls = len(fake.calls)
        r = client.post("/embed_multi_vector", json={"inputs": [ids, ids]})
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert error["param"] == "inputs" and error["code"] == "payload_too_large" and str(limit) in error["message"]
        assert "1024" in error["message"]  # what the request would have been answered: 2 x 8 x 64 values
        assert len(fake.calls) == calls  # refused before any work went to the replica
        assert client.post("/embed_sparse", json={"inputs": [ids] * 40}).status_code == 200  # 1 weight a token
    fake, gw = served(folders["splade"], max_output_values_per_request=limit)
    with fake, gw as client:  # its rows are 256 wide (the vocabulary) whatever the input's length
        assert client.post("/embed_sparse", json={"inputs": ["a"] * 3}).status_code == 200
        calls = len(fake.calls)
        r = client.post("/embed_sparse", json={"inputs": ["a"] * 4})
        assert r.status_code == 413 and r.json()["error"]["param"] == "inputs", r.text
        assert len(fake.calls) == calls



def test_maxsim_scoring_is_held_to_the_output_bound_naming_the_documents(folders):
    """/v1/rerank and /v1/score with scoring maxsim hold every token vector of the query and the documents in the
    worker (a small answer over GBs of rows): the same bound, the 413 naming the documents' field."""
    fake, gw = served(folders["bge-m3"], max_output_values_per_request=1000)
    with fake, gw as client:
        body = {"query": "cats", "scoring": "maxsim"}
        assert client.post("/v1/rerank", json={**body, "documents": ["a b c"]}).status_code == 200
        calls = len(fake.calls)
        r = client.post("/v1/rerank", json={**body, "documents": ["a b c d e f g h i j k l m n o p"] * 2})
        assert r.status_code == 413 and r.json()["error"]["param"] == "documents", r.text
        r = client.post("/v1/score", json={"text_1": "cats", "text_2": ["a b c d e f g h i j k l m n o p"] * 2,
                                           "scoring": "maxsim"})
        assert r.status_code == 413 and r.json()["error"]["param"] == "text_2", r.text
        assert len(fake.calls) == calls

def test_the_default_output_bound_admits_what_the_real_models_are_sent():
    """64 Mi values (256 MiB of float32): BGE-M3's multi-vector rows for 8 inputs of its 8192 tokens (the CLS has
    none), and SPLADE's rows for --max-inputs-per-request's 2048 inputs at BERT's 30522-wide vocabulary, as
    before the bound; a ninth full-length BGE-M3 input is refused."""
    from types import SimpleNamespace

    from ivy.config import IvyConfig
    from ivy.errors import IvyError
    from ivy.retrieval import Retrieval
    from rose.retrieval_spec import TOKEN_VECTORS, TOKEN_WEIGHTS, VOCAB_WEIGHTS, Output, RetrievalHeads

    config = IvyConfig()
    m3 = RetrievalHeads("m3", (Output(TOKEN_VECTORS, 0, 1024, True), Output(TOKEN_WEIGHTS, 1024, 1, False)))
    splade = RetrievalHeads("splade", (Output(VOCAB_WEIGHTS, 0, 30522, False),))
    bge = Retrieval(SimpleNamespace(spec=SimpleNamespace(retrieval=m3), config=config))
    bge.refuse_large_output(8 * 8191, TOKEN_VECTORS, "inputs")
    bge.refuse_large_output(config.max_inputs_per_request * 8192, TOKEN_WEIGHTS, "inputs")
    with pytest.raises(IvyError) as refused:
        bge.refuse_large_output(9 * 8191, TOKEN_VECTORS, "inputs")
    assert refused.value.status == 413 and refused.value.limit == 64 * 1024 * 1024
    sparse = Retrieval(SimpleNamespace(spec=SimpleNamespace(retrieval=splade), config=config))
    sparse.refuse_large_output(config.max_inputs_per_request, VOCAB_WEIGHTS, "inputs")
