"""Tulip freezes its warmed heap out of the garbage collector when ready (gc_freeze), gives it back on stop,
and exports every collection's pause as tulip_gc_pause_seconds{generation}."""

from __future__ import annotations

import gc

from tulip_testkit import FakeEngine, ServerThread, make_config


def _pause_count(server, generation: str) -> float:
    return server.metrics.registry.get_sample_value("tulip_gc_pause_seconds_count", {"generation": generation}) or 0


def test_ready_freezes_the_heap_and_stop_unfreezes_it() -> None:
    assert gc.get_freeze_count() == 0, "a server of an earlier test left the heap frozen"
    t = ServerThread(make_config(gc_freeze=True), engine=FakeEngine())
    try:
        assert t.server.ready and gc.get_freeze_count() > 0
        before = _pause_count(t.server, "2")
        gc.collect()
        assert _pause_count(t.server, "2") == before + 1
    finally:
        t.close()
    assert gc.get_freeze_count() == 0


def test_gc_freeze_off_leaves_the_heap_to_the_collector() -> None:
    assert gc.get_freeze_count() == 0, "a server of an earlier test left the heap frozen"
    t = ServerThread(make_config(gc_freeze=False), engine=FakeEngine())
    try:
        assert t.server.ready and gc.get_freeze_count() == 0
    finally:
        t.close()
