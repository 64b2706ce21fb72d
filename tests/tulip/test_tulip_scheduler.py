"""The FCFS token-budget packer as pure logic: order, budgets, over-long sequences, drops, admission."""

import threading

import numpy as np
import pytest

from tulip.errors import QueueClosed, QueueFull
from tulip.scheduler import QueuedSequence, SequenceQueue, Ticket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def seq(ticket: Ticket, n: int, marker: int = 0) -> QueuedSequence:
    tokens = np.full(n, marker, dtype=np.int32)
    return QueuedSequence(ticket=ticket, tokens=tokens, spans=np.array([[0, n]], np.int32), rows=np.array([0]))


def push(q: SequenceQueue, *lengths: int, deadline=None, first_marker: int = 0) -> Ticket:
    t = Ticket(deadline)
    q.push(t, [seq(t, n, first_marker + i) for i, n in enumerate(lengths)])
    return t


def markers(packed) -> list[int]:
    return [int(s.tokens[0]) for s in packed.sequences]


def test_takes_from_head_while_tokens_fit_and_keeps_order() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    push(q, 40, 30, 20, 50, 10, first_marker=1)
    first = q.next_batch(timeout=0)
    assert markers(first) == [1, 2, 3] and first.tokens == 90
    # 50 does not fit beside 90; the 10 behind it must not jump the queue.
    second = q.next_batch(timeout=0)
    assert markers(second) == [4, 5] and second.tokens == 60
    assert q.next_batch(timeout=0) is None


def test_no_skipping_ahead_to_a_smaller_sequence() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    push(q, 90, 20, 5, first_marker=1)
    assert markers(q.next_batch(timeout=0)) == [1]  # 5 would fit beside 90, but 20 is ahead of it
    assert markers(q.next_batch(timeout=0)) == [2, 3]


def test_sequence_cap() -> None:
    q = SequenceQueue(max_batch_tokens=1000, max_batch_seqs=3, max_queue_tokens=10000)
    push(q, *[1] * 7, first_marker=1)
    assert [len(q.next_batch(timeout=0).sequences) for _ in range(3)] == [3, 3, 1]


def test_sequence_longer_than_budget_runs_alone() -> None:
    q = SequenceQueue(max_batch_tokens=64, max_batch_seqs=8, max_queue_tokens=1000)
    push(q, 10, 500, 10, first_marker=1)
    assert markers(q.next_batch(timeout=0)) == [1]
    alone = q.next_batch(timeout=0)
    assert markers(alone) == [2] and alone.tokens == 500
    assert markers(q.next_batch(timeout=0)) == [3]


def test_exact_budget_fill() -> None:
    q = SequenceQueue(max_batch_tokens=64, max_batch_seqs=8, max_queue_tokens=1000)
    push(q, 32, 32, 1, first_marker=1)
    assert markers(q.next_batch(timeout=0)) == [1, 2]


def test_cancelled_sequences_are_skipped_and_free_space_at_once() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=110)
    a = push(q, 30, first_marker=1)
    b = push(q, 30, 30, first_marker=10)
    c = push(q, 20, first_marker=20)
    assert q.depth() == (4, 110)
    q.cancel(b)
    assert q.depth() == (2, 50)
    push(q, 50, first_marker=30)  # fits only because b's 60 tokens were released
    packed = q.next_batch(timeout=0)
    assert markers(packed) == [1, 20, 30] and packed.skipped == 2
    assert not a.cancelled and not c.cancelled and q.depth() == (0, 0)


def test_expired_requests_are_dropped_before_batching_and_reported_once() -> None:
    clock = Clock()
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000, clock=clock)
    live = push(q, 10, first_marker=1)
    late = push(q, 10, 10, 10, deadline=clock.now + 1, first_marker=10)
    push(q, 10, deadline=clock.now + 100, first_marker=20)
    clock.now += 5
    packed = q.next_batch(timeout=0)
    assert markers(packed) == [1, 20]
    assert packed.expired == [late] and late.expired and late.cancelled and not live.cancelled
    assert packed.skipped == 3 and q.depth() == (0, 0)


def test_queue_bound_in_tokens_rejects_whole_request() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=100)
    push(q, 60)
    with pytest.raises(QueueFull, match="max_queue_tokens 100"):
        push(q, 30, 30)
    assert q.depth() == (1, 60)  # nothing of the rejected request was admitted
    with pytest.raises(QueueFull, match="holds at most 100"):
        push(q, 101)
    push(q, 40)
    assert q.depth() == (2, 100)


def test_drop_waiting_takes_a_workers_requests_and_leaves_the_others() -> None:
    """Once the device is lost (tulip.worker's _fail_waiting): every request the worker answers, its own and the
    unowned ones, leaves the queue unpacked; a request the other worker owns stays for it."""
    from tulip.scheduler import EXPRESS, MAIN

    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    unowned, mine, theirs = push(q, 40, 30), push(q, 20), push(q, 10)
    mine.owner, theirs.owner = MAIN, EXPRESS
    dropped = q.drop_waiting(MAIN)
    assert set(map(id, dropped)) == {id(unowned), id(mine)} and len(dropped) == 2
    assert all(t.cancelled and t.owner == MAIN for t in dropped) and not theirs.cancelled
    assert q.depth() == (1, 10) and q.drop_waiting(MAIN) == []
    assert q.drop_waiting(EXPRESS) == [theirs] and q.depth() == (0, 0)


