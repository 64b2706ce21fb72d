"""Fields of /score and /rerank served as their senders mean them.

vLLM's `truncate_prompt_tokens` (-1: cut to the model's length, k: keep k tokens, special tokens included) was
ignored: an unknown field to the schema, so a vLLM client's truncation was not applied (the full text scored,
or a 422 asking for truncate=true). It is served as /pooling serves it, for each text of an embedding model
(cosine and MaxSim) and for each pair of a cross-encoder (k bounds the whole pair, cut longest first, as vLLM's
tokenizer call with max_length k does); what cannot be honoured is a 422 naming it.

A cross-encoder's errors named the wrong field: a pair too long always blamed the document (documents[0] for a
long query), and a one-element list lost its index (documents for documents[0]); they now name what the
embedding models' path names (RELIABILITY 6: a field sent as one text is named as itself).

text-embeddings-inference's /rerank body (`texts`) ignored truncate_prompt_tokens, as the other shapes once did:
it is read the same way there, next to TEI's own `truncate` and `truncation_direction`.
"""

from __future__ import annotations

import sys
from itertools import chain
from pathlib import Path

import numpy as np
import pytest
from cross_folders import bert_reranker, qwen3_reranker
from fake_tulip import FakeTulip, fake_rows, fake_scores
from ivy_testkit import gateway

from ivy.pairs import QWEN3_RERANK_PREFIX, QWEN3_RERANK_SUFFIX
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

QUERY = "where do cats sleep"
DOCS = ["cats sleep on the sofa", "stock prices fell today"]
LONG = "the quick brown fox jumps over the lazy dog " * 30  # 272 tokens with the specials: over MiniLM's 256
TOKENIZER = Tokenizer(load_spec(bundled_model_dir()))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ivy-score-fields")
    return {"bert": bert_reranker(root), "qwen3": qwen3_reranker(root)}


def served(folder, **overrides):
    fake = FakeTulip(model_dir=folder)
    return fake, gateway(fake, model=str(folder), **overrides)


def sent(fake) -> list[int]:
    return np.frombuffer(fake.calls[-1].token_ids, "<i4").tolist()


def bodies(query: str, docs: list[str], **fields) -> list[tuple[str, dict]]:
    """The same request at vLLM's, Ivy's and text-embeddings-inference's score and rerank paths (TEI's: /rerank
    with `texts`, answered as a list by score)."""
    score = {"text_1": query, "text_2": docs, **fields}
    rerank = {"query": query, "documents": docs, **fields}
    tei = {"query": query, "texts": docs, **fields}
    return [("/score", score), ("/v1/score", score), ("/rerank", rerank), ("/v1/rerank", rerank), ("/rerank", tei)]


def scores_of(route: str, body: dict | list) -> list[float]:
    if isinstance(body, list):  # TEI's answer
        return [x["score"] for x in sorted(body, key=lambda x: x["index"])]
    if "score" in route:
        return [d["score"] for d in body["data"]]
    return [x["relevance_score"] for x in sorted(body["results"], key=lambda x: x["index"])]


# ---- truncate_prompt_tokens ----

def test_k_keeps_k_tokens_of_each_text_of_an_embedding_model(client, fake) -> None:
    docs = [LONG, DOCS[0]]
    cut = [e.ids for e in TOKENIZER.encode_batch([QUERY, *docs], 4)]
    rows = fake_rows(cut, 384)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    for route, body in bodies(QUERY, docs, truncate_prompt_tokens=4):
        r = client.post(route, json=body)
        assert r.status_code == 200, (route, r.text)
        assert sent(fake) == list(chain.from_iterable(cut)), route  # [CLS] two tokens [SEP], every text
        np.testing.assert_allclose(scores_of(route, r.json()), rows[1:] @ rows[0], atol=1e-5)
        assert isinstance(r.json(), list) or r.json()["usage"]["total_tokens"] == 12  # TEI's answer has no usage


def test_minus_one_cuts_to_the_models_length_where_truncate_is_off(client, fake) -> None:
    whole = [e.ids for e in TOKENIZER.encode_batch([QUERY, LONG])]
    assert len(whole[1]) == 256  # cut: the text has 272 tokens
    for route, body in bodies(QUERY, [LONG], truncate_prompt_tokens=-1):
        r = client.post(route, json=body)
        assert r.status_code == 200, (route, r.text)  # was a 422 "send truncate=true"
        assert sent(fake) == list(chain.from_iterable(whole))
    omitted = client.post("/score", json={"text_1": QUERY, "text_2": [LONG]})  # omitted: `truncate`, off here
    assert omitted.status_code == 422 and omitted.json()["error"]["param"] == "text_2[0]"


