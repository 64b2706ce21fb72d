"""Cross-encoders through the whole stack (`ivy up --model DIR` on the CPU: HTTP -> Ivy -> Tulip -> ROSE): a
BERT reranker saved by sentence-transformers' CrossEncoder and a Qwen3-Reranker folder, tiny and random;
/v1/rerank and /v1/score equal CrossEncoder.predict / the model card's recipe within 1e-4, ordered by them."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from stack_testkit import ivy_up

pytestmark = pytest.mark.slow
pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")
sys.path.insert(0, str(Path(__file__).parent.parent / "rose"))  # the tiny model builders

from rose_cross_models import (build_bert_ce, build_qwen3_reranker, cross_encoder_scores,  # noqa: E402
                               qwen3_recipe_ids, qwen3_yes_probability)

QUERY = "the quick brown fox"
DOCS = ["the lazy dog", "hello world", "fox jumps over the dog", "rose tulip ivy", "a quick brown fox jumps"]


@pytest.fixture(scope="module", params=["bert-ce", "qwen3-reranker"])
def stack(request, tmp_path_factory):
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    root = tmp_path_factory.mktemp("e2e-rerankers")
    folder = build_bert_ce(root) if request.param == "bert-ce" else build_qwen3_reranker(root)
    if request.param == "bert-ce":
        reference = cross_encoder_scores(folder, [(QUERY, d) for d in DOCS])
    else:
        reference = qwen3_yes_probability(folder, [qwen3_recipe_ids(folder, QUERY, d) for d in DOCS])
    proc, port = ivy_up("--model", str(folder), "--gpus", "none")
    try:
        assert any("/v1/rerank" in line for line in proc.out)  # the banner's example is a rerank
        yield f"http://127.0.0.1:{port}", folder.name, reference
    finally:
        code = proc.stop()
    assert code == 0, proc.output()


def test_rerank_through_the_stack_matches_the_reference(stack):
    url, name, reference = stack
    r = httpx.post(f"{url}/v1/rerank", json={"model": name, "query": QUERY, "documents": DOCS, "top_n": 3,
                                             "return_documents": True}, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == list(np.argsort(-reference, kind="stable")[:3])
    for item in results:
        assert abs(item["relevance_score"] - reference[item["index"]]) <= 1e-4
        assert item["document"]["text"] == DOCS[item["index"]]


def test_score_and_models_through_the_stack(stack):
    url, name, reference = stack
    r = httpx.post(f"{url}/v1/score", json={"model": name, "text_1": QUERY, "text_2": DOCS}, timeout=60)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], reference, atol=1e-4)
    card = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
    assert (card["tasks"], card["dimensions"]) == (["rerank"], 1)
    refused = httpx.post(f"{url}/v1/embeddings", json={"model": name, "input": "hi"}, timeout=10)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unsupported_task"
