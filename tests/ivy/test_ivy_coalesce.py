"""Concurrent requests sharing one gRPC call (ivy/coalesce.py): grouping, splitting, failures, departures."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
from fake_tulip import FakeTulip
from ivy.coalesce import Coalescer
from ivy.errors import IvyError, Problem
from ivy_testkit import gateway
from protos import embed_pb2
from rose.head import Encoding

DIMS = 8


class FakeCall:
    """Answers each call with one row per sequence: [first token id, sequence length, 0, ...]."""

    def __init__(self, delay_s: float = 0.0, error: Exception | None = None, cold: bool = False,
                 timings: tuple[int, int, int] = (0, 0, 0)) -> None:
        self.delay_s, self.error, self.cold, self.timings = delay_s, error, cold, timings
        self.requests: list[embed_pb2.EmbedRequest] = []
        self.cancelled = 0

    async def __call__(self, request: embed_pb2.EmbedRequest, tokens: int, deadline: float):
        self.requests.append(request)
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.error is not None:
            raise self.error
        ids, lens = np.frombuffer(request.token_ids, "<i4"), np.frombuffer(request.seq_lens, "<i4")
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        rows = np.zeros((len(lens), DIMS), np.float32)
        rows[:, 0], rows[:, 1] = ids[starts], lens
        return embed_pb2.EmbedResponse(embeddings=rows.tobytes(), rows=len(lens), dimensions=DIMS, encoding=0,
                                       tokens=int(lens.sum()), cold=self.cold, queue_us=self.timings[0],
                                       inference_us=self.timings[1], batcher_us=self.timings[2])


def _run(coro):
    return asyncio.run(coro)


def _embed(c: Coalescer, seqs, deadline_s: float = 10.0, dims: int = 0, encoding=Encoding.FLOAT32):
    return c.embed(seqs, sum(map(len, seqs)), deadline=time.monotonic() + deadline_s, dimensions=dims,
                   normalize=None, encoding=encoding, request_id="r")


def test_requests_ready_together_share_one_call_and_get_their_own_rows() -> None:
    call = FakeCall()

    async def main():
        c = Coalescer(call, max_tokens=1000, max_seqs=64)
        return await asyncio.gather(_embed(c, [[10, 11, 12]]), _embed(c, [[20], [21, 22]]), _embed(c, [[30] * 5]))

    a, b, d = _run(main())
    assert len(call.requests) == 1 and np.frombuffer(call.requests[0].seq_lens, "<i4").tolist() == [3, 1, 2, 5]
    assert a[:, :2].tolist() == [[10, 3]] and b[:, :2].tolist() == [[20, 1], [21, 2]] and d[:, :2].tolist() == [[30, 5]]


def test_other_options_a_full_group_or_a_later_turn_start_new_calls() -> None:
    call = FakeCall()

    async def main():
        c = Coalescer(call, max_tokens=6, max_seqs=64)
        together = await asyncio.gather(_embed(c, [[1, 1]]), _embed(c, [[2, 2]], dims=4),
                                        _embed(c, [[3, 3, 3]]), _embed(c, [[4, 4]]))  # 2 + 3 fit, + 2 does not
        alone = await _embed(c, [[5]])
        return together, alone

    together, alone = _run(main())
    assert [np.frombuffer(r.seq_lens, "<i4").tolist() for r in call.requests] == [[2, 3], [2], [2], [1]]
    assert [r.dimensions for r in call.requests] == [0, 4, 0, 0]  # the full group leaves at once
    assert [t[0, 0] for t in together] == [1, 2, 3, 4] and alone[0, 0] == 5


def test_a_failed_call_fails_every_member() -> None:
    call = FakeCall(error=IvyError(Problem.UNAVAILABLE, "no replica"))

    async def main():
        c = Coalescer(call, max_tokens=100, max_seqs=64)
        return await asyncio.gather(_embed(c, [[1]]), _embed(c, [[2]]), return_exceptions=True)

    results = _run(main())
    assert len(call.requests) == 1 and all(isinstance(r, IvyError) and r.status == 503 for r in results)


def test_one_members_bad_input_is_its_own_error_not_the_groups() -> None:
    """The replica rejects a shared call for one input (INVALID_ARGUMENT): each member is sent alone."""

    class Picky(FakeCall):
        async def __call__(self, request, tokens, deadline):
            if 666 in np.frombuffer(request.token_ids, "<i4"):
                self.requests.append(request)
                raise IvyError(Problem.INVALID_PARAMETER, "the model replica rejected the input: token 666")
            return await super().__call__(request, tokens, deadline)

    call = Picky()

    async def main():
        c = Coalescer(call, max_tokens=100, max_seqs=64)
        return await asyncio.gather(_embed(c, [[1]]), _embed(c, [[666]]), _embed(c, [[3]]), return_exceptions=True)

    a, bad, b = _run(main())
    assert a[0, 0] == 1 and b[0, 0] == 3
    assert isinstance(bad, IvyError) and bad.problem is Problem.INVALID_PARAMETER
    assert [np.frombuffer(r.seq_lens, "<i4").size for r in call.requests] == [3, 1, 1, 1]
    assert [r.request_id for r in call.requests] == ["r,r,r", "r", "r", "r"]


def test_a_member_past_its_deadline_leaves_the_others_get_their_rows() -> None:
    call = FakeCall(delay_s=0.3)

    async def main():
        c = Coalescer(call, max_tokens=100, max_seqs=64)
        return await asyncio.gather(_embed(c, [[1]], deadline_s=0.05), _embed(c, [[2]]), return_exceptions=True)

    short, ok = _run(main())
    assert isinstance(short, IvyError) and short.problem is Problem.DEADLINE_EXCEEDED
    assert ok[0, 0] == 2 and call.cancelled == 0  # the call went on for the member still waiting


def test_the_call_is_cancelled_only_when_every_member_has_gone() -> None:
    call = FakeCall(delay_s=5.0)

    async def main():
        c = Coalescer(call, max_tokens=100, max_seqs=64)
        tasks = [asyncio.ensure_future(_embed(c, [[i]])) for i in (1, 2)]
        while not call.requests:
            await asyncio.sleep(0.001)
        tasks[0].cancel()
        await asyncio.gather(tasks[0], return_exceptions=True)  # the first member has left
        for _ in range(3):  # the turns a cancellation of the shared call would take to reach it
            await asyncio.sleep(0)
        first_gone = call.cancelled
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        deadline = time.monotonic() + 10  # a hang guard: the call's cancellation is awaited, not timed
        while not call.cancelled and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        return first_gone, call.cancelled

    assert _run(main()) == (0, 1)


def test_a_member_gone_before_the_send_is_not_sent() -> None:
    call = FakeCall()

    async def main():
        c = Coalescer(call, max_tokens=100, max_seqs=64)
        return await asyncio.gather(_embed(c, [[1]], deadline_s=-1.0), _embed(c, [[2]]), return_exceptions=True)

    expired, stays = _run(main())
    assert isinstance(expired, IvyError) and expired.problem is Problem.DEADLINE_EXCEEDED
    assert stays[0, 0] == 2 and np.frombuffer(call.requests[0].token_ids, "<i4").tolist() == [2]


def test_a_member_cancelled_before_the_send_leaves_the_group() -> None:
    """A caller cancelled between joining and the send (its future already cancelled) is not sent,
    and the call's token count is recounted without it."""
    from ivy.coalesce import _Group, _Member

    call = FakeCall()

    async def main():
        c = Coalescer(call, max_tokens=100, max_seqs=64)
        loop = asyncio.get_running_loop()
        gone, stays = (_Member([[1, 1, 1]], 3, time.monotonic() + 5, "a", loop.create_future()),
                       _Member([[2]], 1, time.monotonic() + 5, "b", loop.create_future()))
        group = _Group((0, None, 0), [gone, stays], tokens=4, seqs=2)
        gone.future.cancel()
        c._send(group)
        await group.task
        return await stays.future

    assert _run(main())[0, 0] == 2
    assert np.frombuffer(call.requests[0].token_ids, "<i4").tolist() == [2]


