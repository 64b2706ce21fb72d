"""The event loop's own launch (tulip.worker.Worker.launch_here): a lone request whose batch replays a captured
graph is stepped on the loop, everything else goes to the launcher thread, and the answers are the same."""

import random
import threading

import numpy as np
from tulip_testkit import FakeEngine, ServerThread, decode_response, encode_request, make_config, solo_embedding, wait_until

from rose.batch import Batch
from tulip.queue_types import INTERACTIVE, QueuedSequence, Ticket
from tulip.scheduler import SequenceQueue

LOOP = "test-tulip-loop"  # ServerThread's event-loop thread
LAUNCHER = "tulip-launcher"


def _ask(s: ServerThread, seqs) -> np.ndarray:
    request = encode_request(seqs)
    rows = decode_response(s.stub.Embed(request, timeout=20))
    np.testing.assert_allclose(rows, solo_embedding(request), rtol=1e-6, atol=1e-6)
    return rows


def test_a_lone_request_whose_graph_is_captured_is_launched_on_the_event_loop() -> None:
    engine = FakeEngine(replays_when=lambda batch: True)
    with ServerThread(make_config(), engine) as s:
        for i in range(3):  # one at a time: the worker is idle at each arrival
            _ask(s, [[7 + i] * 20, [9] * 5])
        assert engine.step_threads == [LOOP] * 3
        assert s.server.worker.inline_launches == 3
        assert s.server.metrics.registry.get_sample_value("tulip_inline_launches_total") == 3.0


def test_a_batch_that_would_run_eagerly_or_capture_goes_to_the_launcher() -> None:
    def check(batch: Batch) -> bool:
        if batch.num_tokens == 13:
            raise RuntimeError("replays() failed")  # the launcher runs it all the same
        return batch.num_tokens == 20

    engine = FakeEngine(replays_when=check)
    with ServerThread(make_config(), engine) as s:
        _ask(s, [[5] * 20])  # replays: on the loop
        _ask(s, [[6] * 30])  # no graph: handed to the launcher as taken
        _ask(s, [[8] * 13])  # the check raised: the launcher
        assert engine.step_threads == [LOOP, LAUNCHER, LAUNCHER]
        assert s.server.worker.inline_launches == 1


def test_while_a_batch_is_in_flight_the_launcher_launches() -> None:
    engine = FakeEngine(replays_when=lambda batch: True, gated=True)
    with ServerThread(make_config(), engine) as s:
        first = s.stub.Embed.future(encode_request([[3] * 10]), timeout=20)
        wait_until(lambda: engine.launched == 1, what="the first batch launched")
        second = s.stub.Embed.future(encode_request([[4] * 10]), timeout=20)
        wait_until(lambda: s.server.queue.depth()[0] == 0 and engine.launched == 2, what="the second launched")
        engine.release(2)
        for fut, token in ((first, 3), (second, 4)):
            rows = decode_response(fut.result())
            np.testing.assert_allclose(rows, solo_embedding(encode_request([[token] * 10])), rtol=1e-6, atol=1e-6)
        assert engine.step_threads == [LOOP, LAUNCHER]


def test_off_by_flag_and_with_idle_capture() -> None:
    for config in (make_config(inline_launch=False), make_config(idle_capture_ms=5.0)):
        engine = FakeEngine(replays_when=lambda batch: True)
        with ServerThread(config, engine) as s:
            assert not s.server.worker.inline
            _ask(s, [[11] * 12])
            assert engine.step_threads == [LAUNCHER]


def test_many_concurrent_requests_mixing_both_paths_each_equal_their_solo_embedding() -> None:
    engine = FakeEngine(replays_when=lambda batch: batch.num_tokens % 2 == 0)
    rng = random.Random(11)
    requests = [encode_request([[rng.randrange(1000) for _ in range(rng.choice([1, 4, 17, 40, 90]))]
                                for _ in range(rng.randint(1, 3))], request_id=f"r{i}") for i in range(300)]
    with ServerThread(make_config(max_batch_tokens=96, max_batch_seqs=8), engine) as s:
        futures = []
        for i, r in enumerate(requests):
            futures.append(s.stub.Embed.future(r, timeout=60))
            if i % 7 == 0:  # pauses let the worker go idle, so some batches launch on the loop
                futures[-1].result()
        for req, fut in zip(requests, futures):
            np.testing.assert_allclose(decode_response(fut.result()), solo_embedding(req), rtol=1e-6, atol=1e-6)
        assert LOOP in engine.step_threads and LAUNCHER in engine.step_threads


def _push(queue: SequenceQueue, length: int, wake: bool) -> Ticket:
    ticket = Ticket(None, lane=INTERACTIVE)
    seq = QueuedSequence(ticket=ticket, tokens=np.arange(length, dtype=np.int32),
                         spans=np.array([[0, length]], dtype=np.int32), rows=np.array([0]))
    queue.push(ticket, [seq], wake=wake)
    return ticket


