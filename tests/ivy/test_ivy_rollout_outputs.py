"""A rollout where Ivy upgrades before Tulip (deploy/RUNBOOK.md "Upgrade and rollback": either side may roll
first): a reranker's raw scores, Tulip's `logit` output, go only to the replicas whose Info names it; with none
of those serving, a 503 that says why, never the older Tulip's INVALID_ARGUMENT as the client's fault."""

from __future__ import annotations

from cross_folders import bert_reranker
from fake_tulip import FakeTulip
from ivy_testkit import gateway
from test_ivy_scoring import DOCS, QUERY

RAW = {"query": QUERY, "documents": DOCS, "use_activation": False}
PLAIN = {"query": QUERY, "documents": DOCS}


def test_raw_scores_go_to_the_replicas_that_serve_them(tmp_path) -> None:
    folder = bert_reranker(tmp_path)
    with FakeTulip(model_dir=folder, older_info=True) as old, FakeTulip(model_dir=folder) as new, \
            gateway(old, new, model=str(folder), coalesce=False) as client:
        for _ in range(6):
            assert client.post("/v1/rerank", json=RAW).status_code == 200
            for _ in range(2):  # ties between idle replicas rotate a turn a call: RAW's turns skip `old`
                assert client.post("/v1/rerank", json=PLAIN).status_code == 200
        assert [c.output for c in old.calls] == [""] * len(old.calls) and old.calls  # plain scores: both replicas
        assert [c.output for c in new.calls].count("logit") == 6


def test_with_only_older_replicas_raw_scores_are_a_503_that_names_the_rollout(tmp_path) -> None:
    folder = bert_reranker(tmp_path)
    with FakeTulip(model_dir=folder, older_info=True) as old, gateway(old, model=str(folder)) as client:
        r = client.post("/v1/rerank", json=RAW)
        assert r.status_code == 503, r.text
        assert "older Tulip" in r.json()["error"]["message"] and "rollout" in r.json()["error"]["message"]
        assert not old.calls  # never sent: the older Tulip would refuse it as the client's INVALID_ARGUMENT
        assert client.post("/v1/rerank", json=PLAIN).status_code == 200  # the rest of the API is served
