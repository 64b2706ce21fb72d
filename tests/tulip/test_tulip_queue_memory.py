"""The queue's memory and the per-request share under a capped batch (tulip/scheduler.py, tulip/packer.py).

A cancelled or expired request's queued sequences leave the lanes when it is dropped, not when the packer next
walks past them: while the device holds both in-flight batches the packer does not run, and the tokens a cancel
frees admit more work, so the lanes grew without bound (749 996 sequences held at a reported depth of (0, 0)).
And no request takes a whole batch while others wait, also when interactive_batch_tokens or express caps it."""

import grpc
import numpy as np

from test_tulip_server import _hold_two_batches
from test_tulip_stream import Stream
from tulip.scheduler import BULK, INTERACTIVE, QueuedSequence, SequenceQueue, Ticket
from tulip_testkit import FakeEngine, ServerThread, encode_request, make_config, marked_sequence, wait_until


def push(q: SequenceQueue, *lengths: int, marker: int = 0, flow: str = "", lane: int = INTERACTIVE,
         deadline=None) -> Ticket:
    t = Ticket(deadline, flow=flow, lane=lane)
    q.push(t, [QueuedSequence(ticket=t, tokens=np.full(n, marker + i, np.int32), spans=np.array([[0, n]], np.int32),
                              rows=np.array([0])) for i, n in enumerate(lengths)])
    return t


def markers(packed) -> list[int]:
    return [int(s.tokens[0]) for s in packed.sequences]


def held(q: SequenceQueue) -> int:
    """Sequences the lanes still hold, live or not."""
    return sum(len(flow) for lane in q._lanes for flow in lane.values())


def test_cancelled_requests_leave_the_lanes_at_once_and_are_reported_with_the_next_batch() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1_000)
    push(q, 10, marker=1)
    for i in range(200):  # the device is busy: no batch is taken meanwhile
        q.cancel(push(q, *[5] * 150, marker=100))
    assert q.depth() == (1, 10)
    assert held(q) == 1 and len(q._lanes[INTERACTIVE]) == 1, "a cancelled request's flow is gone, not parked"
    packed = q.next_batch(timeout=0)
    assert markers(packed) == [1] and packed.skipped == 200 * 150  # tulip_skipped_sequences_total as before


def test_a_flow_shared_with_live_requests_is_compacted_in_order() -> None:
    q = SequenceQueue(max_batch_tokens=1_000, max_batch_seqs=100, max_queue_tokens=10_000, share=1.0)
    chunks = [push(q, 10, 10, marker=10 * i, flow="ivy-1") for i in range(8)]  # one HTTP request's chunks
    push(q, 10, marker=500)
    for t in chunks[:6]:
        q.cancel(t)
        assert held(q) <= 2 * q.depth()[0], "dead sequences never outnumber the live ones of a flow"
    assert q.depth() == (5, 50)
    packed = q.next_batch(timeout=0)
    assert markers(packed) == [60, 61, 70, 71, 500], "the live chunks keep their order and their flow's place"
    assert packed.skipped + held(q) == 12 and held(q) == 0
    for t in chunks[6:]:
        q.cancel(t)  # already taken: nothing to drop
    assert q.depth() == (0, 0)


def test_an_expired_request_in_a_shared_flow_is_dropped_whole_by_the_packer() -> None:
    now = [100.0]
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1_000, clock=lambda: now[0])
    late = push(q, 10, 10, 10, marker=1, flow="f", deadline=101.0)
    live = push(q, 10, 10, marker=20, flow="f")
    now[0] = 102.0
    packed = q.next_batch(timeout=0)
    assert markers(packed) == [20, 21] and packed.expired == [late] and packed.skipped == 3
    assert late.cancelled and not live.cancelled and q.depth() == (0, 0) and held(q) == 0


def test_cancels_and_deadlines_while_the_device_holds_both_batches_free_the_lanes() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(framed_port=0, watchdog_s=0, max_queue_tokens=4_096), engine) as s:
        blockers = _hold_two_batches(s, engine)
        stream = Stream(s.stub)
        big = encode_request([marked_sequence(7, 16)] * 200)  # 3 200 tokens: one fits the queue at a time
        for i in range(1, 41):
            stream.send(i, big)
            stream.send(i, cancel=True)
        for i in range(41, 46):
            stream.send(i, encode_request([marked_sequence(8, 16)] * 20), timeout_s=0.05)
        stream.send(99, encode_request([marked_sequence(9, 4)]))
        assert stream.answer(45).code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        wait_until(lambda: s.server.queue.depth() == (1, 4), what="only request 99 left")
        assert held(s.server.queue) == 1, "the queue holds only the live request's sequence"
        engine.release(100)
        assert stream.answer(99).HasField("response")
        for f in blockers:
            f.result()
        stream.close()


def test_with_interactive_batch_tokens_a_small_request_rides_in_the_first_capped_batch() -> None:
    q = SequenceQueue(max_batch_tokens=2048, max_batch_seqs=64, max_queue_tokens=100_000, interactive_batch_tokens=256)
    push(q, *[64] * 24, marker=100)  # 1 536 tokens, six capped batches
    push(q, 8, marker=900)
    first = q.next_batch(timeout=0)
    assert first.tokens <= 256 and 900 in markers(first), "its share is 1/8 of the 256-token cap, not of 2048"
    assert markers(first) == [100, 900, 101, 102]  # the big one still fills the rest


def test_express_batches_share_their_own_cap() -> None:
    q = SequenceQueue(max_batch_tokens=2048, max_batch_seqs=64, max_queue_tokens=100_000)
    q.express_tokens = 256
    push(q, 10, lane=BULK, marker=500)  # bulk about: express time
    push(q, *[64] * 24, marker=100)
    push(q, 8, marker=900)
    first = q.next_express(timeout=0)
    assert markers(first) == [100, 900, 101, 102]