def test_close_drains_then_ends_and_refuses_new_work() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    push(q, 10, first_marker=1)
    q.close()
    with pytest.raises(QueueClosed):
        push(q, 10)
    assert markers(q.next_batch()) == [1]
    assert q.next_batch() is None  # closed and empty: does not block


def test_next_batch_blocks_until_work_arrives() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    got = []
    consumer = threading.Thread(target=lambda: got.append(q.next_batch(timeout=30)))
    consumer.start()
    push(q, 7, first_marker=3)
    consumer.join(30)
    assert markers(got[0]) == [3]
    assert q.next_batch(timeout=0.01) is None  # times out empty


# -- interleaving (RELIABILITY 30): requests in arrival order, none may take a whole batch while others wait --

def push_flow(q: SequenceQueue, lengths, first_marker: int, flow: str = "") -> Ticket:
    t = Ticket(flow=flow)
    q.push(t, [seq(t, n, first_marker + i) for i, n in enumerate(lengths)])
    return t


def test_a_small_request_behind_a_huge_one_rides_in_the_next_batch_which_stays_full() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=50, max_queue_tokens=10_000, share=0.25)
    push_flow(q, [10] * 40, first_marker=100)  # the huge request: 40 batches' worth of 10-token sequences
    push_flow(q, [1], first_marker=1)
    first = q.next_batch(timeout=0)
    # its share (25 tokens: two sequences), the small one, then the huge one fills the room left, in order
    assert markers(first) == [100, 101, 1, 102, 103, 104, 105, 106, 107, 108] and first.tokens == 91
    assert markers(q.next_batch(timeout=0)) == list(range(109, 119))


def test_requests_keep_arrival_order_and_each_keeps_its_own() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=50, max_queue_tokens=10_000, share=0.1)
    for first in (10, 20, 30):
        push_flow(q, [10, 10, 10], first_marker=first)
    assert markers(q.next_batch(timeout=0)) == [10, 20, 30, 11, 12, 21, 22, 31, 32]


def test_a_request_that_does_not_fit_waits_but_goes_first_once_it_is_the_oldest() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=50, max_queue_tokens=10_000, share=0.25)
    push_flow(q, [10], first_marker=1)
    push_flow(q, [95], first_marker=2)  # does not fit beside the 10 ahead of it
    push_flow(q, [10] * 5, first_marker=3)
    assert markers(q.next_batch(timeout=0)) == [1, 3, 4, 5, 6, 7]
    push_flow(q, [10], first_marker=20)  # newer: after the 95, never ahead of it
    assert markers(q.next_batch(timeout=0)) == [2]
    assert markers(q.next_batch(timeout=0)) == [20]


def test_tickets_of_one_flow_share_its_place_and_its_share() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=50, max_queue_tokens=10_000, share=0.1)
    push_flow(q, [10, 10], first_marker=1, flow="req-a")  # two chunks of one Ivy request
    push_flow(q, [10], first_marker=10, flow="req-b")
    push_flow(q, [10], first_marker=3, flow="req-a")
    assert markers(q.next_batch(timeout=0)) == [1, 10, 2, 3]


def test_share_one_is_request_fcfs() -> None:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=50, max_queue_tokens=10_000, share=1.0)
    push_flow(q, [10] * 12, first_marker=100)
    push_flow(q, [1], first_marker=1)
    assert markers(q.next_batch(timeout=0)) == list(range(100, 110))
    assert markers(q.next_batch(timeout=0)) == [110, 111, 1]


def test_build_batch_packs_one_sequence_and_several_alike() -> None:
    """A lone sequence takes build_batch's short path (its own arrays); it must give the same Batch as the
    general path gives that sequence beside others, late-chunking spans and token types included."""
    import numpy as np

    from tulip.packing import build_batch
    from tulip.queue_types import QueuedSequence

    def seq(n: int, spans, types=None) -> QueuedSequence:
        return QueuedSequence(ticket=None, tokens=np.arange(100, 100 + n, dtype="<i4"),
                              spans=np.asarray(spans, np.int32), rows=np.arange(len(spans)), types=types)

    chunked = seq(7, [[0, 3], [3, 7]])
    alone, rows = build_batch([chunked])
    assert rows.tolist() == [0]
    assert alone.token_ids.tolist() == list(range(100, 107)) and alone.seq_lens.tolist() == [7]
    assert alone.spans.tolist() == [[0, 3], [3, 7]] and alone.token_types is None
    both, rows = build_batch([seq(2, [[0, 2]]), chunked])
    assert rows.tolist() == [0, 1] and both.seq_lens.tolist() == [2, 7]
    assert both.spans.tolist() == [[0, 2], [2, 5], [5, 9]]
    assert both.token_ids[2:].tolist() == alone.token_ids.tolist()
    typed, _ = build_batch([seq(3, [[0, 3]], types=np.array([0, 1, 1], np.uint8))])  # pairs: the general path
    assert typed.token_types.tolist() == [0, 1, 1] and typed.token_types.dtype == np.int32
