"""When to pack the next batch while one runs: as late as the device allows, not as soon as a slot frees.

With two batches in flight the launcher used to pack batch n+1 the moment batch n-1 finished, i.e. just
as n started on the device; n+1 then waited a whole device period in the stream, and whatever arrived
during that period waited for n+2. Packing n+1 shortly before n is expected to finish gives the same
overlap (n+1 is on the stream before n ends) and takes in one more period of arrivals: a request that
lands in the queue while the device is busy waits ~1.5 periods on average instead of ~2.5.

The expected finish comes from `DeviceTimes`: the median of the last few device times of batches of the
same size class (the median, so a lazy graph capture's 20-40 ms does not inflate it). Unknown sizes give
no estimate and the launcher packs at once, as before. If the estimate is long the launcher still packs
as soon as the running batch is delivered, so a wrong estimate costs at most the host time of one launch.

`seconds_per_token()` serves deadline-aware admission (tulip/lanes.py): the lowest per-class median of
device seconds per token, i.e. the fastest rate recently seen (large batches), so an admission check
built on it refuses only what could not be met even at that rate.
"""

from __future__ import annotations

import statistics
from collections import deque


class DeviceTimes:
    """Median of the last `window` device seconds per batch size class (tokens, power-of-two classes)."""

    def __init__(self, window: int = 8) -> None:
        self.window = window
        self._seen: dict[int, deque[float]] = {}
        self._per_token: dict[int, deque[float]] = {}
        self._fastest: float | None = None  # seconds_per_token(), kept per batch: it is read per request

    @staticmethod
    def size_class(tokens: int) -> int:
        return max(int(tokens), 1).bit_length()

    def observe(self, tokens: int, seconds: float) -> None:
        if seconds >= 0:
            self._seen.setdefault(self.size_class(tokens), deque(maxlen=self.window)).append(seconds)
            if tokens > 0:
                size = self.size_class(tokens)
                self._per_token.setdefault(size, deque(maxlen=self.window)).append(seconds / tokens)
                self._fastest = min(statistics.median(d) for d in self._per_token.values() if d)

    def estimate(self, tokens: int) -> float | None:
        seen = self._seen.get(self.size_class(tokens))
        return statistics.median(seen) if seen else None

    def seconds_per_token(self) -> float | None:
        """The fastest recent rate, device seconds per token (None before any measurement)."""
        return self._fastest


class DeviceClock:
    """The batches on the device, oldest first, and what they imply: when the last is expected to leave it
    (`tail_end`, what the launcher paces by), since when the oldest is on it (the watchdog's), and how long the
    device has been busy. A batch is on the device from its launch or the delivery of the one before it,
    whichever is later. Not thread-safe: the worker calls it under its own lock."""

    def __init__(self) -> None:
        self._batches: deque[tuple[float, float, float]] = deque()  # (launched, expected s, expected s left)
        self.tail_end = 0.0  # when the last launched batch is expected to leave the device (monotonic)
        self.last_done = 0.0  # when the last delivered batch's rows reached the host (monotonic)
        self.busy_s = 0.0  # seconds with a batch on the device (tulip_device_busy_seconds_total)

    def launched(self, now: float, estimate: float, began: float | None = None, left: float | None = None) -> None:
        """A batch enqueued whole at `now`, expected to take `estimate` s on the device; or one stepped by layers
        since `began`, of which only `left` s were still to run when its stepping returned at `now`."""
        if began is None:
            self._batches.append((now, estimate, estimate))
            self.tail_end = max(now, self.tail_end) + estimate
        else:
            self._batches.append((began, estimate, left))
            self.tail_end = now + left

    def delivered(self, now: float, launched: float) -> float:
        """The oldest batch (launched at `launched`) has its rows on the host at `now`: its device seconds."""
        if self._batches:
            self._batches.popleft()
        on_device_from = max(launched, self.last_done)  # it queued behind the previous one
        self.last_done = now
        self.busy_s += max(0.0, now - on_device_from)
        self.tail_end = now + sum(left for _, _, left in self._batches)
        return now - on_device_from

    def oldest(self) -> tuple[float, float] | None:
        """(since when, expected device seconds) of the oldest batch in flight, None when there is none."""
        if not self._batches:
            return None
        launched, estimate, _ = self._batches[0]
        return max(launched, self.last_done), estimate
