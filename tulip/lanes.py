"""Priority lanes at admission: which lane a request is in, and whether its deadline can still be met.

A request names its lane in EmbedRequest.lane (protos: LANE_INTERACTIVE = 0, the default, or LANE_BULK);
the queue (tulip/scheduler.py) serves interactive first and guarantees bulk a share of every batch.

Deadline-aware admission: a request with a deadline is refused at once, RESOURCE_EXHAUSTED with reason
`deadline_unmeetable` (Ivy answers 429 with a Retry-After), when a lower bound on the device time of the tokens
queued ahead of it in its lane plus its own already exceeds the time it has left. The bound is
tulip.pacing.Pace.least_seconds (DeviceTimes.pace()), which says why it is one: a per-token rate
is extrapolated only to work no larger than the batches it was measured on (or to any work, when measured at
the batch budget, since no batch is larger); beyond that, work is bounded by the least number of batches it
can take times what the measured batches took, never by the per-token rate of small batches, which is mostly
their fixed cost. The work of the other lane and of the batches already in flight is left out, which only
lowers it. So what is refused could not have been served in time, and it is refused before it waited instead
of after. Without a measurement yet (a fresh replica) every request is admitted.

`retry_after_s` ("tulip-retry-after-s"): the least device time of the work queued ahead in the lane, i.e. not
before then is that work out of its way. When its own work alone exceeds the time it has left, no wait helps
with that deadline: no estimate is sent (rather than 0, which would read "retry now"), and the message asks for
a longer deadline.
"""

from __future__ import annotations

from tulip.errors import DeadlineUnmeetable, InvalidRequest
from tulip.pacing import Pace
from tulip.scheduler import BULK, INTERACTIVE, LANES


def lane_of(value: int) -> int:
    """The wire's lane value as the queue's; an unknown enum value is an InvalidRequest."""
    if value not in (INTERACTIVE, BULK):
        raise InvalidRequest(f"lane = {value} is not one of 0 (interactive) or 1 (bulk)")
    return int(value)


def least_seconds(ahead_tokens: int, tokens: int, pace: Pace | None) -> float | None:
    """A lower bound on the device time until a request of `tokens` queued behind `ahead_tokens` is done (None
    without a measurement: no bound)."""
    return None if pace is None else pace.least_seconds(ahead_tokens + tokens)


def check_deadline(lane: int, ahead_tokens: int, tokens: int, remaining: float | None,
                   pace: Pace | None) -> None:
    """Raise DeadlineUnmeetable when even the lower bound exceeds `remaining` seconds; its retry_after_s is the
    least time of the work ahead, or None when the request's own work alone exceeds `remaining`."""
    if remaining is None:
        return
    need = least_seconds(ahead_tokens, tokens, pace)
    if need is None or need <= remaining:
        return
    own = least_seconds(0, tokens, pace)
    if own > remaining:
        raise DeadlineUnmeetable(
            f"the deadline cannot be met: this request has {tokens} tokens, at least {own:.3f} s of device time on "
            f"its own, but only {remaining:.3f} s are left; retry with a longer deadline or on another replica")
    wait_ahead = least_seconds(ahead_tokens, 0, pace)
    raise DeadlineUnmeetable(
        f"the deadline cannot be met: {ahead_tokens} tokens are queued ahead in the {LANES[lane]} lane and "
        f"this request has {tokens}, at least {need:.3f} s of device time, but only {remaining:.3f} s are "
        "left; retry later, on another replica, or with a longer deadline", retry_after_s=wait_ahead)