def _gateway_burst(client, seqs: list[list[int]], together: bool) -> list[np.ndarray]:
    """Gateway.embed for each sequence on the app's event loop: all started in one turn (together), or one
    after another. Deterministic: which requests are ready in the same turn does not depend on timing."""
    gw = client.app.state.gateway

    async def one(seq):
        return await gw.embed([seq], deadline=time.monotonic() + 10)

    async def burst():
        if together:
            return await asyncio.gather(*(one(s) for s in seqs))
        return [await one(s) for s in seqs]

    return client.portal.call(burst)


def test_through_the_gateway_concurrent_requests_share_calls_and_get_exact_rows() -> None:
    """Requests ready in the same turn share calls (fewer calls than requests: fails with coalesce=False),
    and many clients at once through HTTP, whatever shares a call, each get their own text's rows."""
    texts = [f"request {i} about {'cats' if i % 2 else 'dogs'}" for i in range(24)]
    seqs = [[101, 1000 + i, 2000 + i % 5, 102] for i in range(24)]
    with FakeTulip() as fake:
        with gateway(fake, coalesce=False) as client:
            solo = {t: client.post("/v1/embeddings", json={"input": t}).json()["data"][0]["embedding"] for t in texts}
            solo_rows = _gateway_burst(client, seqs, together=False)
        calls_solo = len(fake.calls)
        with gateway(fake) as client:
            shared_rows = _gateway_burst(client, seqs, together=True)
            calls_shared = len(fake.calls) - calls_solo
            got: dict = {}

            def send(t: str) -> None:
                got[t] = client.post("/v1/embeddings", json={"input": t}).json()["data"][0]["embedding"]

            threads = [threading.Thread(target=send, args=(t,)) for t in texts]
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=30)
    assert calls_solo == len(texts) + len(seqs)
    # the first goes straight out (nothing waits on the replica yet); the rest, ready in the same turn, share
    assert calls_shared < len(seqs), f"{len(seqs)} requests ready together took {calls_shared} calls"
    assert max(c.seqs for c in fake.calls[calls_solo:calls_solo + calls_shared]) > 1
    for want, have in zip(solo_rows, shared_rows):
        np.testing.assert_allclose(have, want, atol=1e-6)
    for t in texts:
        np.testing.assert_allclose(got[t], solo[t], atol=1e-6)
    assert sum(c.seqs for c in fake.calls[calls_solo + calls_shared:]) == len(texts)


