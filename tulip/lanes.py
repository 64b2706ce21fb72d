"""Priority lanes at admission: which lane a request is in, and whether its deadline can still be met.

A request names its lane in EmbedRequest.lane (protos: LANE_INTERACTIVE = 0, the default, or LANE_BULK);
the queue (tulip/scheduler.py) serves interactive first and guarantees bulk a share of every batch.

Deadline-aware admission: a request with a deadline is refused at once, RESOURCE_EXHAUSTED with reason
`deadline_unmeetable` (Ivy answers 429 with a Retry-After of the estimated wait ahead in the lane: the
tokens queued ahead at the same rate, carried as `retry_after_s`), when the tokens queued ahead of it in its lane
plus its own would take longer than the time it has left at the fastest device rate recently measured
(tulip.pacing.DeviceTimes.seconds_per_token). That rate is the optimistic one, and the work of the other
lane and of the batches already in flight is left out, so the estimate is a lower bound: what is refused
could not have been served in time, and it is refused before it waited instead of after. Without a
measurement yet (a fresh replica) every request is admitted.
"""

from __future__ import annotations

from tulip.errors import DeadlineUnmeetable, InvalidRequest
from tulip.scheduler import BULK, INTERACTIVE, LANES


def lane_of(value: int) -> int:
    """The wire's lane value as the queue's; an unknown enum value is an InvalidRequest."""
    if value not in (INTERACTIVE, BULK):
        raise InvalidRequest(f"lane = {value} is not one of 0 (interactive) or 1 (bulk)")
    return int(value)


def least_seconds(ahead_tokens: int, tokens: int, seconds_per_token: float | None) -> float | None:
    """A lower bound on the time until a request of `tokens` queued behind `ahead_tokens` is done."""
    if seconds_per_token is None:
        return None
    return (ahead_tokens + tokens) * seconds_per_token


def check_deadline(lane: int, ahead_tokens: int, tokens: int, remaining: float | None,
                   seconds_per_token: float | None) -> None:
    """Raise DeadlineUnmeetable when even the lower bound exceeds `remaining` seconds."""
    if remaining is None:
        return
    need = least_seconds(ahead_tokens, tokens, seconds_per_token)
    if need is not None and need > remaining:
        wait_ahead = least_seconds(ahead_tokens, 0, seconds_per_token)
        raise DeadlineUnmeetable(
            f"the deadline cannot be met: {ahead_tokens} tokens are queued ahead in the {LANES[lane]} lane and "
            f"this request has {tokens}, at least {need:.3f} s of device time, but only {remaining:.3f} s are "
            "left; retry later, on another replica, or with a longer deadline", retry_after_s=wait_ahead)
