"""Packing late (TULIP_PACK_AHEAD_MS): the next batch is packed shortly before the running one is
expected to finish, so requests that arrive meanwhile share it instead of each waiting a whole period."""

from __future__ import annotations

import threading
import time
import types

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

from tulip.pacing import DeviceTimes
from tulip.scheduler import SequenceQueue

STEP_S = 0.1  # the fake device's time per batch, on the fake clock


def test_device_times_median_per_size_class_ignores_one_slow_capture() -> None:
    times = DeviceTimes(window=5)
    assert times.estimate(300) is None
    for s in (0.002, 0.0021, 0.040, 0.0019):  # one lazy capture among replays
        times.observe(300, s)
    assert times.estimate(300) == pytest.approx(0.00205)
    assert times.estimate(260) == times.estimate(300)  # same power-of-two class
    assert times.estimate(600) is None


def test_hold_returns_at_the_deadline_on_a_full_batch_or_when_told() -> None:
    """hold() on a fake clock: it returns once the clock reaches `until` (not at a poke before that), when
    poke() finds stop() true, and at once on a closed queue. The join timeouts are hang guards only."""
    clock = _FakeClock(100.0)
    queue = SequenceQueue(max_batch_tokens=100, max_batch_seqs=4, max_queue_tokens=1000, clock=clock)
    holding = _hold_in_thread(queue, 105.0, lambda: False)
    wait_until(lambda: clock.reads >= 1, what="hold read the clock")
    clock.now = 104.9
    queue.poke()  # before the deadline: it re-reads the clock and keeps holding
    wait_until(lambda: clock.reads >= 2, what="hold re-read the clock")
    assert holding.is_alive(), "a poke before the deadline does not end the hold"
    clock.now = 105.0
    queue.poke()
    holding.join(10)
    assert not holding.is_alive(), "the hold ends when the clock reaches the deadline"

    stop = threading.Event()
    clock.reads = 0
    holding = _hold_in_thread(queue, 200.0, stop.is_set)
    wait_until(lambda: clock.reads >= 1, what="hold waiting")
    stop.set()
    queue.poke()
    holding.join(10)
    assert not holding.is_alive() and clock.now < 200.0, "poke() + stop() ends the hold before its deadline"

    queue.close()
    clock.reads = 0
    holding = _hold_in_thread(queue, 200.0, lambda: False)
    holding.join(10)
    assert not holding.is_alive() and clock.reads == 0, "a closed queue is not held"


class _FakeClock:
    def __init__(self, now: float) -> None:
        self.now, self.reads = now, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def _hold_in_thread(queue: SequenceQueue, until: float, stop) -> threading.Thread:
    t = threading.Thread(target=queue.hold, args=(until, stop), daemon=True)
    t.start()
    return t


def _send(tulip: ServerThread, marker: int, out: dict) -> None:
    req = encode_request([[marker] * 20])
    out[marker] = (decode_response(tulip.stub.Embed(req, timeout=10)), solo_embedding(req))


class _Scene:
    """A Tulip on a gated fake engine whose worker and queue read one fake clock (frozen unless the test
    moves it): the device time it learns and the moment a held launch packs are the test's to set."""

    def __init__(self, tulip: ServerThread, engine: FakeEngine, clock: _FakeClock) -> None:
        self.tulip, self.engine, self.clock = tulip, engine, clock
        self.worker = tulip.server.worker
        self.out: dict = {}
        self.threads: list[threading.Thread] = []

    def send(self, marker: int) -> None:
        t = threading.Thread(target=_send, args=(self.tulip, marker, self.out), daemon=True)
        t.start()
        self.threads.append(t)

    def queued(self) -> int:
        return self.worker.queue.depth()[0]

    def finish(self) -> None:
        self.engine.release(100)
        for t in self.threads:
            t.join(10)
        for got, want in self.out.values():
            assert (got == want).all()


