"""/v1/score and /v1/rerank by late interaction (MaxSim) in front of BGE-M3 (issue 16), with the fake Tulip:
the scores equal MaxSim computed here from the vectors /embed_multi_vector answers for the same texts (one
token-vectors call, lanes kept), ordering, top_n, documents echoed and usage as the other branches; BGE-M3
scores by dense cosine unless `scoring` says maxsim; a plain embedding model keeps cosine; `scoring` a model
cannot compute is a 422 naming it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cross_folders import bert_reranker
from fake_tulip import FakeTulip
from ivy_testkit import gateway

sys.path.insert(0, str(Path(__file__).parent.parent / "rose"))  # the tiny model builders
from rose_retrieval_models import build_bge_m3, build_splade  # noqa: E402

from ivy.errors import IvyError, Problem  # noqa: E402
from ivy.late_interaction import COSINE, MAXSIM, scoring_of  # noqa: E402
from rose.spec import load_spec  # noqa: E402
from rose.tokenizer import Tokenizer  # noqa: E402

pytest.importorskip("sentence_transformers")
QUERY = "where do cats sleep"
DOCS = ["cats sleep on the sofa", "stock prices fell today", "cats and dogs", "where do birds fly"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ivy-maxsim")
    return {"bge-m3": build_bge_m3(root), "splade": build_splade(root), "reranker": bert_reranker(root)}


def served(folder):
    fake = FakeTulip(model_dir=folder)
    return fake, gateway(fake, model=str(folder))


def late_interaction(query: np.ndarray, doc: np.ndarray) -> float:
    """MaxSim written out: for each query vector its best dot product with a document vector, averaged."""
    return float(np.mean([max(float(q @ d) for d in doc) for q in query]))


def token_vectors(client, texts):
    r = client.post("/embed_multi_vector", json={"inputs": texts})
    assert r.status_code == 200, r.text
    return [np.asarray(v, np.float64) for v in r.json()]


def dense_cosines(client, query, docs):
    rows = np.asarray([d["embedding"] for d in client.post("/v1/embeddings", json={"input": [query, *docs]}).json()[
        "data"]])
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows[1:] @ rows[0]


def tokens_of(folder, texts):
    return sum(len(e.ids) for e in Tokenizer(load_spec(folder)).encode_batch(texts))


def test_rerank_by_maxsim_top_n_documents_lane(folders):
    fake, gw = served(folders["bge-m3"])
    with fake, gw as client:
        q, *docs = token_vectors(client, [QUERY, *DOCS])
        want = np.asarray([late_interaction(q, d) for d in docs])
        assert len(set(np.round(want, 6))) == len(DOCS)  # distinct: the order below is a real check
        assert not np.allclose(want, dense_cosines(client, QUERY, DOCS), atol=1e-3)  # not the cosine branch
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "scoring": "maxsim", "top_n": 3,
                                            "return_documents": True, "priority": "bulk"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [x["index"] for x in body["results"]] == list(np.argsort(-want, kind="stable")[:3])
        for item in body["results"]:
            assert abs(item["relevance_score"] - want[item["index"]]) < 1e-5
            assert item["document"] == {"text": DOCS[item["index"]]}
        assert body["usage"]["total_tokens"] == tokens_of(folders["bge-m3"], [QUERY, *DOCS])
        call = fake.calls[-1]
        assert (call.output, call.seqs, call.lane) == ("token-vectors", 1 + len(DOCS), 1)  # one call, bulk lane
        jina = client.post("/v2/rerank", json={"query": QUERY, "documents": [{"text": d} for d in DOCS],
                                               "scoring": "maxsim"}).json()["results"]
        assert [x["index"] for x in jina] == list(np.argsort(-want, kind="stable"))
        assert "document" not in jina[0]


def test_score_by_maxsim_one_to_many_and_pairwise(folders):
    fake, gw = served(folders["bge-m3"])
    with fake, gw as client:
        q, *docs = token_vectors(client, [QUERY, *DOCS])
        body = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS, "scoring": "maxsim"}).json()
        assert [d["index"] for d in body["data"]] == [0, 1, 2, 3] and body["object"] == "list"
        np.testing.assert_allclose([d["score"] for d in body["data"]], [late_interaction(q, d) for d in docs],
                                   atol=1e-5)
        assert body["usage"]["prompt_tokens"] == tokens_of(folders["bge-m3"], [QUERY, *DOCS])
        pairs = client.post("/v1/score", json={"text_1": DOCS[:2], "text_2": DOCS[2:], "scoring": "maxsim"}).json()
        np.testing.assert_allclose([d["score"] for d in pairs["data"]],
                                   [late_interaction(docs[0], docs[2]), late_interaction(docs[1], docs[3])], atol=1e-5)
        assert pairs["data"][0]["score"] != pytest.approx(late_interaction(docs[1], docs[2]), abs=1e-3)


def test_bge_m3_scores_by_dense_cosine_by_default(folders):
    fake, gw = served(folders["bge-m3"])
    with fake, gw as client:
        want = dense_cosines(client, QUERY, DOCS)
        for scoring in (None, "cosine"):
            body = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS, "scoring": scoring}).json()
            np.testing.assert_allclose([d["score"] for d in body["data"]], want, atol=1e-5)
            assert fake.calls[-1].output == ""  # the dense output, not token vectors
        results = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]
        assert [x["index"] for x in results] == list(np.argsort(-want, kind="stable"))


def test_plain_embedding_model_keeps_cosine_and_refuses_maxsim(client):
    r = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200 and len(r.json()["data"]) == 4
    for route, body in (("/v1/score", {"text_1": QUERY, "text_2": DOCS}), ("/v1/rerank", {"query": QUERY,
                                                                                         "documents": DOCS})):
        r = client.post(route, json={**body, "scoring": "maxsim"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "scoring", r.text
        assert "multi-vector" in r.json()["error"]["message"]
        r = client.post(route, json={**body, "scoring": "colbert"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "scoring", r.text


def test_cross_encoder_refuses_scoring_and_splade_cannot_score(folders):
    fake, gw = served(folders["reranker"])
    with fake, gw as client:
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "scoring": "cosine"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "scoring", r.text
        assert client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).status_code == 200
    fake, gw = served(folders["splade"])
    with fake, gw as client:
        r = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS})
        assert r.status_code == 400 and "'sparse'" in r.json()["error"]["message"], r.text


def test_multi_vector_only_model_defaults_to_maxsim():
    def stub(tasks):
        def refuse(task, route):
            raise IvyError(Problem.UNSUPPORTED_TASK, f"{route} needs {task}", param="model")
        return SimpleNamespace(spec=SimpleNamespace(tasks=tasks), cross_encoder=False, model_name="m",
                               require_task=refuse)
    colbert = stub(("multi-vector",))
    assert scoring_of(colbert, None, "/v1/rerank") == MAXSIM
    assert scoring_of(stub(("embed", "multi-vector", "sparse")), None, "/v1/rerank") == COSINE
    assert scoring_of(stub(("embed", "multi-vector", "sparse")), "maxsim", "/v1/rerank") == MAXSIM
    with pytest.raises(IvyError) as refused:
        scoring_of(colbert, "cosine", "/v1/rerank")
    assert refused.value.param == "scoring" and "'embed'" in str(refused.value)
