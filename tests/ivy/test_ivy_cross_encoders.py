"""/v1/score and /v1/rerank in front of a cross-encoder (issue 16): pairs in (tokenized as the reranker reads
them, BERT's token types sent with the ids), one score per pair out, ordered, top_n, documents echoed, Cohere's
and Jina's shapes; Qwen3-Reranker's prompt applied by Ivy; /v1/models says what the model does and the
embedding routes answer 400 naming it."""

from __future__ import annotations

from itertools import chain

import numpy as np
import pytest
from cross_folders import bert_reranker, qwen3_reranker
from fake_tulip import FakeTulip, fake_scores
from ivy_testkit import gateway

from rose.spec import load_spec
from rose.tokenizer import Tokenizer

QUERY = "where do cats sleep"
DOCS = ["cats sleep on the sofa", "stock prices fell today", "cats and dogs", "where do birds fly"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ivy-rerankers")
    return {"bert": bert_reranker(root), "one-type": bert_reranker(root, "minilm-reranker-1type", type_vocab_size=1),
            "qwen3": qwen3_reranker(root)}


def served(folder, **overrides):
    fake = FakeTulip(model_dir=folder)  # started by the caller's with, before the gateway
    return fake, gateway(fake, model=str(folder), **overrides)


def expected_pairs(folder, queries, docs):
    tok = Tokenizer(load_spec(folder))
    enc = tok.encode_pairs(list(zip(queries, docs)))
    return [e.ids for e in enc], [e.type_ids for e in enc]


def test_rerank_scores_each_pair_with_its_token_types(folders):
    fake, gw = served(folders["bert"])
    with fake, gw as client:
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "return_documents": True})
        assert r.status_code == 200, r.text
        ids, types = expected_pairs(folders["bert"], [QUERY] * 4, DOCS)
        want = fake_scores(ids, types)[:, 0]
        body = r.json()
        assert [x["index"] for x in body["results"]] == list(np.argsort(-want, kind="stable"))
        for item in body["results"]:
            assert abs(item["relevance_score"] - want[item["index"]]) < 1e-6
            assert item["document"] == {"text": DOCS[item["index"]]}
        assert body["usage"]["total_tokens"] == sum(map(len, ids))
        call = fake.calls[-1]
        assert (call.seqs, call.dimensions) == (4, 1)  # one sequence (a pair) per document, one score each
        assert call.token_types == bytes(chain.from_iterable(types)) and 1 in call.token_types
        top = client.post("/v2/rerank", json={"query": QUERY, "documents": [{"text": d} for d in DOCS], "top_n": 2})
        assert [x["index"] for x in top.json()["results"]] == [x["index"] for x in body["results"][:2]]
        assert "document" not in top.json()["results"][0]


def test_score_one_against_many_and_pairwise(folders):
    fake, gw = served(folders["bert"])
    with fake, gw as client:
        one = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS}).json()
        ids, types = expected_pairs(folders["bert"], [QUERY] * 4, DOCS)
        np.testing.assert_allclose([d["score"] for d in one["data"]], fake_scores(ids, types)[:, 0], atol=1e-6)
        pairwise = client.post("/v1/score", json={"text_1": DOCS[:2], "text_2": DOCS[2:]}).json()
        ids, types = expected_pairs(folders["bert"], DOCS[:2], DOCS[2:])
        np.testing.assert_allclose([d["score"] for d in pairwise["data"]], fake_scores(ids, types)[:, 0], atol=1e-6)
        assert pairwise["object"] == "list" and [d["index"] for d in pairwise["data"]] == [0, 1]


def test_models_with_one_token_type_get_none_sent(folders):
    fake, gw = served(folders["one-type"])
    with fake, gw as client:
        assert client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).status_code == 200
        assert fake.calls[-1].token_types == b""  # XLM-R-like: pairs without types (type 0)


def test_a_pair_too_long_is_named_or_cut(folders):
    fake, gw = served(folders["bert"], truncate=False)
    long_doc = " ".join(["cats"] * 400)
    with fake, gw as client:
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": [DOCS[0], long_doc]})
        assert r.status_code == 422 and r.json()["error"]["param"] == "documents[1]", r.text
        assert "at most 256" in r.json()["error"]["message"]
        cut = client.post("/v1/rerank", json={"query": QUERY, "documents": [DOCS[0], long_doc], "truncate": True})
        assert cut.status_code == 200
        ids, _ = expected_pairs(folders["bert"], [QUERY], [long_doc])
        assert len(ids[0]) == 256 and cut.json()["usage"]["total_tokens"] == 256 + len(
            expected_pairs(folders["bert"], [QUERY], [DOCS[0]])[0][0])


