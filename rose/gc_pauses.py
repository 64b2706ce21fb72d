"""The cyclic garbage collector in a serving process: its pauses timed, and the start-up heap kept out of them.

A full (generation 2) collection walks every object the collector tracks, with the GIL held: every request
of the process waits meanwhile. After start-up a Tulip replica tracks ~300 k objects (torch and the sympy it
imports, the model's modules) and an Ivy worker ~75 k (FastAPI, pydantic, the tokenizer); one full
collection then takes ~170 ms and ~50 ms on this project's 2-core CPU VM, and Python starts one whenever the
objects that survived into generation 2 since the last one reach a quarter of those it holds, so requests
meet them as rare, long stalls (benchmarks/NOTES.md, "Garbage collector pauses").

`freeze()` moves everything alive once the service is ready into the collector's permanent generation
(gc.freeze), which no collection walks: full collections then cost in proportion to what requests made,
which they still find and free, and run as often as those survivors call for. `unfreeze()` undoes it when
the last service of the process that froze stops (an in-process server in a test leaves a collectable heap
behind; freezes are counted, so one server stopping does not unfreeze another's). `PauseTimer` reports every
collection's pause and generation (the services' `*_gc_pause_seconds` histograms): at once, or, deferred,
when its owner drains it from ordinary code, for metrics that take a lock a collection may interrupt
(prometheus-client's multiprocess values share one lock per process, taken while it allocates). Torch-free.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable


_frozen = 0  # freeze() calls not yet undone by unfreeze()


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
    global _frozen
    _frozen += 1
    gc.freeze()
    gc.collect()
    return gc.get_freeze_count()


def unfreeze() -> None:
    """Undo one freeze(); the heap goes back to the collector when none is left."""
    global _frozen
    _frozen = max(0, _frozen - 1)
    if _frozen == 0:
        gc.unfreeze()


class PauseTimer:
    """gc.callbacks hook: observe(generation, seconds) for each collection, at once or, when `deferred`, at
    the next drain(). install() / remove(). Collections never nest or overlap (CPython runs one at a time)."""

    def __init__(self, observe: Callable[[int, float], None], deferred: bool = False) -> None:
        self.observe = observe
        self.deferred = deferred
        self._started: float | None = None
        self._pending: deque[tuple[int, float]] = deque()  # deferred observations (append/popleft: thread-safe)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:  # installed during a collection: its start was not seen
            return
        seconds, self._started = time.perf_counter() - self._started, None
        if self.deferred:
            self._pending.append((int(info["generation"]), seconds))
        else:
            self.observe(int(info["generation"]), seconds)

    def drain(self) -> None:
        """Observe the deferred pauses (call from ordinary code, never from a collection)."""
        while self._pending:
            self.observe(*self._pending.popleft())

    def install(self) -> PauseTimer:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
        self.drain()
