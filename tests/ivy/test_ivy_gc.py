"""An Ivy worker freezes its started heap out of the garbage collector (gc_freeze), gives it back at
shutdown, and exports every collection's pause as ivy_gc_pause_seconds{generation}."""

from __future__ import annotations

import gc

from fake_tulip import FakeTulip
from ivy_testkit import gateway


def _full_collections(client) -> float:
    for line in client.get("/metrics").text.splitlines():  # the scrape drains the worker's deferred pauses
        if line.startswith('ivy_gc_pause_seconds_count{generation="2"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_serving_worker_has_its_heap_frozen_and_reports_collections() -> None:
    assert gc.get_freeze_count() == 0, "a server of an earlier test left the heap frozen"
    with FakeTulip() as fake, gateway(fake, gc_freeze=True) as client:
        assert gc.get_freeze_count() > 0
        before = _full_collections(client)
        gc.collect()
        assert _full_collections(client) == before + 1
    assert gc.get_freeze_count() == 0


def test_gc_freeze_off() -> None:
    assert gc.get_freeze_count() == 0, "a server of an earlier test left the heap frozen"
    with FakeTulip() as fake, gateway(fake, gc_freeze=False) as client:
        assert client.get("/health").status_code == 200
        assert gc.get_freeze_count() == 0


def test_a_collection_inside_the_multiprocess_metrics_lock_does_not_hang_the_worker(tmp_path) -> None:
    """With several workers prometheus-client's values share one lock per process and allocate while holding
    it (a new labelled child); a collection started there must not observe a metric (it would wait on that
    lock forever): the worker's timer defers to a drain."""
    import subprocess
    import sys

    script = """
import gc
from ivy import app, metrics
app.GC_TIMER.install()
before = gc.get_threshold()
gc.set_threshold(1, 10**6, 10**6)  # a young collection at every allocation: many land inside the lock
for i in range(300):
    metrics.GRPC_SECONDS.labels(f"10.0.0.{i}:50051").observe(0.001)
gc.set_threshold(*before)
app.GC_TIMER.drain()
print("ok")
"""
    env = {**__import__("os").environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