def test_qwen3_reranker_prompt_is_the_model_cards(folders):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(folders["qwen3"]))
    prefix = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
              "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

    def recipe(query, doc, instruction="Given a web search query, retrieve relevant passages that answer the query"):
        head, tail = tok.encode(prefix, add_special_tokens=False), tok.encode(suffix, add_special_tokens=False)
        body = tok([f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"], truncation="longest_first",
                   max_length=256 - len(head) - len(tail))["input_ids"][0]
        return head + body + tail

    fake, gw = served(folders["qwen3"])
    with fake, gw as client:
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        want = [recipe(QUERY, d) for d in DOCS]
        assert np.frombuffer(fake.calls[-1].token_ids, "<i4").tolist() == list(chain.from_iterable(want))
        assert fake.calls[-1].token_types == b""
        scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        np.testing.assert_allclose([scores[i] for i in range(4)], fake_scores(want)[:, 0], atol=1e-6)
        custom = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS[:1], "instruction": "find cats"})
        assert custom.status_code == 200
        assert np.frombuffer(fake.calls[-1].token_ids, "<i4").tolist() == recipe(QUERY, DOCS[0], "find cats")
        huge = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS[:1], "instruction": "x" * 10_000})
        assert huge.status_code == 422 and huge.json()["error"]["param"] == "instruction"


def test_instruction_is_refused_by_models_that_do_not_read_one(folders, client):
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "instruction": "x"})  # the bi-encoder
    assert r.status_code == 422 and r.json()["error"]["param"] == "instruction"
    fake, gw = served(folders["bert"])
    with fake, gw as c:
        r = c.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS, "instruction": "x"})
        assert r.status_code == 422 and "Qwen3-Reranker" in r.json()["error"]["message"]


def test_models_list_tasks_and_embedding_routes_name_them(folders, client):
    assert client.get("/v1/models").json()["data"][0]["tasks"] == ["embed"]
    fake, gw = served(folders["bert"])
    with fake, gw as c:
        card = c.get("/v1/models").json()["data"][0]
        assert (card["id"], card["tasks"], card["dimensions"]) == ("minilm-reranker", ["rerank"], 1)
        for route, body in (("/v1/embeddings", {"input": "hi"}), ("/embed", {"inputs": "hi"}),
                            ("/v1/contextualizedembeddings", {"input": [["hi"]]})):
            r = c.post(route, json=body)
            assert r.status_code == 400, (route, r.text)
            error = r.json()["error"]
            assert (error["code"], error["param"]) == ("unsupported_task", "model")
            assert "'embed'" in error["message"] and "'rerank'" in error["message"]
        assert not fake.calls  # refused before any work


def test_a_replica_serving_another_task_gets_no_traffic(folders):
    fake = FakeTulip(model_dir=folders["bert"], tasks=["embed"])  # same model and tokenizer, not a reranker
    with fake, gateway(fake, model=str(folders["bert"])) as client:
        assert client.get("/ready").status_code == 503
        assert client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).status_code == 503
        assert not fake.calls


def test_predict_scores_a_reranker_as_tei_does(folders):
    """TEI serves a reranker at /predict as a classifier of one label: LABEL_0, the logit's sigmoid (raw_scores: the
    logit), a pair [query, document] encoded as rerank's pairs; a yes/no reranker is refused (its prompt is
    /rerank's)."""
    fake, gw = served(folders["bert"])
    with fake, gw as client:
        ids, types = expected_pairs(folders["bert"], [QUERY], [DOCS[0]])
        logit = float(fake_scores(ids, types, raw=True)[0, 0])
        one = client.post("/predict", json={"inputs": [QUERY, DOCS[0]]})
        assert one.status_code == 200, one.text
        assert one.json() == [{"score": pytest.approx(1 / (1 + np.exp(-logit)), abs=1e-6), "label": "LABEL_0"}]
        assert fake.calls[-1].output == "logit" and fake.calls[-1].token_ids == b"".join(
            np.asarray(i, dtype="<i4").tobytes() for i in ids)
        raw = client.post("/predict", json={"inputs": [[QUERY, DOCS[0]], [DOCS[1]]], "raw_scores": True}).json()
        assert raw[0] == [{"score": pytest.approx(logit, abs=1e-6), "label": "LABEL_0"}] and len(raw) == 2
    fake, gw = served(folders["qwen3"])
    with fake, gw as client:
        r = client.post("/predict", json={"inputs": [QUERY, DOCS[0]]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_task" and not fake.calls


def test_predict_on_an_identity_reranker_takes_its_score_as_the_logit(tmp_path):
    """An Identity reranker's row is its logit already: /predict asks for the default output and applies the
    sigmoid (TEI's one-label rule), raw_scores returns the row itself."""
    identity = bert_reranker(tmp_path, sentence_transformers={"activation_fn": "torch.nn.modules.linear.Identity"})
    fake, gw = served(identity)
    with fake, gw as client:
        ids, types = expected_pairs(identity, [QUERY], [DOCS[0]])
        row = float(fake_scores(ids, types)[0, 0])  # the fake's score stands for an Identity model's logit
        got = client.post("/predict", json={"inputs": [QUERY, DOCS[0]]}).json()
        assert got == [{"score": pytest.approx(1 / (1 + np.exp(-row)), abs=1e-6), "label": "LABEL_0"}]
        assert fake.calls[-1].output == ""
        raw = client.post("/predict", json={"inputs": [QUERY, DOCS[0]], "raw_scores": True}).json()
        assert raw == [{"score": pytest.approx(row, abs=1e-6), "label": "LABEL_0"}]
