"""RELIABILITY 38, the express worker (tulip/express.py): interactive requests run beside a bulk batch on
the engine's express lane while bulk is busy, and through the main worker otherwise; a request never splits
across the two workers. Queue rules tested pure; the workers through a real server on a gated fake engine whose
express lane is a second, ungated device thread."""

import threading

import grpc
import numpy as np
import pytest

from tulip.scheduler import BULK, EXPRESS, INTERACTIVE, MAIN, QueuedSequence, SequenceQueue, Ticket
from test_tulip_lanes import lane_request, markers, push
from tulip_testkit import FakeEngine, ServerThread, make_config, wait_until


def express_queue(express_tokens: int = 40) -> SequenceQueue:
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=100, max_queue_tokens=100_000, share=1.0, bulk_share=0.25)
    q.express_tokens = express_tokens
    return q


def test_while_bulk_waits_interactive_goes_express_and_main_takes_bulk_only() -> None:
    q = express_queue()
    push(q, BULK, *[10] * 20, marker=500)
    small = push(q, INTERACTIVE, 5, 5, marker=1)
    main = q.next_batch(timeout=0)
    assert main.lane_tokens == [0, 100], "interactive is left for the express worker"
    express = q.next_express(timeout=0)
    assert markers(express) == [1, 2] and express.lane_tokens == [10, 0]
    assert small.owner == EXPRESS


def test_express_batches_are_capped_and_take_interactive_only() -> None:
    q = express_queue(express_tokens=40)
    push(q, BULK, 10, marker=500)
    push(q, INTERACTIVE, *[10] * 6, marker=1)
    first, second = q.next_express(timeout=0), q.next_express(timeout=0)
    assert markers(first) == [1, 2, 3, 4] and first.tokens == 40
    assert markers(second) == [5, 6]
    assert q.lane_tokens(BULK) == 10, "bulk is never taken by the express worker"


def test_without_bulk_about_interactive_stays_with_the_main_worker() -> None:
    q = express_queue()
    push(q, INTERACTIVE, 5, marker=1)
    assert q.next_express(timeout=0) is None
    assert markers(q.next_batch(timeout=0)) == [1]


def test_bulk_on_the_device_is_express_time_until_it_is_done() -> None:
    q = express_queue()
    push(q, BULK, 10, marker=500)
    q.next_batch(timeout=0)  # taken by the main worker: nothing bulk is queued, but it runs from now on
    push(q, INTERACTIVE, 5, marker=1)
    assert q.next_batch(timeout=0) is None
    assert markers(q.next_express(timeout=0)) == [1]
    push(q, INTERACTIVE, 5, marker=2)
    q.bulk_done()
    assert q.next_express(timeout=0) is None
    assert markers(q.next_batch(timeout=0)) == [2]


def test_a_request_stays_with_the_worker_that_took_its_first_sequence() -> None:
    q = express_queue(express_tokens=20)
    push(q, BULK, 10, marker=500)
    started = push(q, INTERACTIVE, 10, 10, 10, marker=1)  # express takes two, one is left
    assert markers(q.next_express(timeout=0)) == [1, 2]
    assert markers(q.next_batch(timeout=0)) == [500]
    q.bulk_done()  # bulk gone: no longer express time
    assert q.next_batch(timeout=0) is None, "the main worker never takes the express worker's request"
    assert markers(q.next_express(timeout=0)) == [3] and started.owner == EXPRESS
    q2 = express_queue()
    mine = push(q2, INTERACTIVE, 60, 60, marker=1)
    assert markers(q2.next_batch(timeout=0)) == [1] and mine.owner == MAIN  # before bulk came
    push(q2, BULK, 10, marker=500)
    assert q2.next_express(timeout=0) is None, "the express worker never takes the main worker's request"
    assert markers(q2.next_batch(timeout=0))[0] == 2