def _scene(monkeypatch, pack_ahead_ms: float):
    import tulip.completer
    import tulip.worker

    clock = _FakeClock(time.monotonic())  # near the real clock: the watchdog compares with it
    fake_time = types.SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter)
    # A batch's device time is its delivery (stamped by the completer, tulip.completer) minus its launch (stamped
    # by the launcher, tulip.worker): both on the fake clock, or what is learnt is real time since `clock` was made.
    for module in (tulip.worker, tulip.completer):
        monkeypatch.setattr(module, "time", fake_time)
    engine = FakeEngine(gated=True)
    tulip_ = ServerThread(make_config(pack_ahead_ms=pack_ahead_ms), engine=engine)
    tulip_.server.worker.queue._clock = clock  # hold() compares the worker's deadline with this clock
    scene = _Scene(tulip_, engine, clock)
    for i in range(3):  # learn the device time of this size class: STEP_S per batch on the fake clock
        scene.send(900 + i)
        # batches_launched counts a launch once its time is stamped (engine.launched counts it inside step())
        wait_until(lambda i=i: scene.worker.batches_launched == i + 1, what="warm-up batch launched")
        clock.now += STEP_S
        engine.release(1)
        wait_until(lambda i=i: 900 + i in scene.out, what="warm-up answered")
    assert scene.worker.device_times.estimate(20) == pytest.approx(STEP_S), "the device time learnt on the fake clock"
    return scene


def test_requests_arriving_while_the_device_is_busy_share_the_next_batch(monkeypatch) -> None:
    scene = _scene(monkeypatch, pack_ahead_ms=20)
    engine, worker, clock = scene.engine, scene.worker, scene.clock
    with scene.tulip:
        held_before = worker.held_launches
        scene.send(1)  # A
        wait_until(lambda: engine.launched == 4, what="A launched")
        wait_until(lambda: worker.held_launches == held_before + 1, what="the free slot held")
        scene.send(2)  # B: the device is busy with A, a slot is free, the launcher holds it
        wait_until(lambda: scene.queued() == 1, what="B queued")
        scene.send(3)  # C
        wait_until(lambda: scene.queued() == 2, what="C queued")
        assert engine.launched == 4, "nothing packed before the hold's deadline"
        clock.now += STEP_S - 0.02  # pack_ahead_ms before A is expected to finish
        worker.queue.poke()
        wait_until(lambda: engine.launched == 5, what="B and C launched")
        assert engine.completed == 3, "the next batch was packed while A was still on the device"
        scene.finish()
        registry = worker.metrics.registry
        held, exported = worker.held_launches, registry.get_sample_value("tulip_launch_hold_seconds_count")
    assert held >= 1 and exported == held, "each hold is counted and exported"
    sizes = [b.num_seqs for b in engine.batches[3:]]
    assert sizes == [1, 2], f"A, then B and C together; got batches of {sizes}"
    assert [int(b.token_ids[0]) for b in engine.batches[3:]] == [1, 2]


def test_pack_ahead_zero_packs_as_soon_as_a_slot_frees(monkeypatch) -> None:
    scene = _scene(monkeypatch, pack_ahead_ms=0)
    engine, worker = scene.engine, scene.worker
    with scene.tulip:
        scene.send(1)  # A
        wait_until(lambda: engine.launched == 4, what="A launched")
        scene.send(2)  # B takes the free slot at once, the clock never moving
        wait_until(lambda: engine.launched == 5, what="B launched alone")
        scene.send(3)  # C waits for a slot
        wait_until(lambda: scene.queued() == 1, what="C queued")
        assert engine.launched == 5
        scene.finish()
        assert worker.held_launches == 0
    assert [b.num_seqs for b in engine.batches[3:]] == [1, 1, 1]
    assert [int(b.token_ids[0]) for b in engine.batches[3:]] == [1, 2, 3]


def test_negative_value_is_refused() -> None:
    from tulip.config import TulipConfig

    with pytest.raises(ValueError, match="pack_ahead_ms"):
        TulipConfig(pack_ahead_ms=-1)


def test_device_busy_counts_time_with_a_batch_on_the_device_not_the_gaps() -> None:
    """tulip_device_busy_seconds_total: a batch is on the device from its launch or the previous delivery,
    whichever is later, to its own delivery; an idle gap between batches is not counted."""
    from tulip.packing import Launched
    from tulip.worker import Worker

    worker = Worker(FakeEngine(), SequenceQueue(max_batch_tokens=100, max_batch_seqs=4, max_queue_tokens=1000))
    packed = types.SimpleNamespace(lane_tokens=[10, 0], tokens=10)
    for launched, done in ((100.000, 100.010), (100.001, 100.015), (100.020, 100.025)):  # two overlap, a gap
        worker._inflight += 1
        worker._account_delivery(Launched(packed, None, None, 0.0, launched_mono=launched, done_mono=done))
    assert worker.device_busy_s == pytest.approx(0.010 + 0.005 + 0.005)
