"""Batches that wait for company (TULIP_GATHER_MS, tulip/gather.py): while answered requests are expected back,
the launcher waits for them, never longer than the window past the oldest waiting one's arrival; a lone client
and a full batch never wait."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from tulip_testkit import (
    FakeEngine,
    ServerThread,
    decode_response,
    encode_request,
    make_config,
    solo_embedding,
    wait_until,
)

from tulip.gather import Gather
from tulip.queue_types import QueuedSequence, Ticket
from tulip.scheduler import SequenceQueue

LOOP = "test-tulip-loop"  # ServerThread's event-loop thread


def test_answered_requests_are_expected_back_until_an_arrival_meets_them() -> None:
    g = Gather(window_s=0.002)
    assert g.return_s == 0.004
    assert g.wait_s(oldest_arrival=10.0, now=10.0) == 0.0, "nothing expected: take at once"
    g.delivered(1, now=10.0)
    g.arrived()  # a lone client's next request meets its own expectation
    assert g.wait_s(oldest_arrival=10.001, now=10.001) == 0.0
    g.delivered(3, now=10.002)
    g.arrived()
    assert g.expected(10.003) == 2
    assert g.wait_s(oldest_arrival=10.003, now=10.0035) == pytest.approx(0.0015), "waits for the other two"
    assert g.wait_s(oldest_arrival=10.001, now=10.0035) == 0.0, "not past the window of the oldest waiting"
    g.arrived()
    g.arrived()
    assert g.wait_s(oldest_arrival=10.003, now=10.0035) == 0.0, "all back"
    g.arrived()  # an arrival nobody expected meets nothing
    assert g.expected(10.0035) == 0
    g.delivered(2, now=20.0)
    assert g.expected(20.004) == 2 and g.expected(20.0041) == 0, "a client away longer than return_s is not waited for"
    with pytest.raises(ValueError, match="window_s"):
        Gather(window_s=0)


def _push(queue: SequenceQueue, marker: int, tokens: int = 8) -> None:
    seq = QueuedSequence(Ticket(), np.full(tokens, marker, np.int32), np.array([[0, tokens]], np.int32),
                         np.array([0]))
    queue.push(seq.ticket, [seq])


def _take_in_thread(queue: SequenceQueue, out: list) -> threading.Thread:
    def take() -> None:
        t0 = time.monotonic()
        packed = queue.next_batch()
        out.append((packed, time.monotonic() - t0))

    t = threading.Thread(target=take, daemon=True)
    t.start()
    return t


def test_a_take_waits_for_the_expected_requests_and_leaves_when_they_are_in() -> None:
    queue = SequenceQueue(max_batch_tokens=1000, max_batch_seqs=16, max_queue_tokens=10_000)
    queue.gather = Gather(window_s=30.0)  # far longer than the test: only the arrivals can end this wait
    queue.delivered(3)
    out: list = []
    _push(queue, 1)
    taking = _take_in_thread(queue, out)
    time.sleep(0.05)
    assert not out and queue.expects_company(), "two of the three answered are still expected"
    _push(queue, 2)
    _push(queue, 3)
    taking.join(10)
    packed = out[0][0]
    assert [int(s.tokens[0]) for s in packed.sequences] == [1, 2, 3] and packed.gathered
    assert queue.gather.waits == 1 and not queue.expects_company()


def test_the_window_bounds_the_wait_and_a_full_batch_leaves_at_once() -> None:
    queue = SequenceQueue(max_batch_tokens=1000, max_batch_seqs=2, max_queue_tokens=10_000)
    queue.gather = Gather(window_s=0.05, return_s=60.0)
    queue.delivered(6)
    out: list = []
    _push(queue, 1)
    _take_in_thread(queue, out).join(10)
    packed, waited = out[0]
    assert len(packed.sequences) == 1 and 0.04 <= waited < 5.0, f"waited {waited:.3f} s for company that never came"
    _push(queue, 2)
    _push(queue, 3)  # max_batch_seqs: the batch is full
    _take_in_thread(queue, out).join(10)
    assert len(out[1][0].sequences) == 2 and out[1][1] < 0.04, "a full batch does not wait"


def _ask(s: ServerThread, marker: int) -> None:
    request = encode_request([[marker] * 12])
    np.testing.assert_allclose(decode_response(s.stub.Embed(request, timeout=20)), solo_embedding(request),
                               rtol=1e-6, atol=1e-6)


def test_a_lone_client_never_waits_and_keeps_the_inline_launch() -> None:
    engine = FakeEngine(replays_when=lambda batch: True)
    with ServerThread(make_config(gather_ms=500), engine) as s:
        t0 = time.monotonic()
        for i in range(5):
            _ask(s, 10 + i)
        assert time.monotonic() - t0 < 2.5, "five sequential requests must not each wait the 500 ms window"
        assert s.server.queue.gather.waits == 0 and engine.step_threads == [LOOP] * 5


def test_requests_of_concurrent_clients_share_a_batch_after_company_was_seen() -> None:
    engine = FakeEngine(replays_when=lambda batch: True, gated=True)
    with ServerThread(make_config(gather_ms=2000), engine) as s:
        gather = s.server.queue.gather
        gather.return_s = 60.0  # this VM's gRPC round trips, not the rule, must not expire the expectations
        first = [s.stub.Embed.future(encode_request([[20 + i] * 12]), timeout=20) for i in range(3)]
        wait_until(lambda: sum(b.num_seqs for b in engine.batches) + s.server.queue.depth()[0] == 3,
                   what="all three in")
        engine.release(100)
        for fut in first:
            fut.result()
        wait_until(lambda: gather.expected(time.monotonic()) == 3, what="three answers expected back")
        seen = len(engine.batches)
        later = [threading.Thread(target=_ask, args=(s, 30))]
        later[0].start()
        time.sleep(0.1)
        assert len(engine.batches) == seen, "the lone arrival waits for the two others recently seen"
        later += [threading.Thread(target=_ask, args=(s, 31 + i)) for i in range(2)]
        for t in later[1:]:
            t.start()
        wait_until(lambda: len(engine.batches) > seen, what="the gathered batch launched")
        engine.release(100)
        for t in later:
            t.join(20)
        assert engine.batches[seen].num_seqs == 3, [b.num_seqs for b in engine.batches]
        assert gather.waits >= 1
        assert s.server.metrics.registry.get_sample_value("tulip_gather_waits_total") >= 1


def test_a_negative_window_is_refused() -> None:
    from tulip.config import TulipConfig

    with pytest.raises(ValueError, match="gather_ms"):
        TulipConfig(gather_ms=-1)