@pytest.mark.parametrize("fields, param", [({"truncate_prompt_tokens": 4, "truncate": False}, "truncate"),
                                           ({"truncate_prompt_tokens": 2}, "truncate_prompt_tokens"),
                                           ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
                                           ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
                                           ({"truncate_prompt_tokens": 257}, "truncate_prompt_tokens"),
                                           ({"truncate_prompt_tokens": "4"}, "truncate_prompt_tokens")])
def test_what_cannot_be_honoured_is_refused_by_name(client, fake, fields, param) -> None:
    for route, body in bodies(QUERY, DOCS, **fields):
        r = client.post(route, json=body)
        assert r.status_code == 422 and r.json()["error"]["param"] == param, (route, r.text)
    assert not fake.calls


def test_tei_rerank_takes_truncate_prompt_tokens_with_its_own_truncate_and_direction(client, fake) -> None:
    """TEI's body ignored truncate_prompt_tokens (not one of its fields): k was not applied and a long text was a
    422. It is read as on the other shapes; TEI's truncate (true: the model's length) and truncation_direction
    (the side k cuts from) keep their meaning, and a contradiction or a k out of range is a 422 naming it."""
    tei = {"query": QUERY, "texts": [LONG, DOCS[0]]}
    left = [e.ids for e in TOKENIZER.encode_batch([QUERY, *tei["texts"]], 4, "left")]
    r = client.post("/rerank", json={**tei, "truncate_prompt_tokens": 4, "truncation_direction": "Left"})
    assert r.status_code == 200 and sent(fake) == list(chain.from_iterable(left)), r.text
    whole = [e.ids for e in TOKENIZER.encode_batch([QUERY, *tei["texts"]])]  # LONG cut to the model's 256
    for cut in ({"truncate": True}, {"truncate_prompt_tokens": -1}, {"truncate_prompt_tokens": -1, "truncate": True}):
        r = client.post("/rerank", json={**tei, **cut})
        assert r.status_code == 200 and sent(fake) == list(chain.from_iterable(whole)), (cut, r.text)
    calls = len(fake.calls)
    for fields, param in (({}, "texts[0]"), ({"truncate": False}, "texts[0]"),  # omitted: the server's default, off
                          ({"truncate_prompt_tokens": 4, "truncate": False}, "truncate"),
                          ({"truncate_prompt_tokens": 257}, "truncate_prompt_tokens")):
        r = client.post("/rerank", json={**tei, **fields})
        assert r.status_code == 422 and r.json()["error"]["param"] == param, (fields, r.text)
    assert "between 3 " in r.json()["error"]["message"] and "256, got 257" in r.json()["error"]["message"]
    assert len(fake.calls) == calls


def test_maxsim_cuts_each_text_too(tmp_path) -> None:
    pytest.importorskip("sentence_transformers")
    sys.path.insert(0, str(Path(__file__).parent.parent / "rose"))  # the tiny model builders
    from rose_retrieval_models import build_bge_m3

    folder = build_bge_m3(tmp_path)
    cut = [e.ids for e in Tokenizer(load_spec(folder)).encode_batch([QUERY, *DOCS], 4)]
    fake, gw = served(folder)
    with fake, gw as client:
        for route, body in bodies(QUERY, DOCS, truncate_prompt_tokens=4, scoring="maxsim"):
            if "texts" in body:  # TEI's body has no `scoring`
                continue
            r = client.post(route, json=body)
            assert r.status_code == 200, (route, r.text)
            assert fake.calls[-1].output == "token-vectors" and sent(fake) == list(chain.from_iterable(cut))


