"""rose.gc_pauses: a frozen heap is out of every collection, later garbage is not, and each pause is reported."""

from __future__ import annotations

import gc
import weakref

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
