"""RELIABILITY 28 and 39 on Ivy's side: a replica that stops answering (SIGSTOP, a stuck GPU) while its health may
still say SERVING is ejected after the attempt timeout; its chunks are cancelled there and answered by
another replica within the request's deadline."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from fake_tulip import FakeTulip, wait_until
from ivy import dispatch
from ivy.replica import Replica
from ivy.replicas import State
from ivy.stream import CallFailed
from protos import embed_pb2
from ivy_testkit import gateway

TEXTS = [f"sentence number {i} about topic {i % 3}" for i in range(9)]


def _vectors(r) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


@pytest.mark.parametrize("stream", [True, False])
def test_a_hung_replica_is_ejected_and_the_request_answered_by_the_other(stream: bool) -> None:
    with FakeTulip() as reference:
        with gateway(reference) as client:
            expected = _vectors(client.post("/v1/embeddings", json={"input": TEXTS}))
    hung = FakeTulip(gate=threading.Event())  # takes every Embed and never answers; health says SERVING
    with hung, FakeTulip() as good:
        with gateway(hung, good, chunk_max_seqs=1, replica_timeout_s=0.5, health_interval_s=60,
                     grpc_stream=stream) as client:
            r = client.post("/v1/embeddings", json={"input": TEXTS}, headers={"X-Request-Timeout": "20"})
            np.testing.assert_allclose(_vectors(r), expected, atol=1e-6)  # not a 504 after 20 s
            pool = client.app.state.gateway.pool
            assert pool.replicas[0].state is State.UNREACHABLE  # until a probe answers again
            assert "no answer within 0.5 s" in pool.replicas[0].detail
            wait_until(lambda: hung.waiting == 0)  # its chunks were cancelled there
            assert hung.calls == [] and good.tokens_served == reference.tokens_served
            retries = client.get("/metrics").text
            assert 'ivy_chunk_retries_total{reason="TIMEOUT"}' in retries


def test_every_replica_is_given_the_request_deadline_the_attempt_timeout_is_ivys() -> None:
    """The replica is told the request's own deadline (its admission and its work are bounded by that), with
    one replica or several; the attempt timeout is Ivy's own decision to look elsewhere."""
    with FakeTulip() as a, FakeTulip() as b:
        with gateway(a, b, replica_timeout_s=3) as client:
            assert client.post("/v1/embeddings", json={"input": "x"},
                               headers={"X-Request-Timeout": "20"}).status_code == 200
        (two,) = a.timeouts + b.timeouts
        with gateway(a, replica_timeout_s=10) as client:
            assert client.post("/v1/embeddings", json={"input": "x"},
                               headers={"X-Request-Timeout": "5"}).status_code == 200
    assert 15 < two <= 20 and 1 < a.timeouts[-1] <= 5  # seconds of margin for a stall of the loaded host


@pytest.mark.parametrize("stream", [True, False])
def test_every_replica_late_at_once_is_waited_for_not_ejected(stream: bool) -> None:
    """A stall of the whole host (a GC pause, a starved CPU: every replica late at once) is not a hung
    replica: with no other replica shown to answer, a late attempt goes on, nothing is ejected and the
    request is answered. (Ejecting on the timeout alone ejected both and answered 504 at once.)"""
    timeouts = _retries("TIMEOUT")
    with FakeTulip(delay_s=1.0) as a, FakeTulip(delay_s=1.0) as b:
        with gateway(a, b, chunk_max_seqs=1, replica_timeout_s=0.3, health_interval_s=60,
                     grpc_stream=stream) as client:
            r = client.post("/v1/embeddings", json={"input": ["one", "two"]}, headers={"X-Request-Timeout": "20"})
            assert r.status_code == 200, r.text
            pool = client.app.state.gateway.pool
            assert [rep.state for rep in pool.replicas] == [State.SERVING, State.SERVING]
            assert len(a.calls) == 1 and len(b.calls) == 1  # one chunk each, neither re-sent
    assert _retries("TIMEOUT") == timeouts


def _retries(reason: str) -> float:
    return REGISTRY.get_sample_value("ivy_chunk_retries_total", {"reason": reason}) or 0.0


def test_a_replica_down_keeps_its_first_cause() -> None:
    """An ejection closes the replica's stream, so its other chunks in flight then fail UNAVAILABLE: the
    replica's detail (in /ready's body) still says why it went down."""
    async def run() -> tuple[str, str]:
        replica = Replica("127.0.0.1:1", [], stream=False)
        replica.eject("no answer within 0.5 s")
        replica.mark_down("Embed failed: UNAVAILABLE")
        first = replica.detail
        replica.set_state(State.SERVING)  # a probe answered
        replica.mark_down("Embed failed: UNAVAILABLE")
        await replica.close()
        return first, replica.detail

    assert asyncio.run(run()) == ("no answer within 0.5 s", "Embed failed: UNAVAILABLE")


