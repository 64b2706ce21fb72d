"""Faults inside one replica: a failed batch drops the rest of its request; a hung batch trips the watchdog."""

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tulip_testkit import (
    FakeEngine,
    ServerThread,
    decode_response,
    encode_request,
    first_tokens,
    make_config,
    marked_sequence,
    solo_embedding,
    wait_until,
)


def test_failed_batch_cancels_the_rest_of_its_request() -> None:
    """RELIABILITY 36: a request whose batch failed in the engine is answered with the error, and its
    sequences still queued never run; the next request is correct."""
    engine = FakeEngine(gated=True, fail_when=lambda b: int(b.token_ids[0]) == 999)
    with ServerThread(make_config(max_batch_tokens=32, max_inflight_batches=2), engine) as s:
        seqs = [marked_sequence(999, 30), marked_sequence(2, 30), marked_sequence(3, 30)]
        doomed = s.stub.Embed.future(encode_request(seqs), timeout=30)
        # [999] and [2] are on the "device", [3] waits in the queue
        wait_until(lambda: engine.launched == 2 and s.server.queue.depth()[0] == 1, what="two batches launched")
        engine.release(1)  # the batch [999] fails
        with pytest.raises(grpc.RpcError) as err:
            doomed.result()
        assert err.value.code() == grpc.StatusCode.INTERNAL
        wait_until(lambda: s.server.queue.depth() == (0, 0), what="the failed request's work left the queue")
        after = encode_request([marked_sequence(5, 4)])
        answer = s.stub.Embed.future(after, timeout=30)
        engine.release(100)
        np.testing.assert_array_equal(decode_response(answer.result()), solo_embedding(after))
    assert 3 not in first_tokens(engine) and 5 in first_tokens(engine)


def test_non_finite_rows_fail_their_request_not_the_next() -> None:
    """RELIABILITY 47: a batch whose rows come back NaN (a persistent kernel's stalled grid poisons them) fails
    its request with INTERNAL naming non-finite values, never an answer of NaNs; the next request is correct."""
    engine = FakeEngine(poison_when=lambda b: int(b.token_ids[0]) == 999)
    with ServerThread(make_config(), engine) as s:
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([marked_sequence(999, 8)]), timeout=30)
        assert err.value.code() == grpc.StatusCode.INTERNAL and "NonFiniteRows" in err.value.details()
        after = encode_request([marked_sequence(5, 4)])
        np.testing.assert_array_equal(decode_response(s.stub.Embed(after, timeout=30)), solo_embedding(after))


def test_a_batch_that_loses_the_device_fails_over_what_the_replica_holds() -> None:
    """RELIABILITY 62: a batch fails and the device runs no more work (a CUDA error that poisons the context):
    that batch's request and the one queued behind it are answered UNAVAILABLE "device_lost" (Ivy retries them on
    another replica), not INTERNAL; new work is refused the same way and health turns NOT_SERVING, for good (the
    process then exits 3: test_tulip_process). A failure that leaves the device running keeps the replica
    serving (test_failed_batch_cancels_the_rest_of_its_request)."""
    engine = FakeEngine(gated=True, break_when=lambda b: int(b.token_ids[0]) == 999)
    with ServerThread(make_config(max_batch_tokens=32, max_inflight_batches=1), engine) as s:
        doomed = s.stub.Embed.future(encode_request([marked_sequence(999, 30)]), timeout=30)
        wait_until(lambda: engine.launched == 1, what="the breaking batch launched")
        queued = s.stub.Embed.future(encode_request([marked_sequence(3, 30)]), timeout=30)
        wait_until(lambda: s.server.queue.depth()[0] == 1, what="a request queued behind it")
        engine.release(100)
        for future in (doomed, queued):
            with pytest.raises(grpc.RpcError) as err:
                future.result()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
            assert "no longer runs work (RuntimeError: CUDA error: an illegal memory" in err.value.details()
            assert ("tulip-reason", "device_lost") in err.value.trailing_metadata()
        wait_until(s.server.lost_device.is_set, what="the server told")
        wait_until(lambda: _status(s) == health_pb2.HealthCheckResponse.NOT_SERVING, what="health")
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([[1, 2]]), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "no longer runs work" in err.value.details()
    assert first_tokens(engine) == [999]  # the queued request never reached the device


