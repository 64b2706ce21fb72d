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

import bisect
import statistics
import threading
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


class BusySpans:
    """Seconds with at least one batch on the device, over every worker's batches: the union of their spans on
    it, so a query stepped between two of bulk's layers (inside the bulk batch's span) or beside it on the
    express lane is not counted twice (tulip_device_busy_seconds_total). Spans arrive as batches are delivered,
    not in order of their starts; those ending more than `horizon_s` before the latest end are settled into a
    sum (a span starting before the settled time counts only from it). Thread-safe."""

    def __init__(self, horizon_s: float = 10.0) -> None:
        self.horizon_s = horizon_s
        self._starts: list[float] = []  # disjoint spans, sorted: starts and ends side by side
        self._ends: list[float] = []
        self._settled_s = 0.0  # the length of the spans settled
        self._settled_to = float("-inf")  # nothing before this is counted again
        self._lock = threading.Lock()

    def add(self, start: float, end: float) -> None:
        with self._lock:
            start = max(start, self._settled_to)
            if end <= start:
                return
            i = bisect.bisect_left(self._ends, start)  # the first span that ends at or after the new start
            j = bisect.bisect_right(self._starts, end)  # past the last span that starts at or before its end
            if i < j:  # overlapping spans merge into the new one
                start, end = min(start, self._starts[i]), max(end, self._ends[j - 1])
            self._starts[i:j], self._ends[i:j] = [start], [end]
            limit = self._ends[-1] - self.horizon_s
            k = bisect.bisect_left(self._ends, limit)
            if k:
                self._settled_s += sum(e - s for s, e in zip(self._starts[:k], self._ends[:k]))
                self._settled_to = self._ends[k - 1]
                del self._starts[:k], self._ends[:k]

    def total(self) -> float:
        with self._lock:
            return self._settled_s + sum(e - s for s, e in zip(self._starts, self._ends))


class DeviceClock:
    """The batches on the device, oldest first, and what they imply: when the last is expected to leave it
    (`tail_end`, what the launcher paces by), since when the oldest is on it (the watchdog's), and how long the
    device has been busy. A batch is on the device from its launch or the delivery of the one before it,
    whichever is later; its span goes to `spans` as well, where the workers share one (BusySpans). Not
    thread-safe: the worker calls it under its own lock."""

    def __init__(self, spans: BusySpans | None = None) -> None:
        self.spans = spans
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
        if self.spans is not None:
            self.spans.add(on_device_from, now)
        self.tail_end = now + sum(left for _, _, left in self._batches)
        return now - on_device_from

    def oldest(self) -> tuple[float, float] | None:
        """(since when, expected device seconds) of the oldest batch in flight, None when there is none."""
        if not self._batches:
            return None
        launched, estimate, _ = self._batches[0]
        return max(launched, self.last_done), estimate
