"""rose.gc_pauses: a frozen heap is out of every collection, later garbage is not, and each pause is reported."""

from __future__ import annotations

import gc
import weakref
from collections import deque

import pytest

from rose import gc_pauses


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def unfrozen():
    yield
    gc_pauses.unfreeze()


def test_objects_frozen_at_start_up_are_walked_by_no_collection_and_later_garbage_still_is(unfrozen) -> None:
    before = Node()
    frozen_ref = weakref.ref(before)
    del before  # garbage already, but frozen with the rest of the heap
    assert gc_pauses.freeze() > 0
    after = Node()
    later_ref = weakref.ref(after)
    del after
    gc.collect()
    assert later_ref() is None, "garbage made after the freeze was not collected"
    assert frozen_ref() is not None, "a frozen object was walked by a full collection"
    gc_pauses.unfreeze()
    gc.collect()
    assert frozen_ref() is None, "unfreeze did not give the frozen objects back to the collector"


def test_every_collection_reports_its_generation_and_pause() -> None:
    seen: list[tuple[int, float]] = []
    timer = gc_pauses.PauseTimer(lambda gen, s: seen.append((gen, s))).install()
    timer.install()  # idempotent: one callback
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        timer.remove()
    assert [gen for gen, _ in seen] == [2, 0]
    assert all(s >= 0 for _, s in seen)
    gc.collect()
    assert len(seen) == 2, "a removed timer still observed"


def test_after_the_freeze_full_collections_follow_the_requests_garbage_not_the_frozen_heap(unfrozen) -> None:
    heap = [{"i": i, "l": [i]} for i in range(150_000)]  # a served process's start-up heap: ~300 k objects
    gc.collect()  # all of it long-lived, as after start-up: the collector counts it
    gc_pauses.freeze()
    full: list[float] = []
    timer = gc_pauses.PauseTimer(lambda gen, s: gen == 2 and full.append(s)).install()
    try:
        in_flight: deque = deque()
        for _ in range(300 * gc.get_threshold()[0]):  # cyclic "requests", 64 in flight (3.13's young threshold
            # is 2000, 3.11's and 3.12's 700: the same number of young collections either way)
            a: dict = {}
            a["b"] = {"a": a}
            in_flight.append(a)
            if len(in_flight) > 64:
                in_flight.popleft()
    finally:
        timer.remove()
    # gc.freeze alone leaves the long-lived count at the frozen heap's size, and no full collection would
    # come before ~75 k survivors (none here): the garbage that reached the oldest generation would stay.
    assert full, "no full collection: the collector still waits on the frozen heap's size"
    assert len(heap) == 150_000


def test_a_deferred_timer_observes_only_when_drained_and_freezes_are_counted(unfrozen) -> None:
    seen: list[tuple[int, float]] = []
    timer = gc_pauses.PauseTimer(lambda gen, s: seen.append((gen, s)), deferred=True).install()
    try:
        gc.collect(1)
        assert seen == []  # nothing observed inside the collection
        timer.drain()
        assert [gen for gen, _ in seen] == [1]
        timer("stop", {"generation": 2})  # a stop whose start it never saw: ignored, not timed from 0
        timer.drain()
        assert len(seen) == 1
    finally:
        timer.remove()
    gc_pauses.freeze()
    gc_pauses.freeze()  # two servers of one process
    gc_pauses.unfreeze()  # the first to stop leaves the other's heap frozen
    assert gc.get_freeze_count() > 0
    gc_pauses.unfreeze()
    assert gc.get_freeze_count() == 0
