"""RELIABILITY 59: the calls of one HTTP request share one flow in Tulip's queue (they wait as one request), a
key of Ivy's own, never the client's X-Request-Id, which any number of requests may carry."""

from __future__ import annotations

from fake_tulip import FakeTulip
from ivy_testkit import gateway

from ivy import request_trace


def _flows_by_request(client, fake, headers_list) -> list[set[str]]:
    flows = []
    for headers in headers_list:
        first = len(fake.calls)
        r = client.post("/v1/embeddings", json={"input": ["a b", "c d", "e f"]}, headers=headers)
        assert r.status_code == 200, r.text
        calls = fake.calls[first:]
        assert len(calls) == 3  # chunk_max_seqs=1: three calls
        assert {c.request_id for c in calls} == {r.headers["x-request-id"]}  # the logs' id stays the client's
        flows.append({c.flow for c in calls})
    return flows


def test_one_flow_a_request_whatever_request_id_the_client_sends() -> None:
    with FakeTulip() as fake, gateway(fake, chunk_max_seqs=1, coalesce=False) as client:
        same = {"X-Request-Id": "trace-1"}
        flows = _flows_by_request(client, fake, [same, same, {}])
    assert all(len(f) == 1 and "" not in f for f in flows)  # each request's chunks share one non-empty flow
    assert len(set.union(*flows)) == 3  # three requests, three flows, though two sent the same id
    assert "trace-1" not in set.union(*flows)


def test_outside_a_request_each_call_is_its_own_flow() -> None:
    assert request_trace.request_flow() != request_trace.request_flow()
