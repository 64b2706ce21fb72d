"""Packing late (TULIP_PACK_AHEAD_MS): the next batch is packed shortly before the running one is
expected to finish, so requests that arrive meanwhile share it instead of each waiting a whole period."""

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

from tulip.pacing import DeviceTimes
from tulip.scheduler import SequenceQueue

STEP_S = 0.1  # the fake device's time per batch


def test_device_times_median_per_size_class_ignores_one_slow_capture() -> None:
    times = DeviceTimes(window=5)
    assert times.estimate(300) is None
    for s in (0.002, 0.0021, 0.040, 0.0019):  # one lazy capture among replays
        times.observe(300, s)
    assert times.estimate(300) == pytest.approx(0.00205)
    assert times.estimate(260) == times.estimate(300)  # same power-of-two class
    assert times.estimate(600) is None


def test_hold_returns_at_the_deadline_on_a_full_batch_or_when_told() -> None:
    queue = SequenceQueue(max_batch_tokens=100, max_batch_seqs=4, max_queue_tokens=1000)
    t0 = time.monotonic()
    queue.hold(t0 + 0.05, lambda: False)
    assert 0.045 <= time.monotonic() - t0 < 1.0
    stop = threading.Event()
    threading.Timer(0.05, lambda: (stop.set(), queue.poke())).start()
    t0 = time.monotonic()
    queue.hold(t0 + 5.0, stop.is_set)
    assert time.monotonic() - t0 < 1.0, "poke() + stop() ends the hold"
    queue.close()
    t0 = time.monotonic()
    queue.hold(t0 + 5.0, lambda: False)
    assert time.monotonic() - t0 < 0.5, "a closed queue is not held"


def _send(tulip: ServerThread, marker: int, out: dict) -> None:
    req = encode_request([[marker] * 20])
    out[marker] = (decode_response(tulip.stub.Embed(req, timeout=10)), solo_embedding(req), time.monotonic())


def _a_then_b_then_c(pack_ahead_ms: float) -> tuple[FakeEngine, dict, float]:
    engine = FakeEngine(step_seconds=STEP_S)
    with ServerThread(make_config(pack_ahead_ms=pack_ahead_ms), engine=engine) as tulip:
        for i in range(3):  # learn the device time of this size class
            _send(tulip, 900 + i, {})
        out: dict = {}
        start = time.monotonic()
        a = threading.Thread(target=_send, args=(tulip, 1, out))
        a.start()
        wait_until(lambda: engine.launched == 4, what="A launched")
        time.sleep(0.01)
        b = threading.Thread(target=_send, args=(tulip, 2, out))
        b.start()
        time.sleep(0.03)
        c = threading.Thread(target=_send, args=(tulip, 3, out))
        c.start()
        for t in (a, b, c):
            t.join(10)
        for got, want, _ in out.values():
            assert (got == want).all()
        registry = tulip.server.worker.metrics.registry
        engine.held = (tulip.server.worker.held_launches, registry.get_sample_value("tulip_launch_hold_seconds_count"))
        return engine, out, start


def test_requests_arriving_while_the_device_is_busy_share_the_next_batch() -> None:
    engine, out, start = _a_then_b_then_c(pack_ahead_ms=20)
    held, exported = engine.held
    assert held >= 1 and exported == held, "each hold is counted and exported"
    sizes = [b.num_seqs for b in engine.batches[3:]]
    assert sizes == [1, 2], f"A, then B and C together; got batches of {sizes}"
    assert out[3][2] - start < 2.6 * STEP_S, "C finished with the second batch"


def test_pack_ahead_zero_packs_as_soon_as_a_slot_frees() -> None:
    engine, out, start = _a_then_b_then_c(pack_ahead_ms=0)
    assert [b.num_seqs for b in engine.batches[3:]] == [1, 1, 1]  # B took the free slot at once
    assert out[3][2] - start > 2.6 * STEP_S


def test_negative_value_is_refused() -> None:
    from tulip.config import TulipConfig

    with pytest.raises(ValueError, match="pack_ahead_ms"):
        TulipConfig(pack_ahead_ms=-1)
