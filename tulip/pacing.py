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

`pace()` serves deadline-aware admission (tulip/lanes.py): a `Pace`, the fastest per-token rate recently seen
(the lowest per-class median, `seconds_per_token()`) and `Pace.least_seconds(tokens)`, a lower bound on the
device time of that many tokens. The fastest rate times the tokens is NOT one: a batch has a
fixed cost, so the per-token rate of small batches is mostly that cost (a 1-token batch of 20 ms reads 20 ms
a token) and says nothing of a larger batch's, which may hold all those tokens at about the same 20 ms.
Taken as a bound it refused a 2048-token request on an idle replica that had run only single queries ("at
least 42 s" for one batch of ~20 ms), and locked itself in: what is refused never runs, so no larger batch
is ever measured. `Pace` says why its bound holds.
"""

from __future__ import annotations

import bisect
import statistics
import threading
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Pace:
    """What admission knows of the device's speed: `fastest`, the fastest per-token rate recently seen
    (seconds_per_token(); not a bound by itself), and `least_seconds`, a lower bound on the device time of work
    of a given number of tokens.

    `classes`: per size class measured, (m, r): the smallest batch in its window (tokens) and the median of
    its batches' device seconds per token. `budget`: the most tokens a batch holds (tulip's
    max_batch_tokens), None where unknown. The bound rests on two properties of a batch's device time t(n):
    (A) more tokens never take less time (n <= n' gives t(n) <= t(n')), and (B) a smaller batch is not faster
    per token (n <= n' gives t(n)/n >= t(n')/n'): the batch's fixed cost is spread over fewer tokens. With a
    rate r measured on batches of at least m tokens, a batch of n tokens therefore takes at least r * min(n, m)
    ((B) below m, (A) above it), and so does one that carries w <= n of the work's tokens with w in place of n.
    Summing over the batches the work is split into:
    - work of W tokens with W <= m, or a budget <= m (no batch is larger than the one measured): at least
      r * W. Of all classes that qualify, the fastest rate is taken (the most optimistic sound bound);
    - otherwise (every measured size is below the work and the budget): the work needs at least q = W // budget
      full batches and one of W % budget tokens (none and one of W, budget unknown), each bounded as above:
      r * (q * m + min(W % budget, m)), the least of it over the classes. Small batches bound large work by
      their count times one small batch's time, never by their per-token rate: ten 1-token batches of 20 ms
      bound a 2048-token request by 20 ms, not 41 s.
    The medians drop a lazy graph capture's slow outlier (a slow outlier would inflate the bound). Where the
    measurements contradict (B) (a smaller class faster per token than a larger one: noise, padding to a
    bucket, attention over longer sequences), no batch is taken to be faster per token than the fastest seen:
    the bound is at most W times the fastest rate (the old estimate), so nothing the old check admitted is
    refused now. (A), (B) and the medians are the model; under it, what is refused could not be met. A
    sequence longer than the budget runs alone in a larger batch; its per-token time is not below a full batch's (the same tokens
    through the same layers, attention over a longer span), so the budget still bounds the rate it runs at.
    What is left out (the other lane's work, the batches already on the device) only adds time."""

    fastest: float
    classes: tuple[tuple[int, float], ...]
    budget: int | None

    def least_seconds(self, tokens: int) -> float:
        """A lower bound on the device seconds of `tokens` tokens of work, however they are batched."""
        if tokens <= 0 or not self.classes:
            return 0.0
        reach = tokens if self.budget is None else min(tokens, self.budget)  # the largest batch of this work
        covering = [r for m, r in self.classes if m >= reach]
        if covering:
            bound = tokens * min(covering)
        else:  # every m < reach <= budget
            full, rest = divmod(tokens, self.budget) if self.budget else (0, tokens)
            bound = min(r * (full * m + min(rest, m)) for m, r in self.classes)
        return min(bound, tokens * self.fastest)


class DeviceTimes:
    """Median of the last `window` device seconds per batch size class (tokens, power-of-two classes).
    `max_batch_tokens`: the most tokens a batch holds (the queue's budget), None where unknown; admission's
    bound (Pace) is weaker without it: work larger than every batch measured is then bounded by one batch."""

    def __init__(self, window: int = 8, max_batch_tokens: int | None = None) -> None:
        self.window = window
        self._seen: dict[int, deque[float]] = {}
        self._batches: dict[int, deque[tuple[int, float]]] = {}  # per class: (tokens, device seconds per token)
        self._classes: dict[int, tuple[int, float]] = {}  # per class: its (m, r) in Pace.classes
        self._budget = max_batch_tokens if max_batch_tokens and max_batch_tokens > 0 else None
        self._pace: Pace | None = None  # seconds_per_token(), rebuilt per batch: it is read per request

    @staticmethod
    def size_class(tokens: int) -> int:
        return max(int(tokens), 1).bit_length()

    def observe(self, tokens: int, seconds: float) -> None:
        if seconds >= 0:
            self._seen.setdefault(self.size_class(tokens), deque(maxlen=self.window)).append(seconds)
            if tokens > 0:
                size = self.size_class(tokens)
                batches = self._batches.setdefault(size, deque(maxlen=self.window))
                batches.append((int(tokens), seconds / tokens))
                self._classes[size] = (min(n for n, _ in batches), statistics.median(r for _, r in batches))
                classes = tuple(sorted(self._classes.values()))
                self._pace = Pace(min(r for _, r in classes), classes, self._budget)

    def estimate(self, tokens: int) -> float | None:
        seen = self._seen.get(self.size_class(tokens))
        return statistics.median(seen) if seen else None

    def seconds_per_token(self) -> float | None:
        """The fastest recent rate, device seconds per token (None before any measurement); not a bound on
        larger work (Pace)."""
        return None if self._pace is None else self._pace.fastest

    def pace(self) -> Pace | None:
        """What admission's lower bound is built on (None before any measurement): Pace.least_seconds."""
        return self._pace


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