def test_a_request_uncovered_by_the_other_worker_wakes_the_worker_that_takes_it() -> None:
    """Two chunks of one HTTP request (one flow): express owns the first; once bulk is done, the second is the
    main worker's, and the main launcher, waiting because express's chunk was at the head, is woken."""
    q = express_queue(express_tokens=10)
    push(q, BULK, 10, marker=500)
    assert markers(q.next_batch(timeout=0)) == [500]  # bulk on the device
    first = push_flow(q, "req-1", 10, 10, marker=1)
    second = push_flow(q, "req-1", 10, marker=3)
    assert markers(q.next_express(timeout=0)) == [1] and first.owner == EXPRESS
    q.bulk_done()  # express time is over: `second` will be the main worker's
    got = []
    waiting = threading.Thread(target=lambda: got.append(q.next_batch()), daemon=True)  # no timeout: only a wake-up
    waiting.start()
    wait_until(lambda: q._cond._waiters, what="the main launcher waiting")  # express's chunk is at the head
    assert markers(q.next_express(timeout=0)) == [2]
    waiting.join(10)
    stranded = waiting.is_alive()
    q.close()  # frees the thread if it was stranded
    assert not stranded, "the main launcher was never woken for the request it takes"
    assert markers(got[0]) == [3] and second.owner == MAIN


def push_flow(q: SequenceQueue, flow: str, *lengths: int, marker: int = 0) -> Ticket:
    t = Ticket(None, flow=flow, lane=INTERACTIVE)
    q.push(t, [QueuedSequence(ticket=t, tokens=np.full(n, marker + i, np.int32), spans=np.array([[0, n]], np.int32),
                              rows=np.array([0])) for i, n in enumerate(lengths)])
    return t


def test_requests_longer_than_the_express_budget_and_backlogs_go_to_the_main_worker() -> None:
    q = express_queue(express_tokens=40)
    push(q, BULK, 10, marker=500)
    long = push(q, INTERACTIVE, 60, marker=1)
    assert q.next_express(timeout=0) is None, "a 60-token sequence would run eagerly beside bulk"
    packed = q.next_batch(timeout=0)
    assert markers(packed)[0] == 1 and long.owner == MAIN
    q2 = express_queue(express_tokens=10)
    push(q2, BULK, 10, marker=500)
    for i in range(3):  # 30 interactive tokens wait: more than two express batches hold
        push(q2, INTERACTIVE, 10, marker=10 * (i + 1))
    assert markers(q2.next_batch(timeout=0))[0] == 10, "the main worker shares a backlog"


def test_the_express_worker_never_fails_the_main_workers_expired_request() -> None:
    now = [0.0]
    q = SequenceQueue(max_batch_tokens=80, max_batch_seqs=100, max_queue_tokens=100_000, share=1.0,
                      clock=lambda: now[0])
    q.express_tokens = 40
    mine = push(q, INTERACTIVE, 60, 30, marker=1, deadline=1.0)
    assert markers(q.next_batch(timeout=0)) == [1] and mine.owner == MAIN  # its 30 did not fit beside the 60
    push(q, BULK, 10, marker=500)
    now[0] = 2.0
    assert q.next_express(timeout=0) is None
    assert q.next_batch(timeout=0).expired == [mine]


def test_expired_requests_are_failed_by_their_owner_only() -> None:
    now = [0.0]
    q = SequenceQueue(max_batch_tokens=100, max_batch_seqs=100, max_queue_tokens=100_000, share=1.0,
                      clock=lambda: now[0])
    q.express_tokens = 40
    push(q, BULK, 10, marker=500)
    late = push(q, INTERACTIVE, 5, marker=1, deadline=1.0)
    now[0] = 2.0
    assert q.next_batch(timeout=0).expired == []  # not the main worker's to fail while express time
    assert q.next_express(timeout=0).expired == [late]


def test_closing_hands_what_is_left_to_the_main_worker() -> None:
    q = express_queue()
    push(q, BULK, 10, marker=500)
    push(q, INTERACTIVE, 5, marker=1)
    q.close()
    assert markers(q.next_express(timeout=0)) == [1]  # draining: still taken while bulk is queued
    assert q.next_express(timeout=0) is None and q.express_tokens == 0  # nothing left: express is off
    assert markers(q.next_batch(timeout=0)) == [500] and q.next_batch(timeout=0) is None
    q2 = express_queue()
    push(q2, INTERACTIVE, 5, marker=1)  # no bulk about: not express's to take
    q2.close()
    assert q2.next_express(timeout=0) is None and q2.express_tokens == 0
    assert markers(q2.next_batch(timeout=0)) == [1]


