"""A rollout where Ivy upgrades before Tulip (deploy/RUNBOOK.md "Upgrade and rollback": either side may roll
first): a reranker's `logit` output (raw scores, /predict) goes to the replicas whose Info names it, or names none
and has not refused it; one that refuses it as unknown (an older Tulip) is not sent it again and the chunk goes
elsewhere; with none left, a 503 that says why, never the older Tulip's INVALID_ARGUMENT as the client's fault
(RELIABILITY 60)."""

from __future__ import annotations

import pytest
from cross_folders import bert_reranker
from fake_tulip import FakeTulip
from ivy_testkit import gateway
from test_ivy_scoring import DOCS, QUERY

from ivy.replicas import State

RAW = {"query": QUERY, "documents": DOCS, "use_activation": False}
PLAIN = {"query": QUERY, "documents": DOCS}


@pytest.fixture()
def folder(tmp_path):
    return bert_reranker(tmp_path)


def test_raw_scores_go_to_the_replicas_that_serve_them(folder) -> None:
    with FakeTulip(model_dir=folder, older_info=True) as old, FakeTulip(model_dir=folder) as new, \
            gateway(old, new, model=str(folder), coalesce=False) as client:
        with FakeTulip(model_dir=folder) as alone, gateway(alone, model=str(folder)) as reference:
            expected = reference.post("/v1/rerank", json=RAW).json()["results"]
        for _ in range(6):
            r = client.post("/v1/rerank", json=RAW)
            assert r.status_code == 200, r.text
            assert r.json()["results"] == expected  # the older replica's refusal never reached the client
            for _ in range(2):  # ties between idle replicas rotate a turn a call: RAW's turns skip `old`
                assert client.post("/v1/rerank", json=PLAIN).status_code == 200
        assert [c.output for c in old.calls] == [""] * len(old.calls) and old.calls  # plain scores: both replicas
        assert [c.output for c in new.calls].count("logit") == 6


def test_with_only_older_replicas_raw_scores_are_a_503_that_names_the_rollout(folder) -> None:
    with FakeTulip(model_dir=folder, older_info=True) as old, gateway(old, model=str(folder)) as client:
        for route, body in (("/v1/rerank", RAW), ("/v1/rerank", RAW), ("/predict", {"inputs": [[QUERY, DOCS[0]]]})):
            r = client.post(route, json=body)
            assert r.status_code == 503, r.text
            message = r.json()["error"]["message"]
            assert "'logit'" in message and "older Tulip" in message and "rollout" in message
        assert client.post("/v1/rerank", json=PLAIN).status_code == 200  # the rest of the API is served
        assert client.app.state.gateway.pool.replicas[0].state is State.SERVING


def test_a_late_replica_is_not_ejected_for_one_that_may_not_take_its_chunk(folder) -> None:
    """The only replica known to serve `logit` runs past the attempt timeout while an older one is idle: the
    chunk waits for its answer (the older one is no place to re-send it), and nothing is ejected."""
    with FakeTulip(model_dir=folder, older_info=True) as old, FakeTulip(model_dir=folder, delay_s=0.8) as new, \
            gateway(old, new, model=str(folder), coalesce=False, replica_timeout_s=0.2, health_interval_s=60) as client:
        for _ in range(2):  # either replica picked first
            r = client.post("/v1/rerank", json=RAW, headers={"X-Request-Timeout": "20"})
            assert r.status_code == 200, r.text
        assert [rep.state for rep in client.app.state.gateway.pool.replicas] == [State.SERVING, State.SERVING]