def test_take_parked_takes_only_from_a_parked_launcher_and_hand_over_comes_first() -> None:
    queue = SequenceQueue(max_batch_tokens=64, max_batch_seqs=8, max_queue_tokens=1024)
    _push(queue, 5, wake=False)
    assert queue.take_parked() is None  # nobody parked: it woke (nobody) and left the work queued
    assert queue.depth() == (1, 5)
    got = []
    launcher = threading.Thread(target=lambda: got.append(queue.next_batch(timeout=10)))
    launcher.start()
    launcher.join(10)
    assert got[0].tokens == 5  # the queued work was there: taken without parking
    got.clear()
    launcher = threading.Thread(target=lambda: got.append(queue.next_batch(timeout=10)))
    launcher.start()
    wait_until(lambda: queue._parked, what="the launcher parked")
    _push(queue, 7, wake=False)
    taken = queue.take_parked()
    assert taken is not None and taken.tokens == 7 and queue.depth() == (0, 0)
    assert launcher.is_alive()  # not woken: it still waits for work
    queue.hand_over(taken)  # e.g. the batch has no graph yet: the launcher runs it as taken
    launcher.join(10)
    assert got == [taken]


def test_what_take_parked_leaves_behind_wakes_the_launcher() -> None:
    """A request larger than one batch: the loop takes its first batch, the parked launcher is woken for
    the rest (before this, the rest waited for the next push: a request was stranded)."""
    queue = SequenceQueue(max_batch_tokens=16, max_batch_seqs=8, max_queue_tokens=1024)
    got = []
    launcher = threading.Thread(target=lambda: got.append(queue.next_batch(timeout=10)))
    launcher.start()
    wait_until(lambda: queue._parked, what="the launcher parked")
    ticket = Ticket(None, lane=INTERACTIVE)
    seqs = [QueuedSequence(ticket=ticket, tokens=np.arange(12, dtype=np.int32), spans=np.array([[0, 12]], dtype=np.int32),
                           rows=np.array([i])) for i in range(2)]
    queue.push(ticket, seqs, wake=False)
    taken = queue.take_parked()
    assert taken is not None and taken.tokens == 12
    launcher.join(5)
    assert not launcher.is_alive() and got[0].tokens == 12  # woken, it took the second sequence


def test_after_a_batch_of_several_requests_the_launcher_gathers_the_next_arrivals() -> None:
    """Concurrent traffic (the last batch carried several requests) goes through the launcher, whose wake-up
    gathers what arrives together; back to sequential traffic, the loop launches again."""
    engine = FakeEngine(replays_when=lambda batch: True, gated=True)
    with ServerThread(make_config(), engine) as s:
        first = s.stub.Embed.future(encode_request([[3] * 10]), timeout=20)
        wait_until(lambda: engine.launched == 1, what="the first batch launched")
        second = s.stub.Embed.future(encode_request([[4] * 10]), timeout=20)
        wait_until(lambda: engine.launched == 2, what="the second batch launched")
        more = [s.stub.Embed.future(encode_request([[5 + i] * 10]), timeout=20) for i in range(2)]
        wait_until(lambda: s.server.queue.depth()[0] == 2, what="two requests queued behind the device")
        engine.release(2)
        wait_until(lambda: engine.launched == 3, what="the two queued requests launched together")
        engine.release(1)
        for fut in (first, second, *more):
            fut.result()
        assert engine.batches[2].num_seqs == 2
        after = [s.stub.Embed.future(encode_request([[9] * 10]), timeout=20) for _ in range(1)]
        engine.release(1)
        after[0].result()
        last = s.stub.Embed.future(encode_request([[10] * 10]), timeout=20)
        engine.release(1)
        last.result()
        assert engine.step_threads == [LOOP, LAUNCHER, LAUNCHER, LAUNCHER, LOOP]


def test_with_an_express_lane_a_query_beside_bulk_goes_express_and_alone_launches_on_the_loop() -> None:
    from test_tulip_lanes import lane_request

    from tulip.scheduler import BULK

    engine = FakeEngine(gated=True, express=True, replays_when=lambda batch: True)
    config = make_config(max_batch_tokens=64, express_batch_tokens=32, pack_ahead_ms=0)
    with ServerThread(config, engine) as s:
        wait_until(lambda: s.server.queue.express_tokens == 32, what="express on")
        bulk = s.stub.Embed.future(lane_request(100, 60, BULK), timeout=60)  # alone: on the loop
        wait_until(lambda: engine.launched == 1, what="bulk launched and held")
        query = s.stub.Embed(lane_request(7, 12, INTERACTIVE), timeout=10)  # beside bulk: the express lane
        assert query.rows == 1 and [int(b.token_ids[0]) for b in engine.express_batches] == [7]
        engine.release(10)
        bulk.result()
        wait_until(lambda: s.server.worker.inflight == 0 and s.server.queue._bulk_inflight == 0, what="bulk done")
        alone = s.stub.Embed.future(lane_request(8, 12, INTERACTIVE), timeout=10)
        wait_until(lambda: engine.launched == 3, what="the query alone launched")
        engine.release(1)
        assert alone.result().rows == 1
        assert engine.step_threads == [LOOP, "tulip-express-launcher", LOOP]
