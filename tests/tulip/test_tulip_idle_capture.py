"""Idle capture (TULIP_IDLE_CAPTURE_MS): the worker asks the engine to capture pending graph layouts only
while the queue is empty and nothing is in flight, keeps serving meanwhile, and survives a failing capture."""

from __future__ import annotations

import threading
import time

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

from tulip.config import TulipConfig
from tulip.scheduler import SequenceQueue


class CapturingEngine(FakeEngine):
    """A fake engine with `pending` layouts to capture; each capture takes `capture_seconds`."""

    def __init__(self, pending: int, capture_seconds: float = 0.0, fail: bool = False, **kw) -> None:
        super().__init__(**kw)
        self.pending, self.capture_seconds, self.fail = pending, capture_seconds, fail
        self.captures = 0
        self.busy_at_capture = 0  # captures that found a batch launched and not completed
        self.lock = threading.Lock()

    def capture_pending(self) -> bool:
        with self._lock:
            if self.launched != self.completed:
                self.busy_at_capture += 1
        if self.fail:
            self.captures += 1
            raise RuntimeError("capture failed")
        if self.pending == 0:
            return False
        time.sleep(self.capture_seconds)  # the capture's own device time (the fake's work), not a wait
        self.pending -= 1
        self.captures += 1
        return True


class WaitsForWork:
    """Watches the launcher's waits on the queue (SequenceQueue.next_batch, patched before the server starts).
    Capture decisions are taken between such waits, so these show the worker had its chances to capture,
    however slow the machine: a fixed sleep can pass while the worker thread never ran."""

    def __init__(self, monkeypatch) -> None:
        self.idle_windows = 0  # timed waits that ended empty: the worker then decides about capturing
        self.blocked = 0  # waits without a timeout in progress: the worker has decided not to capture now
        next_batch = SequenceQueue.next_batch

        def counted(queue, timeout=None, rehold=None):
            self.blocked += timeout is None
            try:
                packed = next_batch(queue, timeout, rehold)
            finally:
                self.blocked -= timeout is None
            self.idle_windows += packed is None
            return packed

        monkeypatch.setattr(SequenceQueue, "next_batch", counted)

    def idle_and_waiting(self, tulip: ServerThread) -> bool:
        """Nothing in flight and the launcher waits for work with no idle window: no capture is coming."""
        return self.blocked > 0 and tulip.server.worker.inflight == 0


def _embed(tulip: ServerThread, seqs):
    req = encode_request(seqs)
    return decode_response(tulip.stub.Embed(req, timeout=10)), solo_embedding(req)


def test_pending_layouts_are_captured_while_idle_and_requests_still_served() -> None:
    engine = CapturingEngine(pending=5, capture_seconds=0.01, step_seconds=0.002)
    with ServerThread(make_config(idle_capture_ms=5), engine=engine) as tulip:
        wait_until(lambda: engine.captures == 5, what="five idle captures")
        for i in range(20):  # served while (and after) captures ran
            got, want = _embed(tulip, [[i + 1] * 30, [7] * 12])
            assert (got == want).all()
        assert engine.busy_at_capture == 0, "a capture ran while a batch was on the device"
        assert tulip.server.worker.idle_captures == 5


def test_no_capture_while_a_batch_is_in_flight(monkeypatch) -> None:
    waits = WaitsForWork(monkeypatch)
    engine = CapturingEngine(pending=3, gated=True)
    with ServerThread(make_config(idle_capture_ms=2), engine=engine) as tulip:
        wait_until(lambda: engine.captures == 3, what="captures while idle")
        engine.pending = 3
        results = []
        t = threading.Thread(target=lambda: results.append(_embed(tulip, [[4] * 20])))
        t.start()
        wait_until(lambda: engine.launched == 1, what="the batch launched")
        before, windows = engine.captures, waits.idle_windows  # the queue is empty, the device holds the batch
        wait_until(lambda: waits.idle_windows >= windows + 20, what="twenty idle windows with the batch in flight")
        assert engine.captures == before
        engine.release(1)
        t.join(10)
        got, want = results[0]
        assert (got == want).all()
        wait_until(lambda: engine.captures == 6, what="captures once the device is idle again")
        assert engine.busy_at_capture == 0


def test_off_by_default(monkeypatch) -> None:
    assert TulipConfig().idle_capture_ms == 0
    waits = WaitsForWork(monkeypatch)
    engine = CapturingEngine(pending=3)
    with ServerThread(make_config(), engine=engine) as tulip:
        _embed(tulip, [[5] * 10])
        wait_until(lambda: waits.idle_and_waiting(tulip), what="the worker idle after the request")
        assert engine.captures == 0


def test_a_failing_capture_turns_idle_capture_off_and_the_replica_keeps_serving(monkeypatch) -> None:
    waits = WaitsForWork(monkeypatch)
    engine = CapturingEngine(pending=3, fail=True)
    with ServerThread(make_config(idle_capture_ms=2), engine=engine) as tulip:
        wait_until(lambda: engine.captures >= 1, what="the first capture")
        wait_until(lambda: waits.idle_and_waiting(tulip), what="the worker idle after the failure")
        assert engine.captures == 1, "tried again after a failure"
        got, want = _embed(tulip, [[9] * 16])
        assert (got == want).all()
        wait_until(lambda: waits.idle_and_waiting(tulip), what="the worker idle after the request")
        assert engine.captures == 1, "tried again after a failure"


def test_negative_value_is_refused() -> None:
    with pytest.raises(ValueError, match="idle_capture_ms"):
        TulipConfig(idle_capture_ms=-1)
