"""Priority lanes (issue 17): interactive first within each batch, bulk's guaranteed share (aging), and
deadline-aware admission. Queue logic is tested pure; admission through a real server on a gated fake engine."""

import grpc
import numpy as np
import pytest

from protos import embed_pb2
from tulip.lanes import check_deadline
from tulip.errors import DeadlineUnmeetable
from tulip.metrics import TulipMetrics
from tulip.pacing import DeviceTimes
from tulip.scheduler import BULK, INTERACTIVE, QueuedSequence, SequenceQueue, Ticket
from test_tulip_stream import Stream
from tulip_testkit import FakeEngine, ServerThread, encode_request, make_config, marked_sequence, wait_until


def push(q: SequenceQueue, lane: int, *lengths: int, marker: int = 0, deadline=None) -> Ticket:
    t = Ticket(deadline, lane=lane)
    q.push(t, [QueuedSequence(ticket=t, tokens=np.full(n, marker + i, np.int32), spans=np.array([[0, n]], np.int32),
                              rows=np.array([0])) for i, n in enumerate(lengths)])
    return t


def markers(packed) -> list[int]:
    return [int(s.tokens[0]) for s in packed.sequences]


def test_interactive_fills_the_batch_first_and_order_holds_within_a_lane() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=10_000, share=1.0, bulk_share=0.0)
    push(q, BULK, 40, 40, marker=100)  # bulk arrived first
    push(q, INTERACTIVE, 30, 30, marker=1)
    push(q, INTERACTIVE, 30, marker=3)
    first = q.next_batch(timeout=0)
    assert markers(first) == [1, 2, 3]  # interactive first, in arrival order; 40 of bulk does not fit in 10
    assert first.lane_tokens == [90, 0]
    second = q.next_batch(timeout=0)  # bulk got nothing while it waited: aging puts it first now
    assert markers(second) == [100, 101] and second.lane_tokens == [0, 80]
    assert q.lane_tokens(BULK) == q.lane_tokens(INTERACTIVE) == 0


def test_bulk_gets_its_share_of_every_batch_while_both_wait() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=100, max_queue_tokens=100_000, share=1.0, bulk_share=0.25)
    push(q, BULK, *[5] * 100, marker=500)
    push(q, INTERACTIVE, *[5] * 100, marker=1)
    for _ in range(5):
        packed = q.next_batch(timeout=0)
        assert packed.tokens == 100 and packed.lane_tokens == [75, 25]
    assert q.lane_tokens(INTERACTIVE) == 500 - 5 * 75 and q.lane_tokens(BULK) == 500 - 5 * 25


def test_bulk_alone_takes_the_whole_batch_and_interactive_takes_what_bulk_leaves() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=100, max_queue_tokens=10_000, share=1.0, bulk_share=0.25)
    push(q, BULK, *[10] * 20, marker=100)
    assert q.next_batch(timeout=0).lane_tokens == [0, 100]
    q2 = SequenceQueue(max_batch_tokens=100, max_batch_seqs=100, max_queue_tokens=10_000, share=1.0, bulk_share=0.25)
    push(q2, BULK, 10, marker=100)
    push(q2, INTERACTIVE, *[10] * 20, marker=1)
    assert q2.next_batch(timeout=0).lane_tokens == [90, 10]  # bulk needed less than its share


def test_an_interactive_giant_cannot_starve_bulk_nor_bulk_interactive() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=100, max_queue_tokens=10_000, share=1.0, bulk_share=0.25)
    push(q, BULK, 90, 90, marker=100)
    push(q, INTERACTIVE, 95, 95, 95, marker=1)
    lanes = [tuple(q.next_batch(timeout=0).lane_tokens) for _ in range(5)]
    assert lanes == [(95, 0), (0, 90), (95, 0), (0, 90), (95, 0)]


def test_cancel_discounts_the_lane() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    t = push(q, BULK, 30, 20)
    push(q, INTERACTIVE, 7)
    q.cancel(t)
    assert q.lane_tokens(BULK) == 0 and q.lane_tokens(INTERACTIVE) == 7


def test_seconds_per_token_is_the_fastest_rate_and_admission_uses_it() -> None:
    times = DeviceTimes()
    assert times.seconds_per_token() is None
    check_deadline(INTERACTIVE, 10**9, 10, 0.001, times.pace())  # no measurement: admit
    times.observe(100, 1.0)  # 10 ms/token
    times.observe(1000, 1.0)  # 1 ms/token: the fastest, used
    assert times.seconds_per_token() == pytest.approx(0.001)
    check_deadline(BULK, 900, 100, 1.01, times.pace())
    with pytest.raises(DeadlineUnmeetable) as err:
        check_deadline(BULK, 900, 100, 0.99, times.pace())
    assert err.value.reason == "deadline_unmeetable" and err.value.status == "RESOURCE_EXHAUSTED"
    assert err.value.retry_after_s == pytest.approx(0.9)  # the 900 tokens ahead, not this request's own
    assert "bulk lane" in err.value.message


def test_lane_metrics() -> None:
    m = TulipMetrics()
    m.bind_state(queue_depth=lambda: (0, 0), inflight=lambda: 0, ready=lambda: True, engine_stats=None,
                 lane_depth=lambda lane: 7 if lane == BULK else 3)
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=100, max_queue_tokens=10_000)
    push(q, BULK, 10)
    push(q, INTERACTIVE, 20)
    packed = q.next_batch(timeout=0)
    batch = type("B", (), {"num_seqs": 2, "num_tokens": 30})()
    m.observe_launch(packed, batch, 0.001, None)
    get = m.registry.get_sample_value
    assert get("tulip_lane_queue_tokens", {"lane": "bulk"}) == 7
    assert get("tulip_lane_queue_tokens", {"lane": "interactive"}) == 3
    assert get("tulip_lane_batches_total", {"lane": "bulk"}) == 1
    assert get("tulip_lane_batch_tokens_total", {"lane": "interactive"}) == 20
    assert get("tulip_lane_wait_seconds_count", {"lane": "bulk"}) == 1


