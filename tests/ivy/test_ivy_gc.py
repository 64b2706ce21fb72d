"""An Ivy worker freezes its started heap out of the garbage collector (gc_freeze), gives it back at
shutdown, and exports every collection's pause as ivy_gc_pause_seconds{generation}."""

from __future__ import annotations

import gc

from fake_tulip import FakeTulip
from ivy_testkit import gateway


def _full_collections(client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('ivy_gc_pause_seconds_count{generation="2"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_serving_worker_has_its_heap_frozen_and_reports_collections() -> None:
    gc.unfreeze()
    with FakeTulip() as fake, gateway(fake, gc_freeze=True) as client:
        assert gc.get_freeze_count() > 0
        before = _full_collections(client)
        gc.collect()
        assert _full_collections(client) == before + 1
    assert gc.get_freeze_count() == 0


def test_gc_freeze_off() -> None:
    gc.unfreeze()
    with FakeTulip() as fake, gateway(fake, gc_freeze=False) as client:
        assert client.get("/health").status_code == 200
        assert gc.get_freeze_count() == 0
