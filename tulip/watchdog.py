"""The replica's watchdog (RELIABILITY 28): a hung batch turns health NOT_SERVING until it completes.

Without it health was a flag set once at start-up: a replica whose device stopped answering (a stuck GPU,
a wedged driver) stayed SERVING, kept taking work, and every request on it waited its whole deadline.
The watchdog is a task on the server's event loop. Every min(1 s, floor / 4) it looks at the oldest batch
in flight: when that batch has been on the device longer than max(factor x its expected device time
(tulip.pacing: the median of recent batches of its size class), floor), or engine.step() itself has not
returned for the floor, the replica is stalled: health NOT_SERVING (Ivy's probes stop routing to it;
`tulip health`, the container's liveness check, fails) and admit() refuses new work with UNAVAILABLE
"stalled", which Ivy retries on another replica. When the batch completes the replica serves again. A batch
that never completes leaves it NOT_SERVING until the orchestrator restarts it (k8s: liveness).

Defaults (TulipConfig.watchdog_s 10 s, watchdog_factor 20): the longest batch expected on a GPU is tens
of milliseconds (8192 tokens of the 0.6B on an H200 ~20 ms; the 4B ~100 ms) and on a CPU about 1.5 s
(2048 tokens of MiniLM on 2 cores), so a batch still on the device after 10 s is not slow but stuck; a
size that once took t seconds gets 20 t (a large model on a CPU).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("tulip.watchdog")


def overdue(on_device: tuple[float, float] | None, stepping_since: float, now: float, factor: float,
            floor_s: float) -> tuple[float, float] | None:
    """(seconds, limit) of whatever is overdue, None when nothing is. `on_device` is the worker's
    (since when, expected seconds) of its oldest batch in flight; `stepping_since` when the launcher
    entered engine.step() (0 = not inside it)."""
    late = None
    if stepping_since and now - stepping_since > floor_s:
        late = (now - stepping_since, floor_s)
    if on_device is not None:
        since, expected = on_device
        elapsed, limit = now - since, max(factor * expected, floor_s)
        if elapsed > limit and (late is None or elapsed - limit > late[0] - late[1]):
            late = (elapsed, limit)
    return late


class Watchdog:
    def __init__(self, worker, *, floor_s: float, factor: float,
                 on_change: Callable[[bool], Awaitable[None]], others: tuple = ()) -> None:
        """worker: the main worker; others: more workers watched the same way (the express worker)."""
        self.workers = (worker, *others)
        self.floor_s = floor_s
        self.factor = factor
        self.on_change = on_change  # awaited with True when the replica stalls, False when it recovers
        self.stalled = False
        self.trips = 0

    def check(self, now: float | None = None) -> tuple[float, float] | None:
        """The most overdue of the workers' batches (seconds, limit), None when none is."""
        now = time.monotonic() if now is None else now
        late = [found for w in self.workers
                if (found := overdue(w.on_device(), w.stepping_since, now, self.factor, self.floor_s)) is not None]
        return max(late, key=lambda x: x[0] - x[1], default=None)

    async def run(self) -> None:
        interval = min(1.0, self.floor_s / 4)
        while True:
            await asyncio.sleep(interval)
            late = self.check()
            if late is not None and not self.stalled:
                self.stalled = True
                self.trips += 1
                log.error("watchdog: the oldest batch has been on the device %.1f s (limit %.1f s): health "
                          "NOT_SERVING, new work refused until it completes", *late)
                await self.on_change(True)
            elif late is None and self.stalled:
                self.stalled = False
                log.warning("watchdog: the overdue batch completed; serving again")
                await self.on_change(False)