def test_over_framed_replicas_each_request_is_its_own_call() -> None:
    """When every serving replica takes its requests over the framed EmbedStream (ReplicaPool.all_framed), the
    requests ready in one turn are not grouped: one call each (coalescing stays for replicas on gRPC, above)."""
    seqs = [[101, 1000 + i, 2000 + i % 5, 102] for i in range(12)]
    with FakeTulip() as fake:
        with gateway(fake) as client:
            gw = client.app.state.gateway
            assert not gw.pool.all_framed()  # the fake speaks gRPC only
            gw.pool.all_framed = lambda: True
            rows = _gateway_burst(client, seqs, together=True)
    assert len(fake.calls) == len(seqs) and all(c.seqs == 1 for c in fake.calls)
    assert len(rows) == len(seqs)


def test_every_member_of_a_shared_call_gets_its_cold_flag_and_timings() -> None:
    from ivy import request_trace

    async def member(c: Coalescer, seq) -> tuple[bool, int, int, int]:
        trace = request_trace.RequestTrace(time.perf_counter())
        request_trace._TRACE.set(trace)  # what RequestMetrics does for each request's task
        await _embed(c, [seq])
        return trace.cold, trace.queue_us, trace.inference_us, trace.batcher_us

    async def main(cold: bool) -> list[tuple]:
        c = Coalescer(FakeCall(delay_s=0.01, cold=cold, timings=(120, 1400, 1800)), 8192, 64)
        return await asyncio.gather(*(member(c, [i + 1, 2]) for i in range(3)))

    assert _run(main(True)) == [(True, 120, 1400, 1800)] * 3
    assert _run(main(False)) == [(False, 120, 1400, 1800)] * 3


def test_all_framed_counts_the_serving_replicas_only() -> None:
    from types import SimpleNamespace

    from ivy.replica import State
    from ivy.replicas import ReplicaPool

    pool = object.__new__(ReplicaPool)
    framed, grpc_ = (SimpleNamespace(state=State.SERVING, on_framed=f) for f in (True, False))
    down_on_grpc = SimpleNamespace(state=State.UNREACHABLE, on_framed=False)
    for replicas, want in (([framed], True), ([framed, grpc_], False), ([framed, down_on_grpc], True),
                           ([down_on_grpc], False), ([], False)):
        pool.replicas = replicas
        assert pool.all_framed() is want, replicas
