"""Which Tulip priority lane a request goes to (issue 17): interactive (latency) or bulk (indexing).

In order, the first that is given wins:
1. the body's `priority`: "interactive" | "bulk", or a number as vLLM's `priority` is (<= 0 interactive,
   > 0 bulk);
2. the header `X-Priority`, with the same values;
3. the lane of the API key the request authenticated with (`--api-key-lanes key1=bulk,key2=interactive`);
4. by size: bulk when the request holds more than `--bulk-above-tokens` tokens, else interactive.
Tulip serves interactive first and guarantees bulk a share of every batch (tulip/scheduler.py).
"""

from __future__ import annotations

from typing import Any

from ivy.errors import IvyError, Problem
from protos import embed_pb2

LANES = {"interactive": embed_pb2.LANE_INTERACTIVE, "bulk": embed_pb2.LANE_BULK}
PRIORITY_RULE = ('"interactive" or "bulk", or a number as vLLM\'s priority: <= 0 interactive, > 0 bulk; '
                 "omitted = the X-Priority header, else the API key's lane, else by size (bulk above "
                 "--bulk-above-tokens tokens)")


def lane_name(value: Any, param: str = "priority") -> str:
    """A priority value (body or header) as a lane name; anything else is a 422 naming `param`."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in LANES:
            return word
        try:
            value = float(word)
        except ValueError:
            value = None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:  # not nan
        return "interactive" if value <= 0 else "bulk"
    raise IvyError(Problem.INVALID_PARAMETER, f"{param} must be {PRIORITY_RULE}", param=param)


def parse_key_lanes(entries: tuple[str, ...]) -> dict[str, str]:
    """`key=lane` entries as {key: lane}; raises ValueError on a malformed entry (never echoing the key)."""
    lanes: dict[str, str] = {}
    for i, entry in enumerate(entries):
        key, sep, lane = entry.strip().rpartition("=")
        if not sep or not key or lane.strip().lower() not in LANES:
            raise ValueError(f"api_key_lanes entry {i + 1} must be KEY=interactive or KEY=bulk")
        lanes[key] = lane.strip().lower()
    return lanes


def resolve(body: str | None, header: str | None, key_lane: str | None) -> str | None:
    """The lane the request asked for, in precedence order; None = decide by size."""
    if body is not None:
        return body
    if header:
        return lane_name(header, "x-priority")
    return key_lane


def lane_value(lane: str | None, tokens: int, bulk_above_tokens: int) -> int:
    """The wire's Lane for a resolved lane name, or by size when none was asked for."""
    if lane is None:
        lane = "bulk" if tokens > bulk_above_tokens else "interactive"
    return LANES[lane]