class LaunchCountingEngine(FakeEngine):
    """A fake engine that records the first token of every batch handed to step(), a launch that raised too
    (FakeEngine.launched counts only the launches that reached its device)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.launch_attempts: list[int] = []

    def step(self, batch, express: bool = False):
        self.launch_attempts.append(int(batch.token_ids[0]))
        return super().step(batch, express=express)


def test_once_the_device_is_lost_queued_requests_are_answered_without_a_launch() -> None:
    """RELIABILITY 62: once a batch's failure and the probe after it find the device lost, the requests still
    queued behind it are answered UNAVAILABLE "device_lost" without being packed or launched onto the dead
    device (each such launch only fails), and nothing reaches the engine while the replica drains."""
    engine = LaunchCountingEngine(gated=True, break_when=lambda b: int(b.token_ids[0]) == 999)
    with ServerThread(make_config(max_batch_tokens=32, max_inflight_batches=1), engine) as s:
        doomed = s.stub.Embed.future(encode_request([marked_sequence(999, 30)]), timeout=30)
        wait_until(lambda: engine.launched == 1, what="the breaking batch launched")
        queued = [s.stub.Embed.future(encode_request([marked_sequence(marker, 30)]), timeout=30)
                  for marker in (3, 4, 5)]  # one batch each: 30 tokens of a 32-token budget
        wait_until(lambda: s.server.queue.depth()[0] == 3, what="three requests queued behind it")
        engine.release(100)
        for future in (doomed, *queued):
            with pytest.raises(grpc.RpcError) as err:
                future.result()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
            assert ("tulip-reason", "device_lost") in err.value.trailing_metadata()
        assert s.server.queue.depth() == (0, 0)
        s.run(s.server.drain())
    assert engine.launch_attempts == [999], engine.launch_attempts


def test_a_batch_taken_before_the_device_was_lost_is_failed_not_launched() -> None:
    """RELIABILITY 62: a batch packed while the device was still running (taken on the event loop and handed
    over, or packed by the launcher as the loss was found) is answered DeviceLost on the completer, its slot
    freed, and never handed to engine.step()."""
    import numpy as np

    from tulip.errors import DeviceLost
    from tulip.packing import FailedBatch
    from tulip.scheduler import QueuedSequence, SequenceQueue, Ticket
    from tulip.worker import Worker

    engine = LaunchCountingEngine()
    queue = SequenceQueue(max_batch_tokens=32, max_batch_seqs=4, max_queue_tokens=1024)
    worker = Worker(engine, queue, max_inflight=1)  # threads not started: the test is the launcher
    ticket = Ticket()
    queue.push(ticket, [QueuedSequence(ticket=ticket, tokens=np.full(8, 7, np.int32),
                                       spans=np.array([[0, 8]], np.int32), rows=np.array([0]))])
    packed = queue.next_batch(timeout=0)
    worker.device_check.lost = "RuntimeError: CUDA error: an illegal memory access was encountered"
    worker._slots.acquire()
    worker._run(packed)
    failed = worker._launched.get_nowait()
    assert isinstance(failed, FailedBatch) and failed.jobs == [ticket] and isinstance(failed.error, DeviceLost)
    assert engine.launch_attempts == [] and worker._slots.acquire(blocking=False)


def test_a_launch_that_raised_keeps_its_slot_until_the_completer_has_probed_the_device() -> None:
    """RELIABILITY 62: a launch that raised (not an error Tulip knows) hands its slot to the completer, which frees it
    only after the probe has said whether the device still runs, so the launcher cannot launch the next batch onto
    a device that may be lost while the probe asks (before, the launcher freed it at once)."""
    from tulip.completer import STOP
    from tulip.packing import FailedBatch
    from tulip.scheduler import QueuedSequence, SequenceQueue, Ticket
    from tulip.worker import Worker

    class RaisingEngine(FakeEngine):
        def step(self, batch, express: bool = False):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        def device_ok(self) -> bool:
            assert not worker._slots.acquire(blocking=False), "the slot freed before the probe asked"
            probes.append(True)
            return True

    class Failing(Ticket):
        def fail(self, error, handoff) -> None:
            failures.append(error)

    probes, failures = [], []
    queue = SequenceQueue(max_batch_tokens=32, max_batch_seqs=4, max_queue_tokens=1024)
    worker = Worker(RaisingEngine(), queue, max_inflight=1)  # threads not started: the test is both of them
    ticket = Failing()
    queue.push(ticket, [QueuedSequence(ticket=ticket, tokens=np.full(8, 7, np.int32),
                                       spans=np.array([[0, 8]], np.int32), rows=np.array([0]))])
    worker._slots.acquire()
    worker._run(queue.next_batch(timeout=0))
    failed = worker._launched.get_nowait()
    assert isinstance(failed, FailedBatch) and failed.slot and not worker._slots.acquire(blocking=False)
    worker._launched.put(failed)
    worker._launched.put(STOP)
    worker._complete_loop()  # the completer: maps the error (the probe), fails the request, then frees the slot
    assert probes == [True] and len(failures) == 1 and worker._slots.acquire(blocking=False)


def test_the_device_is_probed_on_the_completer_and_a_probe_that_raises_means_lost() -> None:
    """RELIABILITY 62: a launch that raised (on the event loop, for an inline launch) is probed on the completer's
    thread, never the loop's; a failure whose probe finds the device running stays the batch's own (INTERNAL), and
    a probe that itself raises counts as a lost device."""
    import threading

    engine = FakeEngine(raise_in_step=lambda b: RuntimeError("launch failed"), replays_when=lambda b: True)
    probed: list[str] = []

    def probe() -> bool:
        probed.append(threading.current_thread().name)
        if len(probed) > 1:
            raise RuntimeError("the driver is gone")
        return True

    engine.device_ok = probe
    with ServerThread(make_config(), engine) as s:
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([[1, 2]]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INTERNAL and "RuntimeError" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([[1, 2]]), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "no longer runs work" in err.value.details()
        assert s.server.worker.inline_launches == 2 and len(probed) == 2, probed
        assert all(name.endswith("-completer") for name in probed), probed


def _status(s: ServerThread) -> int:
    return health_pb2_grpc.HealthStub(s.channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def test_hung_batch_turns_health_not_serving_and_back_when_it_completes(capsys) -> None:
    """RELIABILITY 28: a batch overdue past the watchdog's limit turns health NOT_SERVING (so `tulip health`,
    the liveness check, fails) and new work is refused with UNAVAILABLE; when the batch completes the
    replica serves again and the held request is answered."""
    from tulip.cli import main

    engine = FakeEngine(gated=True)
    with ServerThread(make_config(watchdog_s=0.3), engine) as s:
        assert _status(s) == health_pb2.HealthCheckResponse.SERVING
        held = encode_request([marked_sequence(7, 8)])
        future = s.stub.Embed.future(held, timeout=60)
        wait_until(lambda: engine.launched == 1, what="batch launched")
        wait_until(lambda: _status(s) == health_pb2.HealthCheckResponse.NOT_SERVING, what="watchdog fired")
        assert main(["health", "--address", s.address]) == 1
        assert "NOT_SERVING" in capsys.readouterr().err
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([[1, 2]]), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "stalled" in err.value.details()
        engine.release(1)
        np.testing.assert_array_equal(decode_response(future.result()), solo_embedding(held))
        wait_until(lambda: _status(s) == health_pb2.HealthCheckResponse.SERVING, what="recovered")
        engine.release(100)
        assert s.stub.Embed(encode_request([[1, 2]]), timeout=10).rows == 1


def test_watchdog_limit_is_a_multiple_of_the_expected_device_time() -> None:
    from tulip.watchdog import overdue

    assert overdue(None, 0.0, now=100.0, factor=20, floor_s=10) is None  # nothing in flight
    on = (90.0, 0.2)  # on the device since 90 s, expected to take 0.2 s
    assert overdue(on, 0.0, now=99.0, factor=20, floor_s=10) is None  # 9 s < max(20 x 0.2, 10)
    assert overdue(on, 0.0, now=101.0, factor=20, floor_s=10) == pytest.approx((11.0, 10.0))
    assert overdue((90.0, 1.0), 0.0, now=101.0, factor=20, floor_s=10) is None  # 11 s < 20 x 1 s
    assert overdue((90.0, 1.0), 0.0, now=111.0, factor=20, floor_s=10) == pytest.approx((21.0, 20.0))
    assert overdue(None, 95.0, now=106.0, factor=20, floor_s=10) == pytest.approx((11.0, 10.0))  # step() hung


def test_oldest_batch_is_on_the_device_from_the_previous_delivery() -> None:
    from tulip.worker import Worker

    worker = Worker(FakeEngine(), queue=None)  # type: ignore[arg-type]  # threads not started
    assert worker.on_device() is None
    worker._clock.launched(90.0, 0.2)  # tulip.pacing.DeviceClock: launched at 90 s, 0.2 s expected
    assert worker.on_device() == (90.0, 0.2)
    worker._clock.last_done = 95.0  # it queued behind a batch delivered at 95 s
    assert worker.on_device() == (95.0, 0.2)


def test_the_device_clock_paces_whole_and_layered_batches() -> None:
    """tulip.pacing.DeviceClock: a whole batch queues behind the tail; a batch stepped by layers returns with only
    its last layers left and counts as on the device since its stepping began; a delivery re-anchors the tail."""
    from tulip.pacing import DeviceClock

    clock = DeviceClock()
    clock.launched(10.0, 0.030)
    clock.launched(10.001, 0.030)  # behind the first: the tail is both
    assert clock.tail_end == pytest.approx(10.060)
    assert clock.delivered(10.030, 10.0) == pytest.approx(0.030)
    assert clock.tail_end == pytest.approx(10.060) and clock.oldest() == (10.030, 0.030)
    assert clock.delivered(10.060, 10.001) == pytest.approx(0.030) and clock.oldest() is None
    clock.launched(10.090, 0.030, began=10.062, left=0.002)  # stepped by layers from 10.062
    assert clock.tail_end == pytest.approx(10.092) and clock.oldest() == (10.062, 0.030)
    assert clock.delivered(10.092, 10.062) == pytest.approx(0.030)
    assert clock.busy_s == pytest.approx(0.090)


def test_busy_spans_count_the_union_of_both_workers_batches() -> None:
    """tulip.pacing.BusySpans (tulip_device_busy_seconds_total): a query stepped between bulk's layers lies inside
    the bulk batch's span and is not counted twice, whichever is delivered first; random spans against the
    union measured on a fine grid."""
    import random

    from tulip.pacing import BusySpans, DeviceClock

    spans = BusySpans()
    bulk, query = DeviceClock(spans), DeviceClock(spans)
    query.launched(10.004, 0.001)
    query.delivered(10.005, 10.004)  # delivered first, inside the bulk batch's span
    bulk.launched(10.030, 0.030, began=10.000, left=0.002)
    bulk.delivered(10.030, 10.000)
    assert spans.total() == pytest.approx(0.030)
    assert bulk.busy_s + query.busy_s == pytest.approx(0.031)  # each worker's own count keeps its batches
    query.launched(10.040, 0.002)
    query.delivered(10.042, 10.040)
    assert spans.total() == pytest.approx(0.032)

    rng = random.Random(7)
    spans, grid = BusySpans(horizon_s=1e9), [False] * 20000
    for _ in range(300):
        start = rng.randrange(0, 19900)
        end = start + rng.randrange(0, 100)
        spans.add(start / 1000, end / 1000)
        grid[start:end] = [True] * (end - start)
    assert spans.total() == pytest.approx(sum(grid) / 1000, abs=1e-9)


def test_busy_spans_settle_what_is_older_than_their_horizon() -> None:
    """Spans ending more than the horizon before the latest end are summed and dropped; a late span reaching
    into the settled past counts only from the settled time on."""
    from tulip.pacing import BusySpans

    spans = BusySpans(horizon_s=1.0)
    for i in range(100):
        spans.add(i * 0.1, i * 0.1 + 0.05)
    assert len(spans._starts) <= 11 and spans.total() == pytest.approx(5.0)
    settled_s, settled_to = spans._settled_s, spans._settled_to
    assert 8.0 < settled_to < 9.0 and settled_s == pytest.approx(0.05 * round(settled_to / 0.1 + 0.5))
    spans.add(0.0, 10.0)  # the settled past is not counted again: it covers the rest from the settled time on
    assert spans.total() == pytest.approx(settled_s + 10.0 - settled_to)


def test_idle_capture_never_runs_once_the_device_is_lost() -> None:
    """RELIABILITY 62: the device lost while the launcher waited for work with idle capture on (the failed batch
    already delivered): no graph is captured on it (its CUDA calls could hang); the launcher waits for work as
    without idle capture."""
    from tulip.scheduler import SequenceQueue
    from tulip.worker import Worker

    captures = []

    class CapturingEngine(FakeEngine):
        def capture_pending(self) -> bool:
            captures.append(True)
            return True

    queue = SequenceQueue(max_batch_tokens=32, max_batch_seqs=4, max_queue_tokens=1024)
    worker = Worker(CapturingEngine(), queue, max_inflight=1, idle_capture_s=0.001)  # threads not started
    waits = iter(["lost while it waited", "closed"])

    def next_batch(timeout=None, rehold=None):
        if next(waits) == "closed":
            queue.close()
            return None
        worker.device_check.lost = "RuntimeError: CUDA error: an illegal memory access was encountered"
        return None  # the idle wait timed out

    queue.next_batch = next_batch
    assert worker._next_batch() is None and captures == []