def test_a_query_runs_beside_a_held_bulk_batch_on_the_express_lane() -> None:
    engine = FakeEngine(gated=True, express=True)
    config = make_config(max_batch_tokens=64, express_batch_tokens=32, pack_ahead_ms=0)
    with ServerThread(config, engine) as s:
        wait_until(lambda: s.server.queue.express_tokens == 32, what="express on once its lane is prewarmed")
        assert s.server.express is not None
        bulk = s.stub.Embed.future(lane_request(100, 60, BULK), timeout=60)
        wait_until(lambda: engine.launched == 1, what="the bulk batch launched (held on the device)")
        query = s.stub.Embed(lane_request(7, 12, INTERACTIVE), timeout=10)  # answered while bulk is held
        assert query.rows == 1 and not bulk.done()
        assert [int(b.token_ids[0]) for b in engine.express_batches] == [7]
        assert s.server.metrics.express_batches._value.get() == 1
        engine.release(10)
        assert bulk.result().rows == 1
        wait_until(lambda: s.server.queue._bulk_inflight == 0, what="bulk accounted as done")
        wait_until(lambda: s.server.worker.inflight == 0, what="bulk delivered")
        alone = s.stub.Embed.future(lane_request(8, 12, INTERACTIVE), timeout=10)
        wait_until(lambda: engine.launched == 3, what="the query alone launched")
        engine.release(1)  # no bulk about: the main worker (gated) ran it
        assert alone.result().rows == 1 and len(engine.express_batches) == 1


def test_express_rows_equal_the_main_lanes_and_off_means_one_worker() -> None:
    engine = FakeEngine(gated=True, express=True)
    with ServerThread(make_config(max_batch_tokens=64, express_batch_tokens=32), engine) as s:
        wait_until(lambda: s.server.queue.express_tokens == 32, what="express on")
        bulk = s.stub.Embed.future(lane_request(100, 60, BULK), timeout=60)
        wait_until(lambda: engine.launched == 1)
        beside = s.stub.Embed(lane_request(7, 12, INTERACTIVE), timeout=10)
        engine.release(10)
        bulk.result()
        wait_until(lambda: s.server.worker.inflight == 0)
        done = threading.Event()
        alone = s.stub.Embed.future(lane_request(7, 12, INTERACTIVE), timeout=10)
        alone.add_done_callback(lambda _: done.set())
        engine.release(1)
        assert done.wait(10)
        rows = [np.frombuffer(r.embeddings, np.float32) for r in (beside, alone.result())]
        assert np.array_equal(*rows)
    for off in (make_config(express_batch_tokens=0), make_config(lanes=False)):
        with ServerThread(off, FakeEngine(express=True)) as s:
            assert s.server.express is None and s.server.queue.express_tokens == 0
    with ServerThread(make_config(), FakeEngine()) as s:  # an engine without an express lane
        assert s.server.express is None