@pytest.mark.parametrize("stream", [True, False])
def test_a_one_chunk_request_on_a_hung_replica_is_answered_by_the_other(stream: bool) -> None:
    """One chunk runs in the request's own task (no gather): giving the attempt up cancels that task and
    takes the cancellation back, and the request goes on to the other replica."""
    hung = FakeTulip(gate=threading.Event())
    timeouts = _retries("TIMEOUT")
    with hung, FakeTulip() as good:
        with gateway(hung, good, replica_timeout_s=0.5, health_interval_s=60, grpc_stream=stream) as client:
            for _ in range(2):  # the first pick may land on either; the second goes where the first did not
                r = client.post("/v1/embeddings", json={"input": "one text"}, headers={"X-Request-Timeout": "20"})
                assert r.status_code == 200, r.text
            assert len(good.calls) == 2 and hung.calls == []
    assert _retries("TIMEOUT") == timeouts + 1  # one of the two went to the hung replica first


class _Pool:
    attempt_timeout_s = 0.2

    def __init__(self, other_answers: bool = True) -> None:
        self.other_answers = other_answers

    def answering_other(self, tried, replica, since, output="") -> bool:
        return self.other_answers


class _Replica:
    address = "test"

    def __init__(self, answer: asyncio.Future) -> None:
        self.attempts: dict = {}
        self.last_answer = float("-inf")
        self.answer = answer

    async def embed(self, request, timeout, response_bytes):
        return await self.answer


def test_an_answer_in_the_same_loop_turn_as_the_look_is_returned_not_lost() -> None:
    """The answer and the look land in one turn of the loop (after a stall, say): the rows come back."""
    async def run():
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        when = loop.time() + 0.2  # the look's own time: both callbacks run in the same turn, the answer first
        loop.call_at(when, answer.set_result, "rows")
        return await dispatch._attempt(_Pool(), _Replica(answer), set(), embed_pb2.EmbedRequest(), 5.0, 0)

    assert asyncio.run(run()) == "rows"


def test_a_late_look_reads_the_answers_that_waited_first() -> None:
    """The loop is held past the look's time (a stalled host) while the answer arrives; reading it takes a few
    turns of the loop (as the stream's reader task does). The late look looks once more, so the answer is
    returned; a replica that still has not answered by then is given up."""
    async def run(answered: bool):
        loop = asyncio.get_running_loop()
        replica = _Replica(loop.create_future())

        async def reader() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
            replica.answer.set_result("rows")

        def stall() -> None:
            if answered:  # arrives during the stall; its callback runs once the loop turns again
                threading.Thread(target=lambda: loop.call_soon_threadsafe(loop.create_task, reader())).start()
            time.sleep(0.4)

        loop.call_later(0.05, stall)
        try:
            return await dispatch._attempt(_Pool(), replica, set(), embed_pb2.EmbedRequest(), 5.0, 0)
        except dispatch._Overdue:
            return "given up"
        finally:
            assert replica.attempts == {} and asyncio.current_task().cancelling() == 0

    assert asyncio.run(run(answered=True)) == "rows"
    assert asyncio.run(run(answered=False)) == "given up"


def test_a_queue_full_answer_does_not_show_room_for_a_chunk() -> None:
    """A replica that answers queue full is alive but cannot take a late chunk: its answer does not make it a
    place to re-send one (answering_other reads last_answer); an answer with rows, or another error, does."""
    async def attempt(code):
        loop = asyncio.get_running_loop()
        replica = _Replica(loop.create_future())
        if code is None:
            replica.answer.set_result("rows")
        else:
            replica.answer.set_exception(CallFailed(code, "details"))
        try:
            await dispatch._attempt(_Pool(other_answers=False), replica, set(), embed_pb2.EmbedRequest(), 5.0, 0)
        except CallFailed:
            pass
        return replica.last_answer > float("-inf")

    shown = {code: asyncio.run(attempt(code)) for code in (None, grpc.StatusCode.INVALID_ARGUMENT,
                                                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                            grpc.StatusCode.UNAVAILABLE)}
    assert shown == {None: True, grpc.StatusCode.INVALID_ARGUMENT: True,
                     grpc.StatusCode.RESOURCE_EXHAUSTED: False, grpc.StatusCode.UNAVAILABLE: False}
