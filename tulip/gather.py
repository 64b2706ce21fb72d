"""Gathering: a batch waits a moment for requests about to arrive (`TULIP_GATHER_MS`; 0 = off).

A small batch's device time is mostly fixed (the Qwen3-0.6B on the H200: ~1.2 ms for one lognormal document,
~2.0 for four), so closed-loop clients are served fastest when their requests share batches. In-process they
come back together; through a harness with ~1 ms of latency they come back spread over it, and a launcher that
takes whatever is queued runs one small batch per arrival (4 clients through Ivy: 1.3-1.4 requests a batch,
the device 94 % busy, 57 % of the in-process rate).

The rule: every answered request is expected back for `return_s` (a client's next request); each arrival
meets the oldest expectation. While some are unmet, the launcher with work queued waits for them, but no
longer than `window_s` past the oldest waiting request's arrival. So
- a lone client never waits (its next request meets its own expectation), nor do clients that think between
  requests for longer than `return_s`;
- no request waits more than `window_s` longer than it would have, whatever the estimate;
- a full batch (the token or sequence budget) or a closing queue leaves at once (the queue checks those).
"Requests" are the queue's flows: a request's chunks in one batch count once. The queue calls all of this
under its lock (tulip.scheduler: push, delivered, next_batch).
"""

from __future__ import annotations

from collections import deque

_MAX_EXPECTED = 4096  # expectations kept (a burst of answers larger than this waits for fewer)


class Gather:
    def __init__(self, window_s: float, return_s: float | None = None) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self.return_s = 2 * window_s if return_s is None else return_s
        self._expected: deque[float] = deque(maxlen=_MAX_EXPECTED)  # when each unmet expectation began
        self.waits = 0  # takes that waited (tulip_gather_waits_total)

    def delivered(self, requests: int, now: float) -> None:
        """`requests` were answered at `now`: each client is expected back."""
        self._expected.extend([now] * requests)

    def arrived(self) -> None:
        """A request arrived: it meets the oldest expectation."""
        if self._expected:
            self._expected.popleft()

    def expected(self, now: float) -> int:
        """Requests expected back within return_s of their answer and not yet met."""
        expected = self._expected
        while expected and expected[0] < now - self.return_s:
            expected.popleft()
        return len(expected)

    def wait_s(self, oldest_arrival: float, now: float) -> float:
        """Seconds to wait before taking (0 = take now), the oldest waiting request queued at `oldest_arrival`."""
        if not self.expected(now):
            return 0.0
        return max(0.0, oldest_arrival + self.window_s - now)
