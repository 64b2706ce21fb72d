"""Priority lanes in Ivy (issue 17): the lane from the body, the X-Priority header, the API key or the
request's size; the coalescer never merges lanes; Tulip's deadline_unmeetable refusal is a 429 at once."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest
from fake_tulip import FakeTulip
from ivy.coalesce import Coalescer
from ivy.errors import IvyError, Problem, from_grpc
from ivy.lanes import lane_name, parse_key_lanes
from ivy.schemas import EmbeddingsRequest
from ivy_testkit import gateway
from protos import embed_pb2
from rose.head import Encoding

BULK, INTERACTIVE = embed_pb2.LANE_BULK, embed_pb2.LANE_INTERACTIVE


@pytest.mark.parametrize("value,lane", [("interactive", "interactive"), ("BULK", "bulk"), (0, "interactive"),
                                        (-3, "interactive"), (1, "bulk"), (0.5, "bulk"), ("2", "bulk")])
def test_priority_values(value, lane) -> None:
    assert lane_name(value) == lane


@pytest.mark.parametrize("value", ["urgent", True, None, "nan", [1]])
def test_bad_priority_is_a_422_naming_the_field(value) -> None:
    with pytest.raises(IvyError) as err:
        lane_name(value)
    assert err.value.problem is Problem.INVALID_PARAMETER and err.value.param == "priority"


def test_schema_states_the_rule() -> None:
    schema = EmbeddingsRequest.model_json_schema()["properties"]["priority"]
    assert "<= 0 interactive, > 0 bulk" in schema["description"]
    assert EmbeddingsRequest.model_validate({"input": "a", "priority": 5}).priority == "bulk"


def test_key_lanes_parse_and_refuse_malformed_entries() -> None:
    assert parse_key_lanes(("k1=bulk", "k2=Interactive")) == {"k1": "bulk", "k2": "interactive"}
    for bad in (("k1",), ("=bulk",), ("k1=fast",)):
        with pytest.raises(ValueError) as err:
            parse_key_lanes(bad)
        assert "k1" not in str(err.value)


def lanes_of(fake: FakeTulip) -> list[int]:
    return [c.lane for c in fake.calls]


def test_lane_from_body_header_key_and_size() -> None:
    with FakeTulip() as fake, gateway(fake, api_key="main", api_key_lanes=("idx=bulk", "ui=interactive"),
                                      bulk_above_tokens=20, coalesce=False) as client:
        def post(body, key="main", **headers):
            r = client.post("/v1/embeddings", json={"input": "hello world", **body},
                            headers={"Authorization": f"Bearer {key}", **headers})
            assert r.status_code == 200, r.text
            return fake.calls[-1].lane

        assert post({}) == INTERACTIVE  # small, the main key has no lane: by size
        assert post({"input": "word " * 40}) == BULK  # over bulk_above_tokens
        assert post({"priority": "bulk"}) == BULK
        assert post({"priority": 1}) == BULK and post({"priority": 0}) == INTERACTIVE
        assert post({}, **{"X-Priority": "bulk"}) == BULK
        assert post({}, key="idx") == BULK  # the key's lane
        assert post({"input": "word " * 40}, key="ui") == INTERACTIVE  # the key's lane beats size
        assert post({}, key="idx", **{"X-Priority": "interactive"}) == INTERACTIVE  # header beats key
        assert post({"priority": "bulk"}, key="ui", **{"X-Priority": "interactive"}) == BULK  # body beats both
        r = client.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        r = client.post("/v1/embeddings", json={"input": "a"},
                        headers={"Authorization": "Bearer main", "X-Priority": "urgent"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "x-priority"
        r = client.post("/embed", json={"inputs": "a", "priority": "bulk"}, headers={"Authorization": "Bearer main"})
        assert r.status_code == 200 and fake.calls[-1].lane == BULK


@pytest.mark.parametrize("route,body", [("/v1/score", {"text_1": "q", "text_2": ["a", "b"]}),
                                        ("/v1/rerank", {"query": "q", "documents": ["a", "b"]})])
def test_scoring_routes_take_the_lane_from_body_header_and_key(route, body) -> None:
    with FakeTulip() as fake, gateway(fake, api_key="main", api_key_lanes=("idx=bulk",), bulk_above_tokens=1000,
                                      coalesce=False) as client:
        def lane(extra=None, key="main", **headers):
            r = client.post(route, json={**body, **(extra or {})}, headers={"Authorization": f"Bearer {key}",
                                                                           **headers})
            assert r.status_code == 200, r.text
            return fake.calls[-1].lane

        assert lane() == INTERACTIVE  # small and no lane asked: by size
        assert lane({"priority": "bulk"}) == BULK and lane({"priority": 2}) == BULK
        assert lane(**{"X-Priority": "bulk"}) == BULK
        assert lane(key="idx") == BULK
        assert lane({"priority": "interactive"}, key="idx", **{"X-Priority": "bulk"}) == INTERACTIVE
        r = client.post(route, json={**body, "priority": "urgent"}, headers={"Authorization": "Bearer main"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "priority"


def test_key_lanes_alone_turn_auth_on() -> None:
    with FakeTulip() as fake, gateway(fake, api_key_lanes=("idx=bulk",)) as client:
        assert client.post("/v1/embeddings", json={"input": "a"}).status_code == 401
        ok = client.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer idx"})
        assert ok.status_code == 200 and fake.calls[-1].lane == BULK


class FakeCall:
    def __init__(self) -> None:
        self.requests: list[embed_pb2.EmbedRequest] = []

    async def __call__(self, request, tokens, deadline):
        self.requests.append(request)
        n = len(request.seq_lens) // 4
        return embed_pb2.EmbedResponse(embeddings=np.zeros((n, 4), np.float32).tobytes(), rows=n, dimensions=4,
                                       encoding=0, tokens=tokens)


def test_the_coalescer_keeps_lanes_apart() -> None:
    call = FakeCall()

    async def main():
        c = Coalescer(call, max_tokens=1000, max_seqs=64)

        def one(seqs, lane):
            return c.embed(seqs, sum(map(len, seqs)), deadline=time.monotonic() + 10, dimensions=0, normalize=None,
                           encoding=Encoding.FLOAT32, request_id="r", lane=lane)
        return await asyncio.gather(one([[1, 2]], BULK), one([[3]], INTERACTIVE), one([[4]], BULK),
                                    one([[5, 6]], INTERACTIVE))

    asyncio.run(main())
    by_lane = sorted((r.lane, np.frombuffer(r.seq_lens, "<i4").tolist()) for r in call.requests)
    assert by_lane == [(INTERACTIVE, [1, 2]), (BULK, [2, 1])]


def test_deadline_unmeetable_is_a_429_with_retry_after_and_is_not_retried() -> None:
    error = from_grpc(grpc.StatusCode.RESOURCE_EXHAUSTED, "the deadline cannot be met", "r", "deadline_unmeetable")
    assert error.problem is Problem.DEADLINE_UNMEETABLE and error.status == 429
    with FakeTulip(fail_with=grpc.StatusCode.RESOURCE_EXHAUSTED, fail_reason="deadline_unmeetable") as fake, \
            gateway(fake) as client:
        r = client.post("/v1/embeddings", json={"input": "a"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "deadline_unmeetable"
        assert len(fake.calls) + fake.queue_full <= 1  # answered at once: no pauses and retries as for queue_full


@pytest.mark.parametrize("stream", [True, False])
def test_retry_after_is_tulips_estimate_of_the_wait_ahead(stream) -> None:
    with FakeTulip(fail_with=grpc.StatusCode.RESOURCE_EXHAUSTED, fail_reason="deadline_unmeetable",
                   fail_retry_after_s=4.2) as fake, gateway(fake, grpc_stream=stream) as client:
        r = client.post("/v1/embeddings", json={"input": "a"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "deadline_unmeetable"
        assert r.headers["retry-after"] == "5"  # 4.2 s rounded up to HTTP's whole seconds
        assert (fake.streams_opened > 0) == stream and (fake.unary_calls > 0) != stream


@pytest.mark.parametrize("estimate,header", [(None, "1"), (0.0, "1"), (0.2, "1"), (3.0, "3"), (1e9, "3600"),
                                             (float("nan"), "1")])
def test_retry_after_rounds_the_estimate_up_within_bounds(estimate, header) -> None:
    error = from_grpc(grpc.StatusCode.RESOURCE_EXHAUSTED, "", "r", "deadline_unmeetable", estimate)
    assert error.to_response().headers["retry-after"] == header


def test_proto_round_trip_of_the_lane() -> None:
    req = embed_pb2.EmbedRequest(token_ids=b"\x01\x00\x00\x00", seq_lens=b"\x01\x00\x00\x00", lane=BULK)
    back = embed_pb2.EmbedRequest.FromString(req.SerializeToString())
    assert back.lane == embed_pb2.LANE_BULK and embed_pb2.EmbedRequest().lane == embed_pb2.LANE_INTERACTIVE
    stream = embed_pb2.StreamRequest.FromString(embed_pb2.StreamRequest(id=3, request=req).SerializeToString())
    assert stream.request.lane == BULK