def test_k_bounds_a_cross_encoders_whole_pair_cut_longest_first(folders) -> None:
    tok = Tokenizer(load_spec(folders["bert"]))
    fake, gw = served(folders["bert"])
    with fake, gw as client:
        for k in (10, 4):  # 4: [CLS] [SEP] [SEP] and one token of the longer text
            pairs = tok.encode_pairs([(QUERY, LONG), (QUERY, DOCS[0])], max_length=k)
            assert all(len(p.ids) == k for p in pairs)
            for route, body in bodies(QUERY, [LONG, DOCS[0]], truncate_prompt_tokens=k):
                r = client.post(route, json=body)
                assert r.status_code == 200, (route, r.text)
                assert sent(fake) == list(chain.from_iterable(p.ids for p in pairs))
                assert fake.calls[-1].token_types == bytes(chain.from_iterable(p.type_ids for p in pairs))
                np.testing.assert_allclose(scores_of(route, r.json()),
                                           fake_scores([p.ids for p in pairs], [p.type_ids for p in pairs])[:, 0],
                                           atol=1e-6)
        whole = tok.encode_pairs([(QUERY, LONG)])[0].ids
        for route, body in bodies(QUERY, [LONG], truncate_prompt_tokens=-1):
            r = client.post(route, json=body)
            assert r.status_code == 200 and sent(fake) == whole and len(whole) == 256, (route, r.text)
        for k in (3, 257):  # no room for a token of the texts; over the model's length
            r = client.post("/score", json={"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": k})
            error = r.json()["error"]
            assert r.status_code == 422 and error["param"] == "truncate_prompt_tokens", r.text
            assert "between 4 " in error["message"] and "256" in error["message"]


def test_k_bounds_a_yes_no_rerankers_whole_prompt_cutting_the_middle(folders) -> None:
    tok = Tokenizer(load_spec(folders["qwen3"]))
    prefix, suffix = (list(e.ids) for e in tok.content_encodings([QWEN3_RERANK_PREFIX, QWEN3_RERANK_SUFFIX]))
    fixed = len(prefix) + len(suffix)
    long_doc = "cats sleep on the sofa " * 60
    fake, gw = served(folders["qwen3"])
    with fake, gw as client:
        for route, body in bodies(QUERY, [long_doc], truncate_prompt_tokens=fixed + 12):
            r = client.post(route, json=body)
            assert r.status_code == 200, (route, r.text)
            ids = sent(fake)
            assert len(ids) == fixed + 12 and ids[:len(prefix)] == prefix and ids[-len(suffix):] == suffix
        r = client.post("/rerank", json={"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": fixed})
        assert r.status_code == 422 and r.json()["error"]["param"] == "truncate_prompt_tokens", r.text
        assert "prompt" in r.json()["error"]["message"]


# ---- the fields errors name ----

WORDS, CHARS = "word " * 300, "a" * 5000  # over the model's tokens; over the character cap
NAMED = [
    ("/v1/rerank", {"query": WORDS, "documents": ["a", "b"]}, "query"),
    ("/v1/rerank", {"query": CHARS, "documents": ["a", "b"]}, "query"),
    ("/rerank", {"query": WORDS, "texts": ["a", "b"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": [CHARS]}, "documents[0]"),
    ("/v1/rerank", {"query": "q", "documents": [WORDS]}, "documents[0]"),
    ("/v1/rerank", {"query": "q", "documents": CHARS}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a", WORDS]}, "documents[1]"),
    ("/rerank", {"query": "q", "texts": [CHARS]}, "texts[0]"),
    ("/v1/score", {"text_1": WORDS, "text_2": ["a", "b"]}, "text_1"),
    ("/v1/score", {"text_1": [WORDS], "text_2": ["a", "b"]}, "text_1[0]"),
    ("/v1/score", {"text_1": ["a", WORDS], "text_2": ["b", "c"]}, "text_1[1]"),
    ("/v1/score", {"text_1": CHARS, "text_2": ["a"]}, "text_1"),
    ("/v1/score", {"text_1": "q", "text_2": WORDS}, "text_2"),
    ("/v1/score", {"text_1": "q", "text_2": [WORDS]}, "text_2[0]"),
    ("/v1/score", {"text_1": "q", "text_2": [CHARS]}, "text_2[0]"),
]


@pytest.mark.parametrize("name", ["bert", "qwen3"])
def test_a_cross_encoder_names_the_field_the_embedding_path_names(folders, client, name) -> None:
    fake, gw = served(folders[name])
    with fake, gw as cross:
        for route, body, param in NAMED:
            for c in (client, cross):
                r = c.post(route, json=body)
                error = r.json()["error"]
                assert r.status_code == 422 and (error["param"], error["code"]) == (param, "input_too_long"), (
                    route, body["query" if "query" in body else "text_1"][:10], error)
        assert not fake.calls