def lane_request(marker: int, n: int, lane: int) -> embed_pb2.EmbedRequest:
    req = encode_request([marked_sequence(marker, n)])
    req.lane = lane
    return req


def test_server_refuses_an_unmeetable_deadline_at_once_and_admits_without_a_measurement() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(max_batch_tokens=32), engine) as s:
        held = []
        for i in range(2):
            held.append(s.stub.Embed.future(lane_request(900 + i, 8, INTERACTIVE), timeout=60))
            wait_until(lambda n=i + 1: engine.launched == n, what=f"batch {i + 1} launched")
        wait_until(lambda: s.server.worker.inflight == 2, what="two batches in flight")
        queued = [s.stub.Embed.future(lane_request(10 + i, 30, BULK), timeout=60) for i in range(3)]
        wait_until(lambda: s.server.queue.lane_tokens(BULK) == 90, what="bulk queued")
        # No device time measured yet: a tight deadline is admitted (it may still expire in the queue).
        tight = s.stub.Embed.future(lane_request(20, 10, BULK), timeout=5)
        wait_until(lambda: s.server.queue.lane_tokens(BULK) == 100)
        # 50 ms per token: 100 queued bulk tokens = 5 s, against deadlines of 3 s (seconds of room for a stall of
        # the loaded host before Tulip reads them; at 0.5 s a stall made them DEADLINE_EXCEEDED)
        s.server.worker.device_times.observe(32, 1.6)
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(lane_request(21, 10, BULK), timeout=3)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("tulip-reason", "deadline_unmeetable") in err.value.trailing_metadata()
        assert ("tulip-retry-after-s", "5.000") in err.value.trailing_metadata()  # the wait ahead: 100 x 50 ms
        assert "bulk lane" in err.value.details()
        stream = Stream(s.stub)  # the stream carries the same refusal and estimate in its answer
        stream.send(1, lane_request(23, 10, BULK), timeout_s=3)
        answer = stream.answer(1)
        assert answer.reason == "deadline_unmeetable" and answer.retry_after_s == pytest.approx(5.0)
        assert answer.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        stream.close()
        # The interactive lane is empty: the same deadline is met there.
        ok = s.stub.Embed.future(lane_request(22, 10, INTERACTIVE), timeout=30)
        wait_until(lambda: s.server.queue.lane_tokens(INTERACTIVE) == 10)
        engine.release(100)
        assert ok.result().rows == 1 and tight.result().rows == 1
        assert all(f.result().rows == 1 for f in held + queued)
    seen = [int(x[0]) for x in engine.seen_sequences()]
    assert 21 not in seen and 23 not in seen and seen.index(22) < seen.index(10)  # interactive went ahead of queued bulk


def test_unknown_lane_is_invalid() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(lane_request(1, 4, 7), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "lane" in err.value.details()


def test_lanes_off_serves_bulk_in_arrival_order_with_interactive() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(max_batch_tokens=32, lanes=False, request_share=1.0), engine) as s:
        held = []
        for i in range(2):
            held.append(s.stub.Embed.future(lane_request(900 + i, 8, INTERACTIVE), timeout=60))
            wait_until(lambda n=i + 1: engine.launched == n, what=f"batch {i + 1} launched")
        bulk = s.stub.Embed.future(lane_request(10, 30, BULK), timeout=60)
        wait_until(lambda: s.server.queue.depth()[1] == 30, what="bulk queued")
        interactive = s.stub.Embed.future(lane_request(22, 10, INTERACTIVE), timeout=60)
        wait_until(lambda: s.server.queue.depth()[1] == 40, what="interactive queued")
        assert s.server.queue.lane_tokens(BULK) == 0  # one lane: bulk counted with interactive
        engine.release(100)
        assert bulk.result().rows == interactive.result().rows == 1 and all(f.result().rows == 1 for f in held)
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(lane_request(1, 4, 7), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # the lane is still checked
    seen = [int(x[0]) for x in engine.seen_sequences()]
    assert seen.index(10) < seen.index(22)  # arrival order: the bulk request first (lanes on: the reverse)


def test_interactive_batch_cap_shortens_every_batch_while_interactive_traffic_is_about() -> None:
    now = [0.0]
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=100, max_queue_tokens=100_000, share=1.0,
                      bulk_share=0.25, interactive_batch_tokens=40, interactive_recent_s=0.5, clock=lambda: now[0])
    push(q, BULK, *[10] * 50, marker=500)
    assert q.next_batch(timeout=0).tokens == 100, "no interactive request yet: the full budget"
    push(q, INTERACTIVE, 5, marker=1)
    packed = q.next_batch(timeout=0)
    assert markers(packed)[0] == 1 and packed.tokens <= 40 and packed.lane_tokens == [5, 30]
    now[0] = 0.3  # the interactive request is served, but one arrived 0.3 s ago: still capped
    assert q.next_batch(timeout=0).tokens == 40
    now[0] = 0.6  # none for 0.6 s: bulk gets full batches again
    assert q.next_batch(timeout=0).tokens == 100


def test_interactive_batch_cap_off_by_default_keeps_full_batches() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=100, max_queue_tokens=100_000, share=1.0, bulk_share=0.25)
    push(q, BULK, *[10] * 50, marker=500)
    push(q, INTERACTIVE, 5, marker=1)
    packed = q.next_batch(timeout=0)
    assert packed.tokens == 95 and packed.lane_tokens == [5, 90]