def test_a_hung_express_batch_trips_the_watchdog() -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def status(s) -> int:
        return health_pb2_grpc.HealthStub(s.channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status

    engine = FakeEngine(gated=True, express=True, express_gated=True)
    # 2 s: the bulk batch is held until the query is on the express lane; a stall of the loaded host longer than
    # the limit there tripped the watchdog on the bulk batch and the query was refused (0.3 s was too tight)
    with ServerThread(make_config(max_batch_tokens=64, express_batch_tokens=32, watchdog_s=2), engine) as s:
        wait_until(lambda: s.server.queue.express_tokens == 32, what="express on")
        bulk = s.stub.Embed.future(lane_request(100, 60, BULK), timeout=60)
        wait_until(lambda: engine.launched == 1)
        query = s.stub.Embed.future(lane_request(7, 12, INTERACTIVE), timeout=60)
        wait_until(lambda: len(engine.express_batches) == 1, what="the query on the express lane")
        engine.release(10)  # the bulk batch completes; the express one stays stuck
        assert bulk.result().rows == 1
        wait_until(lambda: status(s) == health_pb2.HealthCheckResponse.NOT_SERVING, what="watchdog fired")
        engine.release_express(10)
        assert query.result().rows == 1
        wait_until(lambda: status(s) == health_pb2.HealthCheckResponse.SERVING, what="recovered")


class SlowPrewarmEngine(FakeEngine):
    """An express lane whose prewarm waits for `prewarmed` (or raises `fails`)."""

    def __init__(self, fails: BaseException | None = None, **kwargs) -> None:
        super().__init__(express=True, **kwargs)
        self.prewarmed, self.fails = threading.Event(), fails

    def prewarm_express(self) -> list:
        self.prewarmed.wait(30)
        if self.fails is not None:
            raise self.fails
        return []


def test_express_turns_on_after_its_prewarm_and_stays_off_when_it_fails(caplog) -> None:
    engine = SlowPrewarmEngine(gated=True)
    one_slot = make_config(max_batch_tokens=64, express_batch_tokens=32, max_inflight_batches=1)  # the main
    with ServerThread(one_slot, engine) as s:  # worker cannot take the query while the bulk batch is held
        assert s.server.ready and s.server.queue.express_tokens == 0, "ready before the express prewarm ends"
        bulk = s.stub.Embed.future(lane_request(100, 60, BULK), timeout=60)
        wait_until(lambda: engine.launched == 1)
        query = s.stub.Embed.future(lane_request(7, 12, INTERACTIVE), timeout=60)
        wait_until(lambda: s.server.queue.lane_tokens(INTERACTIVE) == 12, what="the query waiting")
        engine.prewarmed.set()  # the lane is ready: the waiting query goes express at once
        assert query.result().rows == 1 and not bulk.done() and len(engine.express_batches) == 1
        engine.release(10)
        assert bulk.result().rows == 1
    failing = SlowPrewarmEngine(fails=RuntimeError("graph verification failed"), gated=True)
    failing.prewarmed.set()
    with caplog.at_level("ERROR", logger="tulip.express"):
        with ServerThread(make_config(max_batch_tokens=64, express_batch_tokens=32), failing) as s:
            wait_until(lambda: s.server.express.prewarm_failed, what="the prewarm failed")
            bulk = s.stub.Embed.future(lane_request(100, 60, BULK), timeout=60)
            wait_until(lambda: failing.launched == 1)
            query = s.stub.Embed.future(lane_request(7, 12, INTERACTIVE), timeout=60)
            failing.release(10)  # the query waits for the bulk batch, on the main worker, as with express off
            assert bulk.result().rows == query.result().rows == 1 and failing.express_batches == []
    assert any("express lane prewarm failed" in r.getMessage() for r in caplog.records)


def test_express_batch_tokens_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="express_batch_tokens"):
        make_config(express_batch_tokens=-1)


@pytest.mark.parametrize("where", ["on the device", "at launch"])
def test_a_failing_express_batch_fails_its_request_only(where) -> None:
    failing = (lambda b: int(b.token_ids[0]) == 9)
    if where == "on the device":
        engine = FakeEngine(gated=True, express=True, fail_when=failing)
    else:
        engine = FakeEngine(gated=True, express=True,
                            raise_in_step=lambda b: RuntimeError("CUDA error: launch failed") if failing(b) else None)
    with ServerThread(make_config(max_batch_tokens=64, express_batch_tokens=32), engine) as s:
        wait_until(lambda: s.server.queue.express_tokens == 32, what="express on")
        bulk = s.stub.Embed.future(lane_request(100, 60, BULK), timeout=60)
        wait_until(lambda: engine.launched == 1)
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(lane_request(9, 12, INTERACTIVE), timeout=10)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert s.stub.Embed(lane_request(7, 12, INTERACTIVE), timeout=10).rows == 1
        engine.release(10)
        assert bulk.result().rows == 1
        wait_until(lambda: s.server.queue._bulk_inflight == 0, what="bulk accounted as done")


def test_requests_dropped_for_a_lost_device_wake_the_worker_whose_request_they_uncover() -> None:
    """RELIABILITY 62: once the device is lost the main worker drops what waits for it (drop_waiting); a chunk the
    express worker owns behind one of them, in the same flow, is then at the head, and the express launcher,
    waiting with no timeout because the main worker's chunk was there, is woken to take it (as cancel wakes it)."""
    q = express_queue(express_tokens=10)
    push(q, BULK, 10, marker=500)
    assert markers(q.next_batch(timeout=0)) == [500]  # bulk on the device: express time
    mains, theirs = push_flow(q, "req-1", 10, marker=1), push_flow(q, "req-1", 10, marker=3)
    mains.owner, theirs.owner = MAIN, EXPRESS
    got = []
    waiting = threading.Thread(target=lambda: got.append(q.next_express()), daemon=True)  # only a wake-up ends it
    waiting.start()
    wait_until(lambda: q._express_cond._waiters, what="the express launcher waiting")  # main's chunk at the head
    assert q.drop_waiting(MAIN) == [mains]
    waiting.join(10)
    stranded = waiting.is_alive()
    q.close()  # frees the thread if it was stranded
    assert not stranded, "the express launcher was never woken for the request it takes"
    assert markers(got[0]) == [3]
