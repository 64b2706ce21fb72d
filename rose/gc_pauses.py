"""The cyclic garbage collector in a serving process: its pauses timed, and the start-up heap kept out of them.

A full (generation 2) collection walks every object the collector tracks, with the GIL held: every request
of the process waits meanwhile. After start-up a Tulip replica tracks ~300 k objects (torch and the sympy it
imports, the model's modules) and an Ivy worker ~75 k (FastAPI, pydantic, the tokenizer); one full
collection then takes ~170 ms and ~50 ms on this project's 2-core CPU VM, and Python starts one whenever the
objects that survived into generation 2 since the last one reach a quarter of those it holds, so requests
meet them as rare, long stalls (benchmarks/NOTES.md, "Garbage collector pauses").

`freeze()` moves everything alive once the service is ready into the collector's permanent generation
(gc.freeze), which no collection walks: full collections then cost in proportion to what requests made,
which they still find and free, and run as often as those survivors call for. `unfreeze()` undoes it when the service stops (an in-process server in a
test leaves a collectable heap behind). `PauseTimer` reports every collection's pause and generation to
a callback (the services' `*_gc_pause_seconds` histograms). Torch-free.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


def freeze() -> int:
    """Freeze every object the collector tracks now, then run one full collection; the count frozen.

    The freeze moves lists, nothing is walked; what start-up left unreachable is frozen with it, once (a
    collection first would cost the walk this avoids, and an in-process server in a test pays at each
    start). The collection after it walks only what is not frozen, i.e. next to nothing, and resets the
    collector's count of long-lived objects, which gc.freeze leaves at the whole heap: without it the next
    full collection would wait, as before, for a quarter of the frozen heap's size to survive into the
    oldest generation, while the garbage that did (cycles of requests in flight at a young collection)
    held memory (the soak's RSS climbing ~10 MiB a minute between collections). After it, full collections
    run every few thousand survivors and cost what those are."""
    gc.freeze()
    gc.collect()
    return gc.get_freeze_count()


def unfreeze() -> None:
    gc.unfreeze()


class PauseTimer:
    """gc.callbacks hook: observe(generation, seconds) after each collection. install() / remove()."""

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self.observe = observe
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":  # collections do not nest: one start time is enough
            self._started = time.perf_counter()
        else:
            self.observe(int(info["generation"]), time.perf_counter() - self._started)

    def install(self) -> PauseTimer:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
